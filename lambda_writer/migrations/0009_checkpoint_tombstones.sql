-- Retention: tombstones, checked by the writer's count statement under the checkpoint's advisory
-- lock, and the prune's functions. The argument: docs/DESIGN.md, "Retention: tombstones and the
-- best checkpoint" (Claim 3); forced interleavings in tests/lambda_writer/test_tombstones.py.

CREATE TABLE training_checkpoint_tombstones (
    job_id          text        NOT NULL,
    step            bigint      NOT NULL CHECK (step >= 0),
    -- Reports of this step with a smaller run_attempt are dropped by the writer.
    min_run_attempt integer     NOT NULL CHECK (min_run_attempt >= 0),
    pruned_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step)
);

-- 0008's count statement (ckpt_count_batch: 0006's with the pinned objects), with the tombstone
-- check: the batch's reports of a step are filtered by that step's tombstone before anything is
-- written. Everything else is 0008's text; `admitted` carries the array position so rows are
-- still written in key order.
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
                 loss double precision, metrics jsonb, size_bytes bigint, sha256 text,
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
        RETURNING s.job_id, s.step, s.run_attempt
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
                  AND m.run_attempt = t.run_attempt)::integer AS delta
        FROM ROWS FROM (json_to_recordset(checkpoints) AS (job_id text, step bigint,
                 run_attempt integer, epoch bigint, world_size integer,
                 first_reported_at timestamptz))
             WITH ORDINALITY AS t(job_id, step, run_attempt, epoch, world_size,
                                  first_reported_at, ord)
        LEFT JOIN fence f ON f.job_id = t.job_id AND f.step = t.step
        WHERE f.job_id IS NULL OR t.run_attempt >= f.min_run_attempt
    ), raised AS (
        -- 0006's (and 0008's) text.
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
        -- 0006's (and 0008's) text.
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

-- The prune's lock: each checkpoint's advisory lock (the writer's key), EXCLUSIVE, in the
-- writers' order (hash order), held to the caller's commit. Call it first in the prune's
-- transaction; every later statement's snapshot then shows every writer of those checkpoints
-- that committed, and no writer of them commits until the prune does.
CREATE FUNCTION ckpt_lock_checkpoints_for_prune(p_job_id text, steps bigint[])
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(1668051043, hashtext(p_job_id || '/' || s))
    FROM unnest(steps) AS s
    ORDER BY hashtext(p_job_id || '/' || s);
END
$fn$;

-- Remove whole checkpoints, each only if its row still is what the plan saw (attempt, world
-- size, completeness): rows, shard rows, count rows (cascade), and a tombstone at attempt + 1.
-- Call under ckpt_lock_checkpoints_for_prune of the same steps.
CREATE FUNCTION ckpt_remove_checkpoints(p_job_id text, checkpoints json)
RETURNS TABLE (step bigint, run_attempt integer, shard_rows integer)
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $fn$
    WITH wanted AS (
        SELECT w.step, w.run_attempt, w.world_size, w.is_complete
        FROM json_to_recordset(checkpoints)
             AS w(step bigint, run_attempt integer, world_size integer, is_complete boolean)
    ), gone AS (
        DELETE FROM training_checkpoints c
        USING wanted w
        WHERE c.job_id = p_job_id AND c.step = w.step AND c.run_attempt = w.run_attempt
          AND c.world_size = w.world_size AND c.is_complete = w.is_complete
        RETURNING c.step, c.run_attempt
    ), shards AS (
        DELETE FROM training_checkpoint_shards s
        USING gone g
        WHERE s.job_id = p_job_id AND s.step = g.step
        RETURNING s.step
    ), fenced AS (
        INSERT INTO training_checkpoint_tombstones AS f (job_id, step, min_run_attempt)
        SELECT p_job_id, g.step, g.run_attempt + 1 FROM gone g
        ON CONFLICT (job_id, step) DO UPDATE SET
            min_run_attempt = GREATEST(f.min_run_attempt, EXCLUDED.min_run_attempt),
            pruned_at = now()
        RETURNING 1
    )
    SELECT g.step, g.run_attempt,
           (SELECT count(*) FROM shards s WHERE s.step = g.step)::integer
    FROM gone g
    ORDER BY g.step;
$fn$;

-- Remove the shard rows of attempts older than each checkpoint's current one (never counted),
-- only where the checkpoint is still at the attempt the plan saw; tombstone at that attempt.
-- Call under ckpt_lock_checkpoints_for_prune of the same steps.
CREATE FUNCTION ckpt_remove_superseded(p_job_id text, checkpoints json)
RETURNS TABLE (step bigint, run_attempt integer, shard_rows integer)
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $fn$
    WITH wanted AS (
        SELECT c.step, c.run_attempt
        FROM json_to_recordset(checkpoints) AS w(step bigint, run_attempt integer)
        JOIN training_checkpoints c
          ON c.job_id = p_job_id AND c.step = w.step AND c.run_attempt = w.run_attempt
    ), gone AS (
        DELETE FROM training_checkpoint_shards s
        USING wanted w
        WHERE s.job_id = p_job_id AND s.step = w.step AND s.run_attempt < w.run_attempt
        RETURNING s.step
    ), fenced AS (
        INSERT INTO training_checkpoint_tombstones AS f (job_id, step, min_run_attempt)
        SELECT p_job_id, w.step, w.run_attempt FROM wanted w
        ON CONFLICT (job_id, step) DO UPDATE SET
            min_run_attempt = GREATEST(f.min_run_attempt, EXCLUDED.min_run_attempt),
            pruned_at = now()
        RETURNING 1
    )
    SELECT w.step, w.run_attempt,
           (SELECT count(*) FROM gone g WHERE g.step = w.step)::integer
    FROM wanted w
    ORDER BY w.step;
$fn$;

-- A checkpoint's value of a metric, defined once (best_complete_checkpoint, `ckpt-pipeline
-- checkpoints`, `ckpt-pipeline prune --keep-best` all read it): the mean, over the shard rows of
-- the checkpoint's current attempt that carry the metric, of its value. `loss` is the shard's
-- loss; any other name is a key of its metrics (a non-number there counts as missing). Summed in
-- rank order, so the same rows always give the same double. A checkpoint none of whose shards
-- carries the metric has no row here (no value: never ranked).
CREATE FUNCTION ckpt_checkpoint_values(p_job_id text, p_metric text)
RETURNS TABLE (step bigint, run_attempt integer, value double precision, shards_valued integer)
LANGUAGE sql STABLE SECURITY INVOKER
AS $fn$
    SELECT c.step, c.run_attempt, avg(v.value ORDER BY s.rank), count(v.value)::integer
    FROM training_checkpoints c
    JOIN training_checkpoint_shards s
      ON s.job_id = c.job_id AND s.step = c.step AND s.run_attempt = c.run_attempt
    CROSS JOIN LATERAL (
        SELECT CASE
            WHEN p_metric = 'loss' THEN s.loss
            WHEN jsonb_typeof(s.metrics -> p_metric) = 'number'
                THEN (s.metrics ->> p_metric)::double precision
        END) AS v(value)
    WHERE c.job_id = p_job_id
    GROUP BY c.step, c.run_attempt
    HAVING count(v.value) > 0;
$fn$;

GRANT SELECT ON training_checkpoint_tombstones TO ckpt_writer;
REVOKE EXECUTE ON FUNCTION ckpt_write_batch(
    text[], bigint[], integer[], bigint[], integer[], timestamptz[],
    text[], bigint[], integer[], integer[], bigint[], integer[], text[], double precision[],
    jsonb[], bigint[], text[], jsonb[], text[], timestamptz[]) FROM ckpt_writer;
REVOKE ALL ON FUNCTION ckpt_lock_checkpoints_for_prune(text, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION ckpt_remove_checkpoints(text, json) FROM PUBLIC;
REVOKE ALL ON FUNCTION ckpt_remove_superseded(text, json) FROM PUBLIC;
