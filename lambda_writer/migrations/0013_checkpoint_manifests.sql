-- Checkpoint manifests: a complete checkpoint attempt's shard rows, aggregated once by the settle
-- that marks it complete into the texts the resume walk reads (trainer_client/integrations/
-- shard_rows.py), so the lookup reads a few rows (one per 10,000 ranks) instead of the attempt's
-- shard rows.
--
-- Why (issue 33, BENCHMARKS.md section 10, python -m bench read_paths): at 100,000 ranks the
-- aggregated read of the shard rows was ~180-220 ms, most of it jsonb's output of every row's
-- pins, repeated by every resume; the settle runs once per attempt.
--
-- A manifest is a cache, never the truth: a reader uses it only where its run_attempt and
-- world_size are the checkpoint row's, and reads the shard rows otherwise (today's read), so a
-- checkpoint without one (completed before this migration, or by a path that does not build
-- one) reads as before. What keeps it from going stale (docs/DESIGN.md, "The lookup at 10
-- million shard rows"):
--   * the writer never changes a settled attempt's shard rows in place: a replay of the same
--     attempt is a no-op, an older attempt never overwrites, a newer attempt moves the rows and
--     raises the checkpoint row's run_attempt in the same statement (its manifest no longer
--     matches), a larger world_size at the same attempt raises the row's world_size and clears
--     is_complete (the next settle rebuilds);
--   * any UPDATE or DELETE of a shard row (a pin rewritten by hand, the prune, a move) deletes the
--     manifest of that row's attempt, in the same transaction (the triggers below); TRUNCATE
--     deletes every manifest. The writer's hot path (inserts, and replays that change nothing)
--     fires none of them.
-- A change in place (not a move to a newer attempt) or a DELETE first locks the checkpoint row,
-- as the settle does before it builds the manifest: whichever commits second sees the other's
-- work (the settle's build reads the change, or the change's delete sees the manifest). A move to
-- a newer attempt does not lock: the writer moves a checkpoint's rows from several backends at
-- once in rank order, and a lock on the checkpoint row taken per row would deadlock them; the
-- writer's move raises the row anyway.

CREATE TABLE training_checkpoint_manifests (
    job_id      text    NOT NULL,
    step        bigint  NOT NULL,
    -- The texts of ranks [chunk * n, (chunk + 1) * n) for the build's n (10,000 by default): a
    -- value of several megabytes costs the server and the client more per byte than a few of
    -- ~2 MB (BENCHMARKS.md section 10). chunks: how many rows the build wrote.
    chunk       integer NOT NULL,
    chunks      integer NOT NULL,
    -- The attempt and world size the texts are of: a reader uses the manifest only where they
    -- are the checkpoint row's.
    run_attempt integer NOT NULL,
    world_size  integer NOT NULL,
    -- SHARD_AGGREGATES' columns (trainer_client/integrations/shard_rows.py) over the chunk's
    -- rows, computed by the same expressions (tests/integrations/test_shard_rows.py compares the
    -- records).
    shard_count integer NOT NULL,
    first_rank  integer,
    last_rank   integer,
    ranks       text,
    uris        text,
    sizes       text,
    shas        text,
    pins        text,
    extra_ranks text,
    extras      text,
    built_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step, chunk),
    -- Deleting a checkpoint deletes its manifest (the prune; TRUNCATE … CASCADE).
    FOREIGN KEY (job_id, step) REFERENCES training_checkpoints (job_id, step) ON DELETE CASCADE
);

-- lz4 where the server has it (RDS for PostgreSQL does; a build without it keeps pglz): the texts
-- of 100,000 ranks are ~19 MB, ~1.5 MB stored, and lz4 compresses them several times faster.
DO $$
BEGIN
    ALTER TABLE training_checkpoint_manifests
        ALTER COLUMN ranks SET COMPRESSION lz4, ALTER COLUMN uris SET COMPRESSION lz4,
        ALTER COLUMN sizes SET COMPRESSION lz4, ALTER COLUMN shas SET COMPRESSION lz4,
        ALTER COLUMN pins SET COMPRESSION lz4, ALTER COLUMN extra_ranks SET COMPRESSION lz4,
        ALTER COLUMN extras SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'lz4 not supported by this server: manifests compressed with pglz';
END
$$;

-- Build (or rebuild) the manifest of a checkpoint's current attempt if it is complete, in chunks
-- of p_ranks_per_chunk ranks; nothing (and no manifest left) otherwise. The expressions are
-- SHARD_AGGREGATES' (shard_rows.py), over the same index range. PL/pgSQL, not SQL: its plans are
-- kept for the writer's session, where a SQL function's two statements are planned at every
-- call (measured against a SQL function: the same writer throughput within the noise, BENCHMARKS
-- section 10).
CREATE FUNCTION ckpt_build_manifest(p_job_id text, p_step bigint,
                                    p_ranks_per_chunk integer DEFAULT 10000)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
BEGIN
    DELETE FROM training_checkpoint_manifests m WHERE m.job_id = p_job_id AND m.step = p_step;
    INSERT INTO training_checkpoint_manifests
        (job_id, step, chunk, chunks, run_attempt, world_size, shard_count, first_rank,
         last_rank, ranks, uris, sizes, shas, pins, extra_ranks, extras)
    SELECT c.job_id, c.step, a.chunk, count(*) OVER (), c.run_attempt, c.world_size,
           a.shard_count, a.first_rank, a.last_rank, a.ranks, a.uris, a.sizes, a.shas, a.pins,
           a.extra_ranks, a.extras
    FROM training_checkpoints c
    CROSS JOIN LATERAL (
        SELECT s.rank / p_ranks_per_chunk, count(*)::integer, min(s.rank), max(s.rank),
               string_agg(s.rank::text, ','),
               string_agg(s.uri, E'\n'),
               string_agg(coalesce(s.size_bytes::text, ''), ','),
               string_agg(coalesce(s.sha256, ''), ','),
               string_agg(coalesce(s.objects, s.extra->'objects', 'null'::jsonb)::text, ','),
               string_agg(s.rank::text, ',') FILTER (WHERE s.extra <> '{}'::jsonb),
               string_agg(s.extra::text, ',') FILTER (WHERE s.extra <> '{}'::jsonb)
        FROM training_checkpoint_shards s
        WHERE s.job_id = c.job_id AND s.step = c.step AND s.run_attempt = c.run_attempt
        GROUP BY s.rank / p_ranks_per_chunk
    ) a(chunk, shard_count, first_rank, last_rank, ranks, uris, sizes, shas, pins, extra_ranks,
        extras)
    WHERE c.job_id = p_job_id AND c.step = p_step AND c.is_complete;
END
$fn$;

-- 0012's settle, and the manifest built in the same transaction once the row is complete, under
-- the row lock the settle already holds (a new statement: it reads every shard row committed
-- before the lock was granted, which includes every row the completed count counted).
CREATE OR REPLACE FUNCTION ckpt_settle_checkpoints(checkpoints json)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
DECLARE
    k record;
    settled integer := 0;
    complete boolean;
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
        -- 0012's text: each count row moved exactly once, its values with it.
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
        WHERE c.job_id = k.job_id AND c.step = k.step
        RETURNING c.is_complete INTO complete;
        IF complete THEN
            PERFORM ckpt_build_manifest(k.job_id, k.step);
        END IF;
        settled := settled + 1;
    END LOOP;
    RETURN settled;
END
$fn$;

-- Invalidation, row by row for UPDATE: the writer's hot path inserts (and its replays change
-- nothing), so only a move to a newer attempt or a change by hand fires it.
CREATE FUNCTION ckpt_manifest_row_changed()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
BEGIN
    IF NEW.run_attempt > OLD.run_attempt AND NEW.job_id = OLD.job_id AND NEW.step = OLD.step THEN
        -- A move to a newer attempt (the writer's, several backends at once): no wait on
        -- anything. A manifest another mover is deleting is skipped (that one deletes it, or
        -- aborts and its retry does); the writer's move raises the checkpoint row's attempt in
        -- this statement anyway, so the manifest no longer matches whatever happens here.
        DELETE FROM training_checkpoint_manifests m
        WHERE m.ctid IN (
            SELECT x.ctid FROM training_checkpoint_manifests x
            WHERE x.job_id = OLD.job_id AND x.step = OLD.step
              AND x.run_attempt = OLD.run_attempt
            FOR UPDATE SKIP LOCKED);
        RETURN NULL;
    END IF;
    -- A change in place (by hand: a rewritten pin): after a settle building this checkpoint's
    -- manifest commits, or before it starts (the header).
    PERFORM FROM training_checkpoints c
    WHERE c.job_id = OLD.job_id AND c.step = OLD.step
    FOR NO KEY UPDATE;
    DELETE FROM training_checkpoint_manifests m
    WHERE (m.job_id = OLD.job_id AND m.step = OLD.step AND m.run_attempt = OLD.run_attempt)
       OR (m.job_id = NEW.job_id AND m.step = NEW.step AND m.run_attempt = NEW.run_attempt);
    RETURN NULL;
END
$fn$;

-- Invalidation once per DELETE statement (the prune deletes a checkpoint's rows in one): the
-- manifests of the attempts it deleted rows of.
CREATE FUNCTION ckpt_manifest_rows_deleted()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
BEGIN
    PERFORM FROM training_checkpoints c
    WHERE (c.job_id, c.step) IN (SELECT DISTINCT o.job_id, o.step FROM gone o)
    ORDER BY c.job_id, c.step
    FOR NO KEY UPDATE OF c;
    DELETE FROM training_checkpoint_manifests m
    USING (SELECT DISTINCT o.job_id, o.step, o.run_attempt FROM gone o) o
    WHERE m.job_id = o.job_id AND m.step = o.step AND m.run_attempt = o.run_attempt;
    RETURN NULL;
END
$fn$;

CREATE FUNCTION ckpt_manifest_rows_truncated()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $fn$
BEGIN
    DELETE FROM training_checkpoint_manifests;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER training_checkpoint_shards_manifest_update
    AFTER UPDATE ON training_checkpoint_shards
    FOR EACH ROW EXECUTE FUNCTION ckpt_manifest_row_changed();
CREATE TRIGGER training_checkpoint_shards_manifest_delete
    AFTER DELETE ON training_checkpoint_shards
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION ckpt_manifest_rows_deleted();
CREATE TRIGGER training_checkpoint_shards_manifest_truncate
    AFTER TRUNCATE ON training_checkpoint_shards
    FOR EACH STATEMENT EXECUTE FUNCTION ckpt_manifest_rows_truncated();

-- The writer builds (settle) and deletes (a move fires the trigger); the prune's deletes fire the
-- delete trigger. Whoever may read the shard rows may read the manifests (they are their texts).
GRANT SELECT, INSERT, UPDATE, DELETE ON training_checkpoint_manifests TO ckpt_writer;
GRANT SELECT, DELETE ON training_checkpoint_manifests TO ckpt_pruner;
REVOKE ALL ON FUNCTION ckpt_build_manifest(text, bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ckpt_build_manifest(text, bigint, integer) TO ckpt_writer;
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
            GRANT SELECT ON training_checkpoint_manifests TO PUBLIC;
        ELSE
            EXECUTE format('GRANT SELECT ON training_checkpoint_manifests TO %I',
                           (SELECT rolname FROM pg_roles WHERE oid = grantee));
        END IF;
    END LOOP;
END
$$;
