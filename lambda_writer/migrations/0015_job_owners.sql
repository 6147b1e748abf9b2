-- A job's records belong to the principal that sent its first report (issue 44; docs/DESIGN.md,
-- "Who may write a job"). The writer's batch claims every job it writes for its sender and is
-- refused, in the same transaction as its count, when a job already belongs to someone else.
--
-- The owner is the principal of SQS's SenderId (which no sender can set): an IAM user's id, or
-- an assumed role's id without its session (every node of a job has the same role id and a
-- different session). Jobs written before this migration have no owner: the first report after
-- it claims them.

CREATE TABLE ckpt_job_owners (
    job_id       text        PRIMARY KEY,
    owner        text        NOT NULL CHECK (owner <> ''),
    -- The whole SenderId of the report that claimed the job (role id and session: which node).
    first_sender text        NOT NULL,
    claimed_at   timestamptz NOT NULL DEFAULT now()
);

-- Every transfer and release an operator made (ckpt-pipeline jobs transfer|release): who, when,
-- from which owner to which, and why. Written in the same transaction as the change.
CREATE TABLE ckpt_job_owner_changes (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     text        NOT NULL,
    action     text        NOT NULL CHECK (action IN ('transfer', 'release')),
    old_owner  text,
    new_owner  text,
    reason     text        NOT NULL CHECK (btrim(reason) <> ''),
    changed_by text        NOT NULL DEFAULT current_user,
    changed_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((action = 'release') = (new_owner IS NULL))
);
CREATE INDEX ckpt_job_owner_changes_job ON ckpt_job_owner_changes (job_id, changed_at);

-- DLQ messages an operator discarded (ckpt-pipeline replay-dlq --discard REASON): the message as
-- it was, and why. The row commits before the message is deleted from the DLQ; keyed by the
-- message's first DLQ deduplication id, so a discard re-run after a crash between the two records
-- it once.
CREATE TABLE ckpt_dlq_discards (
    dlq_id              text        PRIMARY KEY,
    dlq_message_id      text        NOT NULL,
    original_message_id text,
    group_id            text,
    job_id              text,
    sender_id           text,
    error_class         text,
    error_message       text,
    body                text        NOT NULL,
    reason              text        NOT NULL CHECK (btrim(reason) <> ''),
    discarded_by        text        NOT NULL DEFAULT current_user,
    discarded_at        timestamptz NOT NULL DEFAULT now()
);

-- Claim the batch's jobs for their senders and refuse the batch if one belongs to another
-- principal. owners: [{"job_id", "owner", "sender"}] in delivery order (lambda_writer/writer/
-- sql.py). Called first in the batch's count transaction, so a report is applied only where its
-- sender owned the job when that transaction committed:
--   * two first reports of a new job from two principals: the second INSERT waits for the first
--     one's row (the unique index) and then inserts nothing, and its second read (a new
--     statement: a new snapshot) sees the first owner; in one batch, the first in delivery order
--     claims it (WITH ORDINALITY);
--   * a transfer or release (ckpt-pipeline jobs) locks the table in SHARE ROW EXCLUSIVE mode,
--     which conflicts with the ROW EXCLUSIVE lock every batch takes here first: it waits for the
--     batches in flight and the next batches wait for it, so no batch is judged by an owner that
--     is being changed.
-- The refusal is SQLSTATE 23K01 (class 23, integrity constraint violation: a permanent refusal of
-- the data to any client) with the message the DLQ envelope carries: "foreign sender: …".
CREATE FUNCTION ckpt_claim_jobs(owners json) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
DECLARE
    refused record;
BEGIN
    -- Taken by every batch, also one that claims nothing (a fast-path table lock): an owner
    -- change's SHARE ROW EXCLUSIVE lock waits for this transaction, and it for the change.
    LOCK TABLE ckpt_job_owners IN ROW EXCLUSIVE MODE;
    -- The common case, every job already its sender's: one read, nothing written. A mismatch
    -- with an owner sorts before a job with none.
    SELECT o.job_id, j.owner, o.sender INTO refused
    FROM json_to_recordset(owners) AS o(job_id text, owner text, sender text)
    LEFT JOIN ckpt_job_owners j ON j.job_id = o.job_id
    WHERE j.owner IS DISTINCT FROM o.owner
    ORDER BY j.owner IS NULL
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF refused.owner IS NULL THEN
        -- A job without an owner: the first sender in delivery order claims it.
        INSERT INTO ckpt_job_owners (job_id, owner, first_sender)
        SELECT o.job_id, o.owner, o.sender
        FROM ROWS FROM (json_to_recordset(owners) AS (job_id text, owner text, sender text))
             WITH ORDINALITY AS o(job_id, owner, sender, n)
        ORDER BY o.n
        ON CONFLICT (job_id) DO NOTHING;
        SELECT o.job_id, j.owner, o.sender INTO refused
        FROM json_to_recordset(owners) AS o(job_id text, owner text, sender text)
        JOIN ckpt_job_owners j ON j.job_id = o.job_id
        WHERE j.owner <> o.owner
        LIMIT 1;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = '23K01',
        MESSAGE = format('foreign sender: job %s is owned by %s; this report was sent by %s',
                         quote_literal(refused.job_id), refused.owner, refused.sender);
END
$fn$;

-- The writer's statement from this release on: the claim's fast path (every job already its
-- sender's: one read, nothing written), ckpt_claim_jobs otherwise, then 0007's
-- ckpt_write_batch_counted statement for statement, so the claim commits with the count. 0007's
-- body is repeated rather than CALLed: a nested CALL and a function call cost the batch more
-- backend CPU than the claim itself (docs/DESIGN.md, "Who may write a job");
-- tests/lambda_writer/test_ownership.py checks that the repeated part is 0007's body verbatim.
CREATE PROCEDURE ckpt_write_batch_owned(
    owners json, checkpoints json, shards json,
    OUT shard_rows_changed integer, OUT checkpoints_recounted integer)
LANGUAGE plpgsql SECURITY INVOKER
AS $fn$
BEGIN
    LOCK TABLE ckpt_job_owners IN ROW EXCLUSIVE MODE;
    IF EXISTS (
        SELECT FROM json_to_recordset(owners) AS o(job_id text, owner text)
        LEFT JOIN ckpt_job_owners j ON j.job_id = o.job_id
        WHERE j.owner IS DISTINCT FROM o.owner
    ) THEN
        PERFORM ckpt_claim_jobs(owners);
    END IF;
    -- 0007's ckpt_write_batch_counted from here.
    -- 1668051043 = 'ckpc', the key space of 0006's checkpoint locks; in hash order as there.
    PERFORM pg_advisory_xact_lock_shared(1668051043, hashtext(t.job_id || '/' || t.step))
    FROM json_to_recordset(checkpoints) AS t(job_id text, step bigint)
    ORDER BY hashtext(t.job_id || '/' || t.step);
    SELECT b.shard_rows_changed, b.checkpoints_recounted
    INTO shard_rows_changed, checkpoints_recounted
    FROM ckpt_count_batch(checkpoints, shards) b;
    COMMIT;
    -- A new transaction, so a snapshot after this batch's commit: it sees every batch that
    -- committed before. Nothing to settle is the common case (every batch of an attempt but
    -- its last): one indexed read per checkpoint, no lock, no transaction id.
    IF EXISTS (
        SELECT FROM json_to_recordset(checkpoints) AS t(job_id text, step bigint)
        JOIN training_checkpoints c ON c.job_id = t.job_id AND c.step = t.step
        WHERE NOT c.is_complete
          AND c.shards_present + coalesce((
                SELECT sum(n.shards) FROM training_checkpoint_counts n
                WHERE n.job_id = c.job_id AND n.step = c.step
                  AND n.run_attempt = c.run_attempt), 0) >= c.world_size
    ) THEN
        checkpoints_recounted := checkpoints_recounted + ckpt_settle_checkpoints(checkpoints);
    END IF;
END
$fn$;

-- Inside a caller's transaction (where a procedure cannot commit): the claim, then 0006's
-- function, in that transaction.
CREATE FUNCTION ckpt_write_batch_owned_json(owners json, checkpoints json, shards json)
RETURNS TABLE (shard_rows_changed integer, checkpoints_recounted integer)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
BEGIN
    PERFORM ckpt_claim_jobs(owners);
    RETURN QUERY SELECT b.shard_rows_changed, b.checkpoints_recounted
                 FROM ckpt_write_batch_json(checkpoints, shards) b;
END
$fn$;

REVOKE ALL ON FUNCTION ckpt_claim_jobs(json) FROM PUBLIC;
REVOKE ALL ON PROCEDURE ckpt_write_batch_owned(json, json, json) FROM PUBLIC;
REVOKE ALL ON FUNCTION ckpt_write_batch_owned_json(json, json, json) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ckpt_claim_jobs(json) TO ckpt_writer;
GRANT EXECUTE ON PROCEDURE ckpt_write_batch_owned(json, json, json) TO ckpt_writer;
GRANT EXECUTE ON FUNCTION ckpt_write_batch_owned_json(json, json, json) TO ckpt_writer;
-- The writer claims and reads owners; it never changes or removes one (the operator does, as the
-- tables' owner, with its audit row). The audit tables are the operator's alone.
GRANT SELECT, INSERT ON ckpt_job_owners TO ckpt_writer;

-- Whoever may read the checkpoint table may read who owns each job (the status and restart
-- readers; as 0010 does for its view).
SELECT ckpt_grant_select_like('training_checkpoints', 'ckpt_job_owners');
