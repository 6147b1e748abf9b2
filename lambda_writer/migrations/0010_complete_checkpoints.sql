-- "Complete checkpoint" and "latest complete checkpoint", each defined once (docs/DESIGN.md,
-- "Database contract"): every reader selects from these two views.
CREATE VIEW complete_checkpoints AS
SELECT job_id, step, epoch, run_attempt, world_size, shards_present, completed_at, updated_at
FROM training_checkpoints
WHERE is_complete;

-- 0001's view, now over complete_checkpoints (same columns, same plan).
CREATE OR REPLACE VIEW latest_complete_checkpoints AS
SELECT DISTINCT ON (job_id)
       job_id, step, epoch, run_attempt, world_size, shards_present, completed_at, updated_at
FROM complete_checkpoints
ORDER BY job_id, step DESC;

-- Whoever may read the table may read the new view (the writer; a resuming job's read-only role).
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = 'training_checkpoints'::regclass AND a.privilege_type = 'SELECT'
          AND a.grantee <> c.relowner
    LOOP
        IF grantee = 0 THEN
            GRANT SELECT ON complete_checkpoints TO PUBLIC;
        ELSE
            EXECUTE format('GRANT SELECT ON complete_checkpoints TO %I',
                           (SELECT rolname FROM pg_roles WHERE oid = grantee));
        END IF;
    END LOOP;
END
$$;
