-- The writer's batch, version 4: no per-batch write of the checkpoint row. A batch's delta goes to
-- a count row of its own backend ("slot"), and the checkpoint row is written only when the batch
-- raises it (a new checkpoint, a newer attempt, a larger world_size/epoch, an earlier
-- first_reported_at) or when the attempt becomes complete ("settle", after the batch committed).
--
-- Why (BENCHMARKS.md section 6, python -m bench.capacity): with 0004/0005 both writers of one
-- checkpoint updated its one row in every batch and held that row lock through the commit's WAL
-- flush, so their commits ran one after the other: a second writer gave 1.18x-2.12x, 1.81x-2.41x
-- only with synchronous_commit off. Two writers now share no row that either locks per batch.
--
-- The shard count of attempt A of a checkpoint is
--     total(A) = training_checkpoints.shards_present + sum(training_checkpoint_counts.shards
--                                                        of that (job_id, step) and attempt A)
-- where A is the row's run_attempt. training_checkpoint_progress reads it, exact at every
-- snapshot. The row's is_complete (what resume, status and latest_complete_checkpoints read) is
-- set by the settle that follows every batch's commit, so it is exact once the batches that
-- wrote the checkpoint have returned. The argument, and what it needs of retries, is in
-- docs/DESIGN.md, "The writer: counting shards in slot rows"; tests/lambda_writer/
-- test_interleavings.py forces the interleavings.
--
-- Additive, so no backfill: up to 0005 shards_present held the whole count (exact), and a writer
-- of the previous release still running 0005's statement when this migration commits adds its
-- delta to shards_present, which is part of total(A).

CREATE TABLE training_checkpoint_counts (
    job_id      text    NOT NULL,
    step        bigint  NOT NULL,
    run_attempt integer NOT NULL,
    -- The backend (pg_backend_pid()) that wrote these shards: one backend runs one transaction at
    -- a time, so two concurrent batches never update one count row. A pid reused later only adds
    -- to the same row. Rows per checkpoint attempt = the backends that wrote it (the writers'
    -- connections, through RDS Proxy a handful).
    slot        integer NOT NULL,
    shards      integer NOT NULL CHECK (shards >= 0),
    PRIMARY KEY (job_id, step, run_attempt, slot),
    -- Deleting a checkpoint deletes its counts (TRUNCATE of training_checkpoints needs CASCADE).
    FOREIGN KEY (job_id, step) REFERENCES training_checkpoints (job_id, step) ON DELETE CASCADE
);

-- Live progress: training_checkpoints with shards_present = total(row's attempt). The row and
-- its counts are read from one snapshot, so the count is exact for the batches that snapshot
-- sees (a settle moves counts into the row in one transaction).
CREATE VIEW training_checkpoint_progress AS
SELECT c.job_id, c.step, c.epoch, c.run_attempt, c.world_size,
       c.shards_present + coalesce(n.shards, 0) AS shards_present,
       c.is_complete, c.first_reported_at, c.created_at, c.updated_at, c.completed_at
FROM training_checkpoints c
LEFT JOIN LATERAL (
    SELECT sum(k.shards)::integer AS shards
    FROM training_checkpoint_counts k
    WHERE k.job_id = c.job_id AND k.step = c.step AND k.run_attempt = c.run_attempt
) n ON true;

-- Phase 1, one statement: the shard upsert of 0005 unchanged; the checkpoint upsert only for the
-- checkpoints whose stored row does not already hold the batch's values; the batch's delta
-- added to this backend's count row.
CREATE FUNCTION ckpt_count_batch(
    checkpoints json, shards json,
    OUT shard_rows_changed integer, OUT checkpoints_recounted integer)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
BEGIN
    WITH moved AS (
        -- Only a strictly newer attempt replaces a stored shard; the same attempt again is a
        -- no-op replay and is not RETURNed, an older one never overwrites a newer one.
        INSERT INTO training_checkpoint_shards AS s
            (job_id, step, rank, run_attempt, epoch, world_size, uri, loss, metrics, size_bytes,
             sha256, extra, sqs_message_id, reported_at)
        SELECT * FROM json_to_recordset(shards) AS r(job_id text, step bigint, rank integer,
            run_attempt integer, epoch bigint, world_size integer, uri text, loss double precision,
            metrics jsonb, size_bytes bigint, sha256 text, extra jsonb, sqs_message_id text,
            reported_at timestamptz)
        ON CONFLICT (job_id, step, rank) DO UPDATE SET
            run_attempt = EXCLUDED.run_attempt,
            epoch = EXCLUDED.epoch,
            world_size = EXCLUDED.world_size,
            uri = EXCLUDED.uri,
            loss = EXCLUDED.loss,
            metrics = EXCLUDED.metrics,
            size_bytes = EXCLUDED.size_bytes,
            sha256 = EXCLUDED.sha256,
            extra = EXCLUDED.extra,
            sqs_message_id = EXCLUDED.sqs_message_id,
            reported_at = EXCLUDED.reported_at,
            updated_at = now()
        WHERE EXCLUDED.run_attempt > s.run_attempt
        RETURNING s.job_id, s.step, s.run_attempt
    ), contribution AS (
        -- As 0004: the count(*) reads the whole of `moved` (every shard row is written and
        -- locked before any checkpoint or count row), and only moves to the batch's newest
        -- attempt of a checkpoint are counted (a move to an older one can never count).
        SELECT t.ord, t.job_id, t.step, t.run_attempt, t.epoch, t.world_size,
               t.first_reported_at,
               (SELECT count(*) FROM moved m
                WHERE m.job_id = t.job_id AND m.step = t.step
                  AND m.run_attempt = t.run_attempt)::integer AS delta
        FROM ROWS FROM (json_to_recordset(checkpoints) AS (job_id text, step bigint,
                 run_attempt integer, epoch bigint, world_size integer,
                 first_reported_at timestamptz))
             WITH ORDINALITY AS t(job_id, step, run_attempt, epoch, world_size,
                                  first_reported_at, ord)
    ), raised AS (
        -- Skipped, without touching (or locking) the row, when this statement's snapshot shows a
        -- stored row that already holds the batch's values: every column only ever moves one
        -- way (attempt up; within it world_size/epoch up; first_reported_at down), so the newest
        -- committed row holds them too. That is every batch of a checkpoint but its first few.
        -- Otherwise the upsert of 0004, but the count is not in it: a newer attempt restarts
        -- the row's part of the count at 0 (its counts are in the count rows of that attempt),
        -- and a newer attempt or a larger world_size clears is_complete until the settle after
        -- this batch's commit decides it again.
        INSERT INTO training_checkpoints AS c
            (job_id, step, run_attempt, epoch, world_size, shards_present, is_complete,
             completed_at, first_reported_at)
        SELECT t.job_id, t.step, t.run_attempt, t.epoch, t.world_size, 0, false, NULL,
               t.first_reported_at
        FROM contribution t
        WHERE NOT EXISTS (
            SELECT FROM training_checkpoints d
            WHERE d.job_id = t.job_id AND d.step = t.step
              AND (d.run_attempt > t.run_attempt
                   OR (d.run_attempt = t.run_attempt AND d.world_size >= t.world_size
                       AND d.epoch >= t.epoch))
              AND d.first_reported_at <= t.first_reported_at)
        ORDER BY t.ord
        ON CONFLICT (job_id, step) DO UPDATE SET
            run_attempt = GREATEST(c.run_attempt, EXCLUDED.run_attempt),
            epoch = CASE
                WHEN EXCLUDED.run_attempt > c.run_attempt THEN EXCLUDED.epoch
                WHEN EXCLUDED.run_attempt = c.run_attempt THEN GREATEST(c.epoch, EXCLUDED.epoch)
                ELSE c.epoch END,
            world_size = CASE
                WHEN EXCLUDED.run_attempt > c.run_attempt THEN EXCLUDED.world_size
                WHEN EXCLUDED.run_attempt = c.run_attempt
                    THEN GREATEST(c.world_size, EXCLUDED.world_size)
                ELSE c.world_size END,
            shards_present = CASE
                WHEN EXCLUDED.run_attempt > c.run_attempt THEN 0
                ELSE c.shards_present END,
            is_complete = CASE
                WHEN EXCLUDED.run_attempt > c.run_attempt
                     OR (EXCLUDED.run_attempt = c.run_attempt
                         AND EXCLUDED.world_size > c.world_size) THEN false
                ELSE c.is_complete END,
            completed_at = CASE
                WHEN EXCLUDED.run_attempt > c.run_attempt
                     OR (EXCLUDED.run_attempt = c.run_attempt
                         AND EXCLUDED.world_size > c.world_size) THEN NULL
                ELSE c.completed_at END,
            first_reported_at = LEAST(c.first_reported_at, EXCLUDED.first_reported_at),
            updated_at = now()
        WHERE EXCLUDED.run_attempt > c.run_attempt
           OR (EXCLUDED.run_attempt = c.run_attempt
               AND (EXCLUDED.world_size > c.world_size OR EXCLUDED.epoch > c.epoch))
           OR EXCLUDED.first_reported_at < c.first_reported_at
        RETURNING 1
    ), counted AS (
        -- After `raised` (the count(*) reads all of it): shard rows, then checkpoint rows, then
        -- count rows, in every writer; a settle locks a checkpoint row, then its count rows.
        -- No other transaction updates this backend's count row, so this never waits (but on
        -- a settle that is moving it into the checkpoint row).
        INSERT INTO training_checkpoint_counts AS k (job_id, step, run_attempt, slot, shards)
        SELECT t.job_id, t.step, t.run_attempt, pg_backend_pid(), t.delta
        FROM contribution t
        WHERE t.delta > 0 AND (SELECT count(*) FROM raised) >= 0
        ORDER BY t.ord
        ON CONFLICT (job_id, step, run_attempt, slot) DO UPDATE SET
            shards = k.shards + EXCLUDED.shards
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM raised)
    INTO shard_rows_changed, checkpoints_recounted;
END
$fn$;

-- Settle: for each checkpoint of the batch whose attempt has all its shards counted but is not
-- marked complete yet, lock its row and move its counts into it (is_complete, completed_at,
-- shards_present = total). Returns how many rows it settled.
--
-- Run after the batch committed (ckpt_write_batch_counted) it sees every batch that committed
-- before, so the last batch of an attempt to commit settles it (docs/DESIGN.md). The check is a
-- read (no lock, no transaction id, no WAL flush); the row lock is taken once per attempt.
-- The settle takes each checkpoint's advisory lock (transaction level: released at this
-- transaction's end, no session state; inside a function RDS Proxy does not see it, nothing
-- pins) SHARED: settles never wait for each other on it, but one waits for a writer inside one
-- transaction (the previous release's function below), which holds it exclusively from before its
-- count to its commit, and then sees that writer's count.
CREATE FUNCTION ckpt_settle_checkpoints(checkpoints json)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
DECLARE
    k record;
    settled integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1668051043, hashtext(t.job_id || '/' || t.step))
    FROM json_to_recordset(checkpoints) AS t(job_id text, step bigint)
    ORDER BY hashtext(t.job_id || '/' || t.step);
    -- A new statement, so a snapshot taken after the advisory locks.
    FOR k IN
        SELECT c.job_id, c.step
        FROM json_to_recordset(checkpoints) AS t(job_id text, step bigint)
        JOIN training_checkpoints c ON c.job_id = t.job_id AND c.step = t.step
        WHERE NOT c.is_complete
          AND c.shards_present + coalesce((
                SELECT sum(n.shards) FROM training_checkpoint_counts n
                WHERE n.job_id = c.job_id AND n.step = c.step
                  AND n.run_attempt = c.run_attempt), 0) >= c.world_size
        ORDER BY c.job_id, c.step
    LOOP
        PERFORM FROM training_checkpoints c
        WHERE c.job_id = k.job_id AND c.step = k.step
        FOR NO KEY UPDATE;
        -- Under the row lock, in a new statement: the row as committed last, and every count
        -- committed before the lock was granted. DELETE … RETURNING hands back the version it
        -- deleted (the newest, after waiting for a writer still adding to it), so each count is
        -- moved exactly once; a count row inserted after this snapshot stays for the next settle.
        WITH folded AS (
            DELETE FROM training_checkpoint_counts n
            USING training_checkpoints c
            WHERE c.job_id = k.job_id AND c.step = k.step
              AND n.job_id = k.job_id AND n.step = k.step AND n.run_attempt = c.run_attempt
            RETURNING n.shards
        ), total AS (
            SELECT coalesce(sum(shards), 0)::integer AS n FROM folded
        )
        UPDATE training_checkpoints c SET
            shards_present = c.shards_present + total.n,
            is_complete = c.shards_present + total.n >= c.world_size,
            completed_at = CASE WHEN c.shards_present + total.n >= c.world_size
                                THEN coalesce(c.completed_at, now()) END,
            updated_at = now()
        FROM total
        WHERE c.job_id = k.job_id AND c.step = k.step;
        settled := settled + 1;
    END LOOP;
    RETURN settled;
END
$fn$;

-- The writer's statement from this release on: CALL ckpt_write_batch_counted(cps, shards, NULL,
-- NULL) on an autocommit connection. Phase 1 commits (the records are durable: the writer may
-- acknowledge them), then the settle runs in a transaction of its own. If the settle does not
-- run (the connection drops between the two), the CALL fails, the writer reports the records
-- for retry, and their redelivery (a no-op for the counts) runs it.
CREATE PROCEDURE ckpt_write_batch_counted(
    checkpoints json, shards json,
    OUT shard_rows_changed integer, OUT checkpoints_recounted integer)
LANGUAGE plpgsql SECURITY INVOKER
AS $fn$
BEGIN
    SELECT b.shard_rows_changed, b.checkpoints_recounted
    INTO shard_rows_changed, checkpoints_recounted
    FROM ckpt_count_batch(checkpoints, shards) b;
    COMMIT;
    checkpoints_recounted := checkpoints_recounted + ckpt_settle_checkpoints(checkpoints);
END
$fn$;

-- The previous release's statement (0005), kept working through a rolling deploy, and the one a
-- caller inside its own transaction uses (a procedure cannot COMMIT there): the same count, and
-- the settle inside the caller's transaction, under the checkpoint's advisory lock taken
-- exclusively first (a settle after another writer's commit waits for this transaction).
CREATE OR REPLACE FUNCTION ckpt_write_batch_json(
    checkpoints json, shards json,
    OUT shard_rows_changed integer, OUT checkpoints_recounted integer)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
BEGIN
    -- 1668051043 = 'ckpc': the key space of these locks (two-int4 keys, apart from bigint ones).
    PERFORM pg_advisory_xact_lock(1668051043, hashtext(t.job_id || '/' || t.step))
    FROM json_to_recordset(checkpoints) AS t(job_id text, step bigint)
    ORDER BY hashtext(t.job_id || '/' || t.step);
    SELECT b.shard_rows_changed, b.checkpoints_recounted
    INTO shard_rows_changed, checkpoints_recounted
    FROM ckpt_count_batch(checkpoints, shards) b;
    checkpoints_recounted := checkpoints_recounted + ckpt_settle_checkpoints(checkpoints);
END
$fn$;

GRANT SELECT, INSERT, UPDATE, DELETE ON training_checkpoint_counts TO ckpt_writer;
GRANT SELECT ON training_checkpoint_progress TO ckpt_writer;
REVOKE ALL ON FUNCTION ckpt_count_batch(json, json) FROM PUBLIC;
REVOKE ALL ON FUNCTION ckpt_settle_checkpoints(json) FROM PUBLIC;
REVOKE ALL ON PROCEDURE ckpt_write_batch_counted(json, json) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ckpt_count_batch(json, json) TO ckpt_writer;
GRANT EXECUTE ON FUNCTION ckpt_settle_checkpoints(json) TO ckpt_writer;
GRANT EXECUTE ON PROCEDURE ckpt_write_batch_counted(json, json) TO ckpt_writer;
