-- The writer's batch claims its launches once, set-based, and its rows skip 0014's row trigger
-- (issue 44, the writer's cost).
--
-- Why: 0014's launch guard is a PL/pgSQL BEFORE INSERT trigger, one index probe per shard row
-- the writer proposes; a batch of 100 paid it 100 times in one statement, and with 0015's owner
-- read in its own statement the batch-100 writer lost 22 % of its rows/s (BENCHMARKS.md,
-- "The launch guard and job ownership"). The writer's new procedure checks the same rule once per
-- batch: one read over the batch's distinct (job, step, run_attempt, launch) and its (job,
-- owner) pairs together, and claims only when that read finds something new or foreign. It then
-- marks its transaction (set_config('ckpt.launch_checked', 'on', true): transaction-local, gone
-- at the count's COMMIT) and the trigger's WHEN skips rows while the mark is on. Every other
-- INSERT path (the previous release's writer calling ckpt_write_batch_counted or
-- ckpt_write_batch_owned, ckpt_write_batch_owned_json inside a caller's transaction, an
-- operator's psql) never sets it and is guarded per row as before.
--
-- The same rule, the same refusals:
--   * a (job, run_attempt) is claimed by the first launch proposing a row of it (ON CONFLICT DO
--     NOTHING; two writers at once: the second waits for the first one's commit, then its next
--     statement, a new snapshot, reads the winner), and a row of another launch raises SQLSTATE
--     23C01 with 0014's message and hint, naming the first such row in key order (the row 0014's
--     trigger raised for);
--   * a row a prune's tombstone fences (0009: run_attempt below the step's min_run_attempt) is
--     never proposed by ckpt_count_batch, so 0014's trigger never saw it: it claims nothing and
--     is checked against nothing here either;
--   * two launches of one attempt in one batch never reach this: the writer writes such a batch
--     one record per transaction (lambda_writer/writer/planning.py, launch_conflict);
--   * the owner claim runs first, as in 0015: a foreign sender's report is refused as
--     "foreign sender" (23K01) whatever its launch.
-- The mark is transaction-local: it ends with the count's COMMIT (or its rollback), so it leaves
-- no session state behind (RDS Proxy sees one CALL and nothing to pin the connection for).
-- The mark is not a security boundary: a session of a role that may INSERT shard rows may write
-- any row anyway; it keeps the guard on every path that does not check launches itself.

DROP TRIGGER training_checkpoint_shards_launch ON training_checkpoint_shards;
CREATE TRIGGER training_checkpoint_shards_launch
    BEFORE INSERT ON training_checkpoint_shards
    FOR EACH ROW WHEN (NEW.extra ? 'launch_id'
                       AND current_setting('ckpt.launch_checked', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION ckpt_claim_launch();

-- Claim the batch's launches and refuse the batch if one of its attempts belongs to another
-- launch. launches: [{"job_id", "step", "rank", "run_attempt", "launch_id"}], one per (job, step,
-- run_attempt, launch) with its first rank, in the shard rows' key order (lambda_writer/writer/
-- sql.py).
CREATE FUNCTION ckpt_claim_launches(launches json) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
DECLARE
    refused record;
BEGIN
    INSERT INTO training_job_launches (job_id, run_attempt, launch_id)
    SELECT DISTINCT ON (l.job_id, l.run_attempt) l.job_id, l.run_attempt, l.launch_id
    FROM ROWS FROM (json_to_recordset(launches) AS (job_id text, step bigint,
             run_attempt integer, launch_id text))
         WITH ORDINALITY AS l(job_id, step, run_attempt, launch_id, n)
    WHERE NOT EXISTS (
        SELECT FROM training_checkpoint_tombstones f
        WHERE f.job_id = l.job_id AND f.step = l.step AND l.run_attempt < f.min_run_attempt)
    ORDER BY l.job_id, l.run_attempt, l.n
    ON CONFLICT DO NOTHING;
    SELECT l.job_id, l.step, l.rank, l.run_attempt, l.launch_id, c.launch_id AS claimed
    INTO refused
    FROM ROWS FROM (json_to_recordset(launches) AS (job_id text, step bigint, rank integer,
             run_attempt integer, launch_id text))
         WITH ORDINALITY AS l(job_id, step, rank, run_attempt, launch_id, n)
    JOIN training_job_launches c ON c.job_id = l.job_id AND c.run_attempt = l.run_attempt
    WHERE c.launch_id <> l.launch_id
      AND NOT EXISTS (
        SELECT FROM training_checkpoint_tombstones f
        WHERE f.job_id = l.job_id AND f.step = l.step AND l.run_attempt < f.min_run_attempt)
    ORDER BY l.n
    LIMIT 1;
    IF FOUND THEN
        -- 0014's message and hint, word for word: the DLQ envelope and the logs read the same.
        RAISE EXCEPTION 'launch conflict: job % run_attempt % belongs to launch %, this report '
                        '(step %, rank %) is of launch %', refused.job_id, refused.run_attempt,
                        refused.claimed, refused.step, refused.rank, refused.launch_id
            USING ERRCODE = '23C01',
                  HINT = 'two launches reported one run_attempt: a relaunch numbers its attempt '
                         'in the restart call (resume(reporter)); replaying this report cannot '
                         'make it applicable';
    END IF;
END
$fn$;

-- The writer's statement from this release on: 0015's ckpt_write_batch_owned with the launch
-- claim of the whole batch before the count. The common case (every job already its sender's,
-- every attempt already its launch's) is one read and nothing written; then 0007's
-- ckpt_write_batch_counted statement for statement, as 0015 repeats it (checked by
-- tests/lambda_writer/test_ownership.py).
CREATE PROCEDURE ckpt_write_batch_claimed(
    owners json, launches json, checkpoints json, shards json,
    OUT shard_rows_changed integer, OUT checkpoints_recounted integer)
LANGUAGE plpgsql SECURITY INVOKER
AS $fn$
BEGIN
    LOCK TABLE ckpt_job_owners IN ROW EXCLUSIVE MODE;
    IF EXISTS (
        SELECT FROM json_to_recordset(owners) AS o(job_id text, owner text)
        LEFT JOIN ckpt_job_owners j ON j.job_id = o.job_id
        WHERE j.owner IS DISTINCT FROM o.owner
    ) OR EXISTS (
        SELECT FROM json_to_recordset(launches) AS l(job_id text, run_attempt integer,
                                                      launch_id text)
        LEFT JOIN training_job_launches c
               ON c.job_id = l.job_id AND c.run_attempt = l.run_attempt
        WHERE c.launch_id IS DISTINCT FROM l.launch_id
    ) THEN
        -- Owners first: a foreign sender is refused as one, whatever its launch.
        PERFORM ckpt_claim_jobs(owners);
        PERFORM ckpt_claim_launches(launches);
    END IF;
    -- This transaction's rows are checked: 0014's row trigger skips them until the count commits.
    PERFORM set_config('ckpt.launch_checked', 'on', true);
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

REVOKE ALL ON FUNCTION ckpt_claim_launches(json) FROM PUBLIC;
REVOKE ALL ON PROCEDURE ckpt_write_batch_claimed(json, json, json, json) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ckpt_claim_launches(json) TO ckpt_writer;
GRANT EXECUTE ON PROCEDURE ckpt_write_batch_claimed(json, json, json, json) TO ckpt_writer;
