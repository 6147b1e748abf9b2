-- The writer's batch, version 2: the checkpoint's count moves by the exact delta of the shard
-- rows this batch moved, instead of a recount of all its shards. Same signature and result as
-- 0003 (CREATE OR REPLACE), so the writer's statement (lambda_writer/sql.py) is unchanged.
--
-- Why: 0003 recounted every shard of the touched checkpoints in every batch, O(world_size) per
-- batch and O(world_size^2) per checkpoint, and it took the checkpoint row lock FIRST, so the
-- shard upsert and the recount of every writer of one checkpoint ran one after the other.
-- Now the batch is ONE statement, in this order:
--   1. upsert the shard rows (key order); RETURNING gives the rows this batch inserted or moved to
--      a newer attempt, with their new run_attempt;
--   2. per checkpoint of the batch, delta = how many of those rows are of the batch's attempt for
--      that checkpoint (the newest attempt of its reports);
--   3. upsert the checkpoint rows (key order) last: a newer attempt resets the count to delta,
--      the same attempt adds delta, an older one leaves it. Only this step, the foreign-key
--      checks and the commit run under the checkpoint row lock.
-- The proof that no count is lost or doubled under concurrency, replays and stale attempts:
-- docs/DESIGN.md, "The writer: counting shards without recounting". Tests that force the
-- interleavings on two connections: tests/lambda_writer/test_interleavings.py.
--
-- The statement reads nothing through its snapshot: both upserts work on the newest committed
-- version of the row they conflict with (ON CONFLICT waits for a concurrent inserter and locks
-- the row; https://www.postgresql.org/docs/current/sql-insert.html#SQL-ON-CONFLICT), so the
-- 0003 argument about VOLATILE snapshots is no longer needed (the function stays VOLATILE: it
-- writes).
--
-- The shard index on (job_id, step, run_attempt) existed for the recount only; dropping it
-- takes one index insertion off every new shard, and lets a shard's move to a newer attempt be a
-- HOT update (run_attempt is then in no index). The readers that join shards on run_attempt
-- (resume, status) filter within the primary key's (job_id, step) prefix.
CREATE OR REPLACE FUNCTION ckpt_write_batch(
    c_job_id text[], c_step bigint[], c_run_attempt integer[], c_epoch bigint[],
    c_world_size integer[], c_first_reported_at timestamptz[],
    s_job_id text[], s_step bigint[], s_rank integer[], s_run_attempt integer[],
    s_epoch bigint[], s_world_size integer[], s_uri text[], s_loss double precision[],
    s_metrics jsonb[], s_size_bytes bigint[], s_sha256 text[], s_extra jsonb[],
    s_sqs_message_id text[], s_reported_at timestamptz[],
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
        SELECT * FROM unnest(s_job_id, s_step, s_rank, s_run_attempt, s_epoch, s_world_size,
                             s_uri, s_loss, s_metrics, s_size_bytes, s_sha256, s_extra,
                             s_sqs_message_id, s_reported_at)
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
        -- The count(*) reads the whole of `moved`, so every shard row is written (and locked)
        -- before the first checkpoint row is: shard locks, then checkpoint locks, each in key
        -- order, in every writer — no wait cycle. A shard moved to an attempt older than the
        -- batch's newest for its checkpoint can never count (the checkpoint's attempt will be
        -- at least the batch's), so only the batch's attempt is counted.
        SELECT t.ord, t.job_id, t.step, t.run_attempt, t.epoch, t.world_size,
               t.first_reported_at,
               (SELECT count(*) FROM moved m
                WHERE m.job_id = t.job_id AND m.step = t.step
                  AND m.run_attempt = t.run_attempt)::integer AS delta
        FROM unnest(c_job_id, c_step, c_run_attempt, c_epoch, c_world_size, c_first_reported_at)
             WITH ORDINALITY AS t(job_id, step, run_attempt, epoch, world_size,
                                  first_reported_at, ord)
    ), checkpoint AS (
        -- ON CONFLICT locks the existing row even when the WHERE is false and works on its
        -- newest committed version: every writer's read-modify-write of the count is
        -- serialised on this row, and sees the one before it. The SET is the join of
        -- lambda_writer.planning's CheckpointRow.merge, plus the count.
        INSERT INTO training_checkpoints AS c
            (job_id, step, run_attempt, epoch, world_size, shards_present, is_complete,
             completed_at, first_reported_at)
        SELECT job_id, step, run_attempt, epoch, world_size, delta, delta >= world_size,
               CASE WHEN delta >= world_size THEN now() END, first_reported_at
        FROM contribution
        ORDER BY ord
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
            -- EXCLUDED.shards_present is the batch's delta. A newer attempt restarts the count
            -- at it; the same attempt adds it; an older attempt's delta is 0 by construction.
            shards_present = CASE
                WHEN EXCLUDED.run_attempt > c.run_attempt THEN EXCLUDED.shards_present
                WHEN EXCLUDED.run_attempt = c.run_attempt
                    THEN c.shards_present + EXCLUDED.shards_present
                ELSE c.shards_present END,
            is_complete = CASE
                WHEN EXCLUDED.run_attempt > c.run_attempt
                    THEN EXCLUDED.shards_present >= EXCLUDED.world_size
                WHEN EXCLUDED.run_attempt = c.run_attempt
                    THEN c.shards_present + EXCLUDED.shards_present
                         >= GREATEST(c.world_size, EXCLUDED.world_size)
                ELSE c.is_complete END,
            -- Set when the attempt first becomes complete; cleared if a larger world_size of the
            -- same attempt makes it incomplete again (as 0003's recount did).
            completed_at = CASE
                WHEN EXCLUDED.run_attempt > c.run_attempt THEN EXCLUDED.completed_at
                WHEN EXCLUDED.run_attempt = c.run_attempt THEN
                    CASE WHEN c.shards_present + EXCLUDED.shards_present
                              >= GREATEST(c.world_size, EXCLUDED.world_size)
                         THEN COALESCE(c.completed_at, now()) END
                ELSE c.completed_at END,
            first_reported_at = LEAST(c.first_reported_at, EXCLUDED.first_reported_at),
            updated_at = now()
        -- A pure replay (delta 0, nothing raised) leaves the row as it is: no new row version.
        WHERE EXCLUDED.run_attempt > c.run_attempt
           OR (EXCLUDED.run_attempt = c.run_attempt
               AND (EXCLUDED.shards_present > 0 OR EXCLUDED.world_size > c.world_size
                    OR EXCLUDED.epoch > c.epoch))
           OR EXCLUDED.first_reported_at < c.first_reported_at
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM checkpoint)
    INTO shard_rows_changed, checkpoints_recounted;
END
$fn$;

DROP INDEX IF EXISTS training_checkpoint_shards_attempt_idx;
