-- Monitors: a `changed` schedule's notification decision is made in the statement that
-- finishes its run (run_finish_many), once, against the schedule's memory: the fingerprint of
-- the last output it decided was new, and that run. Replicas finishing runs of one schedule at
-- the same moment take their turn on a per-schedule lock, so each compares with the one
-- before it: no double "changed", no lost one (docs/monitors.md).
CREATE TABLE monitor_memory (
    schedule_id bigint PRIMARY KEY REFERENCES schedules (id) ON DELETE CASCADE,
    run_id      bigint NOT NULL,          -- the success whose output the fingerprint is of
    fingerprint text   NOT NULL,          -- monitor/changes.py: normalised text or canonical JSON
    updated_at  timestamptz NOT NULL
);

-- The decisions of a batch's `changed` runs, before the finish updates them: each run whose
-- attempt is still sched is locked (so the finish's own guard meets the same row), the
-- schedules taken one at a time in id order under a transaction lock of their own, and each
-- run compared with the memory (or with the run before it in the batch), which the new
-- outputs then replace. A key lookup per run and one per schedule, whatever the table sizes.
-- `watches` holds {"fingerprint": ..., "what": "output" | a JSON Pointer} per run.
CREATE FUNCTION monitor_decide(run_ids bigint[], attempt_ids uuid[], watches jsonb[],
                               at timestamptz)
RETURNS TABLE (id bigint, decision jsonb)
LANGUAGE plpgsql
AS $$
DECLARE
    item record;
    sched bigint;
    last_run bigint;
    last_fp text;
    dirty boolean := false;
    what text;
BEGIN
    IF run_ids IS NULL OR cardinality(run_ids) = 0 THEN
        RETURN;
    END IF;
    FOR item IN
        SELECT u.run_id, r.schedule_id, u.watch
        FROM unnest(run_ids, attempt_ids, watches) AS u (run_id, attempt_id, watch)
        JOIN runs r ON r.id = u.run_id AND r.attempt_id = u.attempt_id AND r.status = 'running'
        ORDER BY r.schedule_id, u.run_id
        FOR UPDATE OF r
    LOOP
        IF sched IS DISTINCT FROM item.schedule_id THEN
            IF dirty THEN
                PERFORM monitor_remember(sched, last_run, last_fp, at);
            END IF;
            sched := item.schedule_id;
            PERFORM pg_advisory_xact_lock(hashtextextended('promptsched.monitor:' || sched, 0));
            SELECT m.run_id, m.fingerprint INTO last_run, last_fp
            FROM monitor_memory m WHERE m.schedule_id = sched;
            IF NOT FOUND THEN
                last_run := NULL;
                last_fp := NULL;
            END IF;
            dirty := false;
        END IF;
        what := coalesce(item.watch ->> 'what', 'output');
        id := item.run_id;
        IF last_fp IS NULL THEN
            decision := jsonb_build_object('notify', true, 'when', 'changed',
                'reason', format('first %s: nothing to compare with', what));
        ELSIF last_fp = item.watch ->> 'fingerprint' THEN
            decision := jsonb_build_object('notify', false, 'when', 'changed', 'since', last_run,
                'reason', format('%s unchanged since run %s', what, last_run));
        ELSE
            decision := jsonb_build_object('notify', true, 'when', 'changed', 'since', last_run,
                'reason', format('%s changed since run %s', what, last_run));
        END IF;
        IF (decision ->> 'notify')::boolean THEN
            last_run := item.run_id;
            last_fp := item.watch ->> 'fingerprint';
            dirty := true;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF dirty THEN
        PERFORM monitor_remember(sched, last_run, last_fp, at);
    END IF;
END
$$;

CREATE FUNCTION monitor_remember(p_schedule bigint, p_run bigint, p_fingerprint text,
                                 at timestamptz)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO monitor_memory (schedule_id, run_id, fingerprint, updated_at)
    VALUES (p_schedule, p_run, p_fingerprint, at)
    ON CONFLICT (schedule_id) DO UPDATE
    SET run_id = excluded.run_id, fingerprint = excluded.fingerprint,
        updated_at = excluded.updated_at
$$;

-- What a finish owes, now also per run's decision: a success whose decision says not to notify
-- owes nothing to its success targets, and one that notifies carries its decision (why, and
-- the run it was compared with) to the message. Failures owe as before.
DROP FUNCTION outbox_owe(bigint[], bigint[], text[], timestamptz);
CREATE FUNCTION outbox_owe(run_ids bigint[], schedule_ids bigint[], statuses text[],
                           at timestamptz, decisions jsonb[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    written integer;
BEGIN
    WITH channels AS MATERIALIZED (
        SELECT c.*
        FROM notify_channels c
        WHERE c.schedule_id = ANY (ARRAY(
            SELECT s.id FROM schedules s
            WHERE s.id = ANY (schedule_ids) AND s.notify <> '{}'::jsonb))
    )
    INSERT INTO outbox (run_id, schedule_id, channel, target, event, idempotency_key, details,
                        available_at, created_at)
    SELECT f.id, f.schedule_id, c.channel, c.target, f.status,
           format('promptsched-%s-%s-%s', f.id, f.status, c.channel),
           CASE WHEN f.status = 'succeeded' THEN f.decision END, at, at
    FROM unnest(run_ids, schedule_ids, statuses, decisions) AS f (id, schedule_id, status, decision)
    JOIN channels c ON c.schedule_id = f.schedule_id
    WHERE (f.status = 'succeeded' AND c.on_success
           AND coalesce((f.decision ->> 'notify')::boolean, true))
       OR (f.status = 'dead' AND c.on_failure)
    ON CONFLICT (idempotency_key) DO NOTHING;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;
