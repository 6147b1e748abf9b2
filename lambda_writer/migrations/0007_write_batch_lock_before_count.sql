-- The writer's procedure, version 2: the checkpoint's advisory lock is taken (shared) before the
-- count instead of after the commit, and the settle after the commit is one read that calls
-- ckpt_settle_checkpoints only when an attempt of the batch has all its shards counted but is
-- not marked complete (once per attempt). Same signature, same results, same statement in the
-- writer (lambda_writer/sql.py): a writer of the 0006 release picks it up at its next CALL.
--
-- Why (issue 15 item 5, BENCHMARKS.md section 2, python -m bench.writer_throughput): 0006's
-- settle ran two queries after every commit (the shared advisory lock, then the check inside
-- ckpt_settle_checkpoints' loop), each parsing the batch's checkpoints again; it was ~0.12 ms
-- of a ~1.4 ms batch and took batch 10 from 76 % to 67 % of COPY at the same granularity.
--
-- Why the lock may move (docs/DESIGN.md, "The writer: counting shards in slot rows"): the
-- shared lock exists for one pair only, a writer W inside its own transaction
-- (ckpt_write_batch_json, which holds the lock exclusively from before its count to its commit
-- and settles in that transaction) and a writer A of this procedure. One of them must see the
-- other's count when it settles. With A holding the shared lock from before its count to its
-- commit:
--   * W took it first: A waits for W's commit before it counts, so A's settle, later still,
--     sees W's count;
--   * A took it first: W waits for A's commit before it counts, so W's settle sees A's count.
-- Two writers of this procedure (or of 0006's) take it shared and never wait for each other;
-- between them the last to commit settles, as in 0006. A writer of 0006's procedure still
-- running (the old body, mid-CALL, when this commits) takes the lock after its commit, which
-- 0006 showed correct against W, and against this procedure it is just another last-committer.
--
-- Lock order stays: advisory lock, then shard rows, then checkpoint rows, then count rows (W
-- takes its exclusive advisory lock first too), so no new deadlock.

CREATE OR REPLACE PROCEDURE ckpt_write_batch_counted(
    checkpoints json, shards json,
    OUT shard_rows_changed integer, OUT checkpoints_recounted integer)
LANGUAGE plpgsql SECURITY INVOKER
AS $fn$
BEGIN
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
