-- Pinned objects per shard row (NULL: nothing pinned), and ckpt_count_batch as 0006's statement
-- plus that column. Why it is safe in a rolling deploy: docs/DESIGN.md, "Pinned objects".

ALTER TABLE training_checkpoint_shards ADD COLUMN objects jsonb;

CREATE OR REPLACE FUNCTION ckpt_count_batch(
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
             sha256, extra, sqs_message_id, reported_at, objects)
        SELECT * FROM json_to_recordset(shards) AS r(job_id text, step bigint, rank integer,
            run_attempt integer, epoch bigint, world_size integer, uri text, loss double precision,
            metrics jsonb, size_bytes bigint, sha256 text, extra jsonb, sqs_message_id text,
            reported_at timestamptz, objects jsonb)
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
            objects = EXCLUDED.objects,
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
