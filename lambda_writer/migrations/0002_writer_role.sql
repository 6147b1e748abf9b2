-- The writer's database role. Timeouts are role settings because RDS Proxy rejects the
-- `options` startup parameter and a session-level SET would pin the client to one connection
-- (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-pinning.html).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ckpt_writer') THEN
        CREATE ROLE ckpt_writer LOGIN;
    END IF;
    -- Deliberately NOT granted rds_iam: clients authenticate to RDS Proxy with IAM tokens, and
    -- the proxy logs in to PostgreSQL with this role's password from Secrets Manager. On RDS a
    -- member of rds_iam can only log in with IAM, which would lock the proxy out.
END
$$;

ALTER ROLE ckpt_writer SET statement_timeout = '10s';
ALTER ROLE ckpt_writer SET lock_timeout = '5s';
ALTER ROLE ckpt_writer SET idle_in_transaction_session_timeout = '60s';

GRANT USAGE ON SCHEMA public TO ckpt_writer;
GRANT SELECT, INSERT, UPDATE ON training_checkpoints, training_checkpoint_shards TO ckpt_writer;
GRANT SELECT ON latest_complete_checkpoints TO ckpt_writer;
