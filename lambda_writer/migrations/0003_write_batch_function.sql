-- The writer's whole batch as ONE statement: `SELECT * FROM ckpt_write_batch(<column arrays>)`.
-- One round trip per batch through RDS Proxy (instead of BEGIN + 3 statements + COMMIT), the row
-- locks are held for the shortest time, and a Lambda frozen mid-batch cannot leave a transaction
-- idle. The algorithm and why it is safe under concurrency: lambda_writer/repository.py.
--
-- VOLATILE matters: in READ COMMITTED a volatile function takes a fresh snapshot for each
-- statement it runs (https://www.postgresql.org/docs/current/xfunc-volatility.html), so step 3
-- sees every shard committed by writers that held the checkpoint locks before step 1 got them.
-- Arrays arrive sorted by key (lambda_writer/planning.py): rows are locked in one global order.
CREATE FUNCTION ckpt_write_batch(
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
    -- 1. Checkpoints. ON CONFLICT locks the existing row even when the WHERE is false
    --    (https://www.postgresql.org/docs/current/sql-insert.html#SQL-ON-CONFLICT): every writer
    --    of a checkpoint queues here. The SET is the join of lambda_writer.planning's
    --    CheckpointRow.merge: a newer attempt replaces the row and restarts its count; the same
    --    attempt only raises world_size/epoch; first_reported_at only moves earlier.
    INSERT INTO training_checkpoints AS c
        (job_id, step, run_attempt, epoch, world_size, first_reported_at)
    SELECT * FROM unnest(c_job_id, c_step, c_run_attempt, c_epoch, c_world_size,
                         c_first_reported_at)
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
        shards_present = CASE WHEN EXCLUDED.run_attempt > c.run_attempt THEN 0
            ELSE c.shards_present END,
        is_complete = CASE WHEN EXCLUDED.run_attempt > c.run_attempt THEN false
            ELSE c.is_complete END,
        completed_at = CASE WHEN EXCLUDED.run_attempt > c.run_attempt THEN NULL
            ELSE c.completed_at END,
        first_reported_at = LEAST(c.first_reported_at, EXCLUDED.first_reported_at),
        updated_at = now()
    WHERE EXCLUDED.run_attempt > c.run_attempt
       OR (EXCLUDED.run_attempt = c.run_attempt
           AND (EXCLUDED.world_size > c.world_size OR EXCLUDED.epoch > c.epoch))
       OR EXCLUDED.first_reported_at < c.first_reported_at;

    -- 2. Shards: only a strictly newer attempt replaces a stored shard; the same attempt again
    --    is a no-op replay (ROW_COUNT counts inserted + updated rows only).
    INSERT INTO training_checkpoint_shards AS s
        (job_id, step, rank, run_attempt, epoch, world_size, uri, loss, metrics, size_bytes,
         sha256, extra, sqs_message_id, reported_at)
    SELECT * FROM unnest(s_job_id, s_step, s_rank, s_run_attempt, s_epoch, s_world_size, s_uri,
                         s_loss, s_metrics, s_size_bytes, s_sha256, s_extra, s_sqs_message_id,
                         s_reported_at)
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
    WHERE EXCLUDED.run_attempt > s.run_attempt;
    GET DIAGNOSTICS shard_rows_changed = ROW_COUNT;

    -- 3. Recount the touched checkpoints from the shards of their current attempt (recomputed,
    --    never incremented: replays cannot double-count). Unchanged rows are left alone.
    WITH counts AS (
        SELECT c.job_id, c.step, count(s.rank)::integer AS present
        FROM unnest(c_job_id, c_step) AS t(job_id, step)
        JOIN training_checkpoints c ON c.job_id = t.job_id AND c.step = t.step
        LEFT JOIN training_checkpoint_shards s
            ON s.job_id = c.job_id AND s.step = c.step AND s.run_attempt = c.run_attempt
        GROUP BY c.job_id, c.step
    )
    UPDATE training_checkpoints c SET
        shards_present = n.present,
        is_complete = (n.present >= c.world_size),
        completed_at = CASE WHEN n.present >= c.world_size
            THEN COALESCE(c.completed_at, now()) END,
        updated_at = now()
    FROM counts n
    WHERE c.job_id = n.job_id AND c.step = n.step
      AND (c.shards_present <> n.present OR c.is_complete <> (n.present >= c.world_size));
    GET DIAGNOSTICS checkpoints_recounted = ROW_COUNT;
END
$fn$;

REVOKE ALL ON FUNCTION ckpt_write_batch(
    text[], bigint[], integer[], bigint[], integer[], timestamptz[], text[], bigint[], integer[],
    integer[], bigint[], integer[], text[], double precision[], jsonb[], bigint[], text[], jsonb[],
    text[], timestamptz[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ckpt_write_batch(
    text[], bigint[], integer[], bigint[], integer[], timestamptz[], text[], bigint[], integer[],
    integer[], bigint[], integer[], text[], double precision[], jsonb[], bigint[], text[], jsonb[],
    text[], timestamptz[]) TO ckpt_writer;
