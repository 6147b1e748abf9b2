-- Launches: every run_attempt of a job belongs to one launch, and a shard of another launch is
-- never stored under it.
--
-- Why (issue 40): a Spot relaunch is a new torchrun whose TORCHELASTIC_RESTART_COUNT is 0 again.
-- Before the client numbered launches, launch 2 reported attempt 0 like launch 1, so a step that
-- launch 1 left half-saved (rank 0's row) was completed by launch 2's rank 1: one "complete"
-- checkpoint from two trainings. The client now numbers every launch above every earlier one
-- (trainer_client/launch.py) and sends its launch id in every report (ckpt.v1's optional
-- launch_id, stored in the shard row's extra); this table makes the rule the writer's own,
-- whatever a client does: the first report of (job, run_attempt) claims the attempt for its
-- launch, and a report of that attempt from another launch raises SQLSTATE 23C01 (an integrity
-- error: the writer parks it in the DLQ with the reason, docs/DESIGN.md "Launches").
--
-- Reports without a launch_id (clients before this release, the demo's direct-write baseline)
-- claim nothing and are checked against nothing, as before. Cost: one index probe per shard row
-- the writer proposes (and one insert per new attempt), in the writer's own statement.

CREATE TABLE training_job_launches (
    job_id        text        NOT NULL,
    run_attempt   integer     NOT NULL,
    launch_id     text        NOT NULL,
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, run_attempt)
);

CREATE FUNCTION ckpt_claim_launch() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    proposed text := NEW.extra ->> 'launch_id';
    claimed  text;
BEGIN
    SELECT launch_id INTO claimed FROM training_job_launches
    WHERE job_id = NEW.job_id AND run_attempt = NEW.run_attempt;
    IF claimed IS NULL THEN
        -- Two writers claiming at once: the second waits for the first's commit, does nothing,
        -- and its next statement (a new snapshot under READ COMMITTED) reads the winner.
        INSERT INTO training_job_launches (job_id, run_attempt, launch_id)
        VALUES (NEW.job_id, NEW.run_attempt, proposed)
        ON CONFLICT DO NOTHING;
        SELECT launch_id INTO claimed FROM training_job_launches
        WHERE job_id = NEW.job_id AND run_attempt = NEW.run_attempt;
    END IF;
    IF claimed IS DISTINCT FROM proposed THEN
        RAISE EXCEPTION 'launch conflict: job % run_attempt % belongs to launch %, this report '
                        '(step %, rank %) is of launch %', NEW.job_id, NEW.run_attempt, claimed,
                        NEW.step, NEW.rank, proposed
            USING ERRCODE = '23C01',
                  HINT = 'two launches reported one run_attempt: a relaunch numbers its attempt '
                         'in the restart call (resume(reporter)); replaying this report cannot '
                         'make it applicable';
    END IF;
    RETURN NEW;
END
$fn$;

-- BEFORE INSERT fires for every row an INSERT ... ON CONFLICT proposes, whether it then inserts,
-- updates or does nothing: a replay of an older attempt is checked too.
CREATE TRIGGER training_checkpoint_shards_launch
    BEFORE INSERT ON training_checkpoint_shards
    FOR EACH ROW WHEN (NEW.extra ? 'launch_id')
    EXECUTE FUNCTION ckpt_claim_launch();

GRANT SELECT, INSERT ON training_job_launches TO ckpt_writer;
-- Whoever may read `source` may read `target` (each role holding SELECT on it, or PUBLIC): the
-- grant 0010, 0012 and 0013 each wrote out as a DO block, one function from this migration on.
CREATE FUNCTION ckpt_grant_select_like(source regclass, target regclass) RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = source AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
    LOOP
        IF grantee = 0 THEN
            EXECUTE format('GRANT SELECT ON %s TO PUBLIC', target);
        ELSE
            EXECUTE format('GRANT SELECT ON %s TO %I', target,
                           (SELECT rolname FROM pg_roles WHERE oid = grantee));
        END IF;
    END LOOP;
END
$fn$;
REVOKE ALL ON FUNCTION ckpt_grant_select_like(regclass, regclass) FROM PUBLIC;

-- Whoever may read the checkpoint rows may read the launches: the restart numbers the next
-- launch from them (trainer_client/launch.py).
SELECT ckpt_grant_select_like('training_checkpoints', 'training_job_launches');
