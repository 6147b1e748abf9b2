-- Restart records (ckpt.restart.v1, ckpt_contract/restart.py): one row per launch that made the
-- restart call, sent by its rank 0 through the queue like every report (a rank never writes the
-- database). What it resumed from, every newer candidate it passed over and why, what it waited
-- for, what it cost; `ckpt-pipeline restarts` and `status` read it, the restart's loop check too
-- (docs/DESIGN.md, "Restart records").
--
-- Idempotent like every write: a re-sent or replayed record is the same row (ON CONFLICT DO
-- NOTHING on its identity, the launch). Additive: the previous writer never reads it, and sends
-- a record it cannot decode to the DLQ, from which a replay after the upgrade applies it.

CREATE TABLE training_job_restarts (
    job_id                 text             NOT NULL,
    run_attempt            integer          NOT NULL,
    launch_id              text             NOT NULL DEFAULT '',
    world_size             integer          NOT NULL,
    resumed_step           bigint,
    resumed_run_attempt    integer,
    resumed_world_size     integer,
    skipped                jsonb            NOT NULL DEFAULT '[]'::jsonb,
    skipped_total          bigint           NOT NULL DEFAULT 0,
    waited_reports         bigint           NOT NULL DEFAULT 0,
    unwritten_reports      bigint           NOT NULL DEFAULT 0,
    unsent_reports         bigint           NOT NULL DEFAULT 0,
    deadline_cut           boolean          NOT NULL DEFAULT false,
    decided_s              double precision NOT NULL,
    restored_s             double precision,
    fetched_bytes          bigint           NOT NULL DEFAULT 0,
    max_node_fetched_bytes bigint           NOT NULL DEFAULT 0,
    nodes_fetched          bigint           NOT NULL DEFAULT 0,
    source                 text,
    newest_saved_step      bigint,
    -- Restarts before this one that resumed from the same step in a row, and how many in a row
    -- the client calls a loop (the RestartLoops metric).
    loop_restarts          bigint           NOT NULL DEFAULT 0,
    loop_after             integer          NOT NULL DEFAULT 3,
    restarted_at           timestamptz      NOT NULL,
    recorded_at            timestamptz      NOT NULL DEFAULT now(),
    sqs_message_id         text             NOT NULL,
    PRIMARY KEY (job_id, run_attempt, launch_id)
);
CREATE INDEX training_job_restarts_by_time ON training_job_restarts (job_id, restarted_at DESC);

GRANT SELECT, INSERT ON training_job_restarts TO ckpt_writer;
-- Whoever may read the checkpoint rows may read the restarts (status, the restart's loop check).
SELECT ckpt_grant_select_like('training_checkpoints', 'training_job_restarts');
