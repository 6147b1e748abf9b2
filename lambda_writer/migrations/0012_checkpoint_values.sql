-- A checkpoint's values kept by the writer, so that the readers of values (best_complete_checkpoint,
-- `ckpt-pipeline checkpoints`, the prune planner) read one row per checkpoint, not every shard row
-- of the job: at 100,000 ranks x 100 checkpoints (10^7 shard rows) ckpt_checkpoint_values took
-- 24 s (BENCHMARKS.md section 10).
--
-- What is kept: per checkpoint attempt, for each metric a reader can name (`loss`, the shard's
-- loss; any other name, that key of the shard's metrics holding a number), the exact sum and the
-- number of the shard rows of that attempt that carry it:
--     {"loss": [sum, n], "<key>": [sum, n], ...}     (jsonb; sums are exact decimals)
-- Split as the shard count is (0006): the row's settled part (training_checkpoints.value_sums)
-- plus the part of each count row of the row's attempt (training_checkpoint_counts.value_sums).
-- The writer's count statement credits a shard's values to the count row it credits the shard
-- to, in the same statement, for the same moves (only a move to the batch's newest attempt of the
-- checkpoint), so Claim 1 of docs/DESIGN.md ("The writer: counting shards in slot rows") holds
-- for the values word for word: the row's part plus the count rows' parts of attempt A are the
-- sums over the shard rows at A (a shard row at A never changes until it moves to a newer
-- attempt), at every snapshot, whatever the order, duplication or concurrency of the batches.
-- The settle moves the values with the counts; a newer attempt restarts the row's part at {}.
--
-- Why exact decimal sums: a sum of doubles depends on the order of the additions, and the writer
-- adds in batch order; numeric addition does not. The value is each report's number as its JSON
-- carried it (the loss read from the batch's json as numeric: the stored double is the same one,
-- numeric -> float8 reads the same digits), summed exactly, divided once.

-- Every table the statement below touches is locked first, in the writers' order (shard rows,
-- checkpoint rows, count rows): a writer already inside its count statement holds all three
-- (PostgreSQL locks every table of a statement when it starts), so the backfill below waits for
-- its commit and sees its rows; a writer starting later waits for this migration and runs the new
-- body. Nothing is counted by the old body after the backfill's snapshot.
LOCK TABLE training_checkpoint_shards, training_checkpoints, training_checkpoint_counts
    IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE training_checkpoints ADD COLUMN value_sums jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE training_checkpoint_counts ADD COLUMN value_sums jsonb NOT NULL DEFAULT '{}'::jsonb;
-- At most the smallest run_attempt of any shard row the checkpoint has had (a min: order-
-- independent like every column the writer joins). A shard row of an attempt older than the
-- checkpoint's (superseded: a restart mid-save, or a late report of an older attempt) can exist
-- only where this is below run_attempt, so the readers count superseded rows only there.
ALTER TABLE training_checkpoints ADD COLUMN oldest_run_attempt integer NOT NULL DEFAULT 0;

-- The values one shard row carries, as (name, value): the one definition the count statement and
-- the backfill share. A metrics key named "loss" is not a value of its own (`loss` names the
-- shard's loss, as ckpt_checkpoint_values has defined since 0009).
CREATE FUNCTION ckpt_shard_values(loss numeric, metrics jsonb)
RETURNS TABLE (name text, value numeric)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
    SELECT 'loss', loss WHERE loss IS NOT NULL
    UNION ALL
    SELECT m.key, m.value::numeric
    FROM jsonb_each(metrics) m
    WHERE m.key <> 'loss' AND jsonb_typeof(m.value) = 'number';
$fn$;

-- Two value maps added: per name, sums added and counts added.
CREATE FUNCTION ckpt_add_values(a jsonb, b jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
    SELECT coalesce(jsonb_object_agg(e.key, jsonb_build_array(e.total, e.n)), '{}'::jsonb)
    FROM (
        SELECT x.key, sum((x.value ->> 0)::numeric) AS total, sum((x.value ->> 1)::bigint) AS n
        FROM (SELECT * FROM jsonb_each(coalesce(a, '{}'::jsonb))
              UNION ALL
              SELECT * FROM jsonb_each(coalesce(b, '{}'::jsonb))) x
        GROUP BY x.key
    ) e;
$fn$;

CREATE AGGREGATE ckpt_sum_values(jsonb) (
    SFUNC = ckpt_add_values,
    STYPE = jsonb,
    INITCOND = '{}'
);

-- Backfill: the settled part of every checkpoint is the sums over its shard rows at its attempt,
-- and the count rows' parts are {} (the column's default). The stored loss is a double here, read
-- as its shortest round-trip decimal (what a client's JSON carries for it).
SET LOCAL extra_float_digits = 1;
UPDATE training_checkpoints c
SET value_sums = v.value_sums
FROM (
    SELECT g.job_id, g.step, g.run_attempt,
           jsonb_object_agg(g.name, jsonb_build_array(g.total, g.n)) AS value_sums
    FROM (
        SELECT s.job_id, s.step, s.run_attempt, v.name, sum(v.value) AS total, count(*) AS n
        FROM training_checkpoint_shards s
        CROSS JOIN LATERAL ckpt_shard_values(s.loss::text::numeric, s.metrics) v
        GROUP BY s.job_id, s.step, s.run_attempt, v.name
    ) g
    GROUP BY g.job_id, g.step, g.run_attempt
) v
WHERE c.job_id = v.job_id AND c.step = v.step AND c.run_attempt = v.run_attempt;
UPDATE training_checkpoints c
SET oldest_run_attempt = LEAST(c.run_attempt, coalesce(o.oldest, c.run_attempt))
FROM training_checkpoints c2
LEFT JOIN LATERAL (
    SELECT min(s.run_attempt) AS oldest FROM training_checkpoint_shards s
    WHERE s.job_id = c2.job_id AND s.step = c2.step
) o ON true
WHERE c.job_id = c2.job_id AND c.step = c2.step;

-- 0009's count statement with the values: the loss read as numeric (stored as the same double),
-- `moved` returns the rank, `valued` sums the moved shards' values per checkpoint and attempt,
-- `contribution` takes those of its newest attempt (exactly the moves it counts in `delta`), a
-- newer attempt restarts the row's part at {} (as shards_present at 0), and the count row adds
-- them to its part. Everything else is 0009's text (tests/lambda_writer/test_values.py compares).
CREATE OR REPLACE FUNCTION ckpt_count_batch(
    checkpoints json, shards json,
    OUT shard_rows_changed integer, OUT checkpoints_recounted integer)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
BEGIN
    WITH fence AS (
        -- The tombstones of the batch's steps (almost always none): one index probe each.
        SELECT f.job_id, f.step, f.min_run_attempt
        FROM json_to_recordset(checkpoints) AS t(job_id text, step bigint)
        JOIN training_checkpoint_tombstones f ON f.job_id = t.job_id AND f.step = t.step
    ), admitted AS (
        SELECT r.*
        FROM ROWS FROM (json_to_recordset(shards) AS (job_id text, step bigint, rank integer,
                 run_attempt integer, epoch bigint, world_size integer, uri text,
                 loss numeric, metrics jsonb, size_bytes bigint, sha256 text,
                 extra jsonb, sqs_message_id text, reported_at timestamptz, objects jsonb))
             WITH ORDINALITY AS r(job_id, step, rank, run_attempt, epoch, world_size, uri, loss,
                                  metrics, size_bytes, sha256, extra, sqs_message_id,
                                  reported_at, objects, ord)
        WHERE NOT EXISTS (
            SELECT FROM fence f
            WHERE f.job_id = r.job_id AND f.step = r.step AND r.run_attempt < f.min_run_attempt)
    ), moved AS (
        -- Only a strictly newer attempt replaces a stored shard; the same attempt again is a
        -- no-op replay and is not RETURNed, an older one never overwrites a newer one.
        INSERT INTO training_checkpoint_shards AS s
            (job_id, step, rank, run_attempt, epoch, world_size, uri, loss, metrics, size_bytes,
             sha256, extra, sqs_message_id, reported_at, objects)
        SELECT job_id, step, rank, run_attempt, epoch, world_size, uri, loss, metrics,
               size_bytes, sha256, extra, sqs_message_id, reported_at, objects
        FROM admitted
        ORDER BY ord
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
        RETURNING s.job_id, s.step, s.run_attempt, s.rank
    ), valued AS (
        -- The values of the moved shards (a moved row holds exactly its admitted report), per
        -- checkpoint, attempt and name.
        SELECT v.job_id, v.step, v.run_attempt,
               jsonb_object_agg(v.name, jsonb_build_array(v.total, v.n)) AS value_sums
        FROM (
            SELECT m.job_id, m.step, m.run_attempt, x.name, sum(x.value) AS total,
                   count(*) AS n
            FROM moved m
            JOIN admitted a ON a.job_id = m.job_id AND a.step = m.step AND a.rank = m.rank
            CROSS JOIN LATERAL ckpt_shard_values(a.loss, a.metrics) x
            GROUP BY m.job_id, m.step, m.run_attempt, x.name
        ) v
        GROUP BY v.job_id, v.step, v.run_attempt
    ), contribution AS (
        -- As 0006/0008. A contribution whose (newest) attempt the tombstone drops is dropped whole;
        -- one it admits takes first_reported_at from the admitted shard rows only, so a dropped
        -- report leaves no trace in the row either.
        SELECT t.ord, t.job_id, t.step, t.run_attempt, t.epoch, t.world_size,
               CASE WHEN f.job_id IS NULL THEN t.first_reported_at
                    ELSE (SELECT min(a.reported_at) FROM admitted a
                          WHERE a.job_id = t.job_id AND a.step = t.step) END
                   AS first_reported_at,
               (SELECT count(*) FROM moved m
                WHERE m.job_id = t.job_id AND m.step = t.step
                  AND m.run_attempt = t.run_attempt)::integer AS delta,
               (SELECT min(m.run_attempt) FROM moved m
                WHERE m.job_id = t.job_id AND m.step = t.step) AS oldest_moved,
               coalesce((SELECT v.value_sums FROM valued v
                         WHERE v.job_id = t.job_id AND v.step = t.step
                           AND v.run_attempt = t.run_attempt), '{}'::jsonb) AS value_sums
        FROM ROWS FROM (json_to_recordset(checkpoints) AS (job_id text, step bigint,
                 run_attempt integer, epoch bigint, world_size integer,
                 first_reported_at timestamptz))
             WITH ORDINALITY AS t(job_id, step, run_attempt, epoch, world_size,
                                  first_reported_at, ord)
        LEFT JOIN fence f ON f.job_id = t.job_id AND f.step = t.step
        WHERE f.job_id IS NULL OR t.run_attempt >= f.min_run_attempt
    ), raised AS (
        -- 0006's (and 0008's) text, the values' part restarted with the attempt, and the
        -- oldest attempt a shard row was moved to joined (min) like first_reported_at: a batch
        -- moving none leaves it as it is.
        INSERT INTO training_checkpoints AS c
            (job_id, step, run_attempt, epoch, world_size, shards_present, is_complete,
             completed_at, first_reported_at, oldest_run_attempt)
        SELECT t.job_id, t.step, t.run_attempt, t.epoch, t.world_size, 0, false, NULL,
               t.first_reported_at, LEAST(t.run_attempt, coalesce(t.oldest_moved, t.run_attempt))
        FROM contribution t
        WHERE NOT EXISTS (
            SELECT FROM training_checkpoints d
            WHERE d.job_id = t.job_id AND d.step = t.step
              AND (d.run_attempt > t.run_attempt
                   OR (d.run_attempt = t.run_attempt AND d.world_size >= t.world_size
                       AND d.epoch >= t.epoch))
              AND d.first_reported_at <= t.first_reported_at
              AND (t.oldest_moved IS NULL OR d.oldest_run_attempt <= t.oldest_moved))
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
            value_sums = CASE
                WHEN EXCLUDED.run_attempt > c.run_attempt THEN '{}'::jsonb
                ELSE c.value_sums END,
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
            oldest_run_attempt = LEAST(c.oldest_run_attempt, EXCLUDED.oldest_run_attempt),
            updated_at = now()
        WHERE EXCLUDED.run_attempt > c.run_attempt
           OR (EXCLUDED.run_attempt = c.run_attempt
               AND (EXCLUDED.world_size > c.world_size OR EXCLUDED.epoch > c.epoch))
           OR EXCLUDED.first_reported_at < c.first_reported_at
           OR EXCLUDED.oldest_run_attempt < c.oldest_run_attempt
        RETURNING 1
    ), counted AS (
        -- 0006's (and 0008's) text, and the values added to the count row's part.
        INSERT INTO training_checkpoint_counts AS k
            (job_id, step, run_attempt, slot, shards, value_sums)
        SELECT t.job_id, t.step, t.run_attempt, pg_backend_pid(), t.delta, t.value_sums
        FROM contribution t
        WHERE t.delta > 0 AND (SELECT count(*) FROM raised) >= 0
        ORDER BY t.ord
        ON CONFLICT (job_id, step, run_attempt, slot) DO UPDATE SET
            shards = k.shards + EXCLUDED.shards,
            value_sums = ckpt_add_values(k.value_sums, EXCLUDED.value_sums)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM raised)
    INTO shard_rows_changed, checkpoints_recounted;
END
$fn$;

-- 0006's settle, moving each deleted count row's values with its shards.
CREATE OR REPLACE FUNCTION ckpt_settle_checkpoints(checkpoints json)
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
        -- moved exactly once, its values with it; a count row inserted after this snapshot stays
        -- for the next settle.
        WITH folded AS (
            DELETE FROM training_checkpoint_counts n
            USING training_checkpoints c
            WHERE c.job_id = k.job_id AND c.step = k.step
              AND n.job_id = k.job_id AND n.step = k.step AND n.run_attempt = c.run_attempt
            RETURNING n.shards, n.value_sums
        ), total AS (
            SELECT coalesce(sum(shards), 0)::integer AS n, ckpt_sum_values(value_sums) AS v
            FROM folded
        )
        UPDATE training_checkpoints c SET
            shards_present = c.shards_present + total.n,
            value_sums = ckpt_add_values(c.value_sums, total.v),
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

-- 0009's definition (same signature, same rows, same grants), read from the kept values: one row
-- and the count rows of its attempt per checkpoint, never a shard row. The mean: the exact sum,
-- rounded to a double, divided by the count.
CREATE OR REPLACE FUNCTION ckpt_checkpoint_values(p_job_id text, p_metric text)
RETURNS TABLE (step bigint, run_attempt integer, value double precision, shards_valued integer)
LANGUAGE sql STABLE SECURITY INVOKER
AS $fn$
    SELECT c.step, c.run_attempt, sum(x.total)::double precision / sum(x.n),
           sum(x.n)::integer
    FROM training_checkpoints c
    CROSS JOIN LATERAL (
        SELECT (c.value_sums -> p_metric ->> 0)::numeric, (c.value_sums -> p_metric ->> 1)::bigint
        UNION ALL
        SELECT (k.value_sums -> p_metric ->> 0)::numeric, (k.value_sums -> p_metric ->> 1)::bigint
        FROM training_checkpoint_counts k
        WHERE k.job_id = c.job_id AND k.step = c.step AND k.run_attempt = c.run_attempt
    ) x(total, n)
    WHERE c.job_id = p_job_id
    GROUP BY c.step, c.run_attempt
    HAVING sum(x.n) > 0;
$fn$;

-- Whoever may read the shard rows may read the count rows (the values are their sums): the read
-- roles ckpt_checkpoint_values runs as (a resuming job's, ckpt_pruner).
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = 'training_checkpoint_shards'::regclass AND a.privilege_type = 'SELECT'
          AND a.grantee <> c.relowner
    LOOP
        IF grantee = 0 THEN
            GRANT SELECT ON training_checkpoint_counts TO PUBLIC;
        ELSE
            EXECUTE format('GRANT SELECT ON training_checkpoint_counts TO %I',
                           (SELECT rolname FROM pg_roles WHERE oid = grantee));
        END IF;
    END LOOP;
END
$$;
