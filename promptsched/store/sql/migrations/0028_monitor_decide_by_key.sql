-- monitor_decide (0021_monitor_decide.sql) reaches each run by primary key and by nothing
-- else, whatever the statistics say, as the finish that calls it does (run_finish_many,
-- docs/performance.md "Plans that stay right"). Its join on `id`, `attempt_id` and
-- `status = 'running'` read every unfinished run under statistics taken before a burst
-- (15,400 index entries for a batch of 10 at 2,500 runs in flight, 25,400 at 7,500), once
-- per finish of a `changed` monitor. Otherwise as in 0021.
CREATE OR REPLACE FUNCTION monitor_decide(run_ids bigint[], attempt_ids uuid[], watches jsonb[],
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
        JOIN runs r
          ON r.id = ANY (ARRAY[u.run_id])
         AND CASE WHEN r.status = 'running' THEN r.attempt_id END
             IS NOT DISTINCT FROM u.attempt_id
        WHERE u.attempt_id IS NOT NULL
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
