-- Checkpoint metadata: one row per checkpoint (job, step), one per shard (job, step, rank).
-- Writes are idempotent and monotonic in run_attempt; see lambda_writer/repository.py.

CREATE TABLE training_checkpoints (
    job_id            text        NOT NULL,
    step              bigint      NOT NULL CHECK (step >= 0),
    epoch             bigint      NOT NULL CHECK (epoch >= 0),
    -- The newest run attempt seen for this step; only its shards count towards completeness.
    run_attempt       integer     NOT NULL CHECK (run_attempt >= 0),
    world_size        integer     NOT NULL CHECK (world_size BETWEEN 1 AND 1000000),
    shards_present    integer     NOT NULL DEFAULT 0 CHECK (shards_present >= 0),
    is_complete       boolean     NOT NULL DEFAULT false,
    first_reported_at timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    completed_at      timestamptz,
    PRIMARY KEY (job_id, step)
);

CREATE TABLE training_checkpoint_shards (
    job_id         text             NOT NULL,
    step           bigint           NOT NULL,
    rank           integer          NOT NULL CHECK (rank >= 0),
    run_attempt    integer          NOT NULL CHECK (run_attempt >= 0),
    epoch          bigint           NOT NULL CHECK (epoch >= 0),
    world_size     integer          NOT NULL CHECK (world_size BETWEEN 1 AND 1000000),
    uri            text             NOT NULL,
    loss           double precision,
    metrics        jsonb            NOT NULL DEFAULT '{}'::jsonb,
    size_bytes     bigint,
    sha256         text,
    -- Fields a newer client sent that this schema does not know yet.
    extra          jsonb            NOT NULL DEFAULT '{}'::jsonb,
    sqs_message_id text,
    reported_at    timestamptz      NOT NULL,
    written_at     timestamptz      NOT NULL DEFAULT now(),
    updated_at     timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step, rank),
    FOREIGN KEY (job_id, step) REFERENCES training_checkpoints (job_id, step) ON DELETE CASCADE,
    CHECK (rank < world_size)
);

-- Completeness recount after each batch: shards of (job, step, run_attempt).
CREATE INDEX training_checkpoint_shards_attempt_idx
    ON training_checkpoint_shards (job_id, step, run_attempt);

-- "Latest complete checkpoint of job X": an index-only walk down the newest complete steps.
CREATE INDEX training_checkpoints_latest_complete_idx
    ON training_checkpoints (job_id, step DESC) WHERE is_complete;

CREATE VIEW latest_complete_checkpoints AS
SELECT DISTINCT ON (job_id)
       job_id, step, epoch, run_attempt, world_size, shards_present, completed_at, updated_at
FROM training_checkpoints
WHERE is_complete
ORDER BY job_id, step DESC;
