-- The scheduled prune's database role: exactly what lambda_writer/prune.py does, nothing more.
-- Its login: the pruner function connects to the instance directly with this role's password,
-- which the deploy-time migration sets from the pruner's own secret (only when the stack has a
-- scheduled prune; until then the role has no password and no password login succeeds).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ckpt_pruner') THEN
        CREATE ROLE ckpt_pruner LOGIN CONNECTION LIMIT 2;
    END IF;
END
$$;

-- A chunk waits for the writers of its checkpoints (their batches: seconds); the timeouts bound
-- a stuck run well inside the function's own timeout (ckpt_contract.deployment.PRUNER_TIMEOUT_S).
ALTER ROLE ckpt_pruner SET statement_timeout = '60s';
ALTER ROLE ckpt_pruner SET lock_timeout = '30s';
ALTER ROLE ckpt_pruner SET idle_in_transaction_session_timeout = '60s';

GRANT USAGE ON SCHEMA public TO ckpt_pruner;
-- The plan's reads (lambda_writer/prune_reads.py; ckpt_checkpoint_values for --keep-best).
GRANT SELECT ON training_checkpoints, training_checkpoint_shards, training_checkpoint_progress
    TO ckpt_pruner;
GRANT EXECUTE ON FUNCTION ckpt_checkpoint_values(text, text) TO ckpt_pruner;
-- SELECT ... FOR SHARE on the kept rows needs UPDATE on one column of the table
-- (https://www.postgresql.org/docs/current/sql-select.html#SQL-FOR-UPDATE-SHARE); one
-- bookkeeping column, so the grant changes no checkpoint's meaning.
GRANT UPDATE (updated_at) ON training_checkpoints TO ckpt_pruner;
-- The removal functions run as the caller (SECURITY INVOKER): their deletes and tombstones.
-- The count rows go by ON DELETE CASCADE, which PostgreSQL runs as the tables' owner.
GRANT DELETE ON training_checkpoints, training_checkpoint_shards TO ckpt_pruner;
GRANT SELECT, INSERT, UPDATE ON training_checkpoint_tombstones TO ckpt_pruner;
GRANT EXECUTE ON FUNCTION ckpt_lock_checkpoints_for_prune(text, bigint[]) TO ckpt_pruner;
GRANT EXECUTE ON FUNCTION ckpt_remove_checkpoints(text, json) TO ckpt_pruner;
GRANT EXECUTE ON FUNCTION ckpt_remove_superseded(text, json) TO ckpt_pruner;
