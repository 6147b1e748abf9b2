-- The writer's batch, version 3: the same one statement as 0004 (shard upsert, the batch's exact
-- delta, checkpoint upsert last; its correctness argument is unchanged: docs/DESIGN.md, "The
-- writer: counting shards without recounting"), with the batch passed as TWO json parameters
-- (checkpoint rows, shard rows: arrays of objects in the plan's key order) instead of 20 arrays.
--
-- Why (measured with bench/writer_throughput.py and bench/_writer_profile.py): the fixed cost of
-- a 10-record batch was dominated by the client, and most of that was psycopg dumping 20 array
-- parameters, element by element in Python; building the two json texts costs a fraction of it,
-- and the server parses 2 parameters (json_to_recordset, in C) instead of resolving 20 casts.
-- Everything the database does with the rows is 0004's.
--
-- A new function beside 0004's (not CREATE OR REPLACE of it): a writer of the previous release
-- still calls ckpt_write_batch(<20 arrays>) until its execution environments are replaced.
--
-- Rows are written in array order (json_to_recordset returns the elements in order) and the
-- checkpoint rows explicitly ORDER BY their position: every writer locks in one key order.
CREATE FUNCTION ckpt_write_batch_json(
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
        FROM ROWS FROM (json_to_recordset(checkpoints) AS (job_id text, step bigint,
                 run_attempt integer, epoch bigint, world_size integer,
                 first_reported_at timestamptz))
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

REVOKE ALL ON FUNCTION ckpt_write_batch_json(json, json) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ckpt_write_batch_json(json, json) TO ckpt_writer;
