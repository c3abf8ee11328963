-- A follow-up's resolution applies to every check, not only the first (docs/followups.md):
-- the follow-up keeps its resolution, and followup_record rounds the next check's instant up
-- to a multiple of it (from the Unix epoch), as the first check's was rounded when it was
-- placed. The horizon guard judges the rounded instant (the one the check would run at); the
-- past guard judges the instant as answered. A recheck that could not be read (the worker
-- records {"error": ...}) ends the follow-up with reason `invalid` instead of being cast.

ALTER TABLE followups
    ADD COLUMN resolution interval CONSTRAINT followups_resolution_check
        CHECK (resolution IS NULL
               OR resolution BETWEEN interval '1 second' AND interval '1 day');

-- The follow-ups placed before this migration kept their resolution only in the request as
-- sent: a duration as durations.py reads it (`15m`, `1h30m`, `500ms`; a bare number: seconds),
-- checked when it was placed.
UPDATE followups f
SET resolution = (
    SELECT make_interval(secs => sum(m[1]::float8 * CASE coalesce(m[2], 's')
        WHEN 'ms' THEN 0.001 WHEN 's' THEN 1 WHEN 'm' THEN 60 WHEN 'h' THEN 3600
        WHEN 'd' THEN 86400 WHEN 'w' THEN 604800 END))
    FROM regexp_matches(f.request ->> 'resolution', '(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?', 'g')
         AS m)
WHERE f.request ->> 'resolution' IS NOT NULL;

-- As in 0012_followups.sql, with the next check rounded up to the follow-up's resolution and
-- an unreadable recheck recorded as `invalid`.
CREATE OR REPLACE FUNCTION followup_record(run_ids bigint[], schedule_ids bigint[],
                                           statuses text[], decisions jsonb[], at timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    item record;
    f followups%ROWTYPE;
    number integer;
    asked timestamptz;
    next_at timestamptz;
    step numeric;
    outcome text;
    steps integer[];
    owed integer := 0;
    written integer;
BEGIN
    IF run_ids IS NULL THEN
        RETURN 0;
    END IF;
    FOR item IN
        SELECT * FROM unnest(run_ids, schedule_ids, statuses, decisions)
                      AS u (run_id, schedule_id, status, decision)
    LOOP
        SELECT * INTO f FROM followups WHERE schedule_id = item.schedule_id FOR UPDATE;
        IF NOT FOUND OR f.state <> 'active' THEN
            CONTINUE;
        END IF;
        number := f.checks + 1;
        asked := NULL;
        next_at := NULL;
        IF item.status = 'succeeded' AND item.decision IS NOT NULL
           AND NOT item.decision ? 'error' THEN
            asked := coalesce((item.decision ->> 'recheck_at')::timestamptz,
                              at + make_interval(secs => (item.decision ->> 'recheck_in')::float8));
            next_at := asked;
            IF f.resolution IS NOT NULL THEN
                -- Up to the next multiple of the resolution (an instant on one stays).
                step := extract(epoch FROM f.resolution);
                next_at := to_timestamp((ceil(extract(epoch FROM asked) / step) * step)::float8);
            END IF;
        END IF;
        outcome := CASE
            WHEN item.status = 'dead' THEN 'failed'
            WHEN item.status = 'cancelled' THEN 'cancelled'
            WHEN item.status <> 'succeeded' THEN item.status
            WHEN item.decision ? 'error' THEN 'invalid'
            WHEN next_at IS NULL THEN 'done'
            WHEN asked < at THEN 'past'
            WHEN next_at > f.horizon THEN 'horizon'
            WHEN number >= f.max_checks THEN 'max_checks'
            ELSE 'recheck' END;
        -- Escalation: this check left the follow-up unresolved (it asked for another one).
        steps := '{}';
        IF item.status = 'succeeded' AND next_at IS NOT NULL THEN
            SELECT coalesce(array_agg(s.ordinality::integer - 1), '{}') INTO steps
            FROM jsonb_array_elements(f.escalate) WITH ORDINALITY AS s (step, ordinality)
            WHERE (s.step ->> 'after_checks')::integer = number;
        END IF;
        IF outcome = 'recheck' THEN
            INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at,
                              created_at)
            SELECT s.id, next_at, 'check', s.provider, s.max_attempts, next_at, at
            FROM schedules s WHERE s.id = item.schedule_id;
        END IF;
        INSERT INTO followup_checks (schedule_id, run_id, number, status, decision, outcome,
                                     next_at, escalated, at)
        VALUES (item.schedule_id, item.run_id, number, item.status, item.decision, outcome,
                next_at, steps, at);
        UPDATE followups
        SET checks = number,
            state = CASE WHEN outcome = 'recheck' THEN 'active'
                         WHEN outcome = 'done' THEN 'done' ELSE 'ended' END,
            ended_reason = CASE WHEN outcome IN ('recheck', 'done') THEN NULL ELSE outcome END,
            updated_at = at
        WHERE schedule_id = item.schedule_id;
        IF cardinality(steps) > 0 THEN
            INSERT INTO outbox (run_id, schedule_id, channel, target, event, idempotency_key,
                                details, available_at, created_at)
            SELECT item.run_id, item.schedule_id, c.channel, c.target, 'escalation',
                   format('promptsched-escalation-%s-%s-%s', item.schedule_id, st.step,
                          c.channel),
                   jsonb_build_object('step', st.step, 'after_checks', number,
                                      'key', f.key, 'decision', item.decision),
                   at, at
            FROM unnest(steps) AS st (step)
            CROSS JOIN LATERAL notify_targets_of(f.escalate -> st.step -> 'notify') AS c
            ON CONFLICT (idempotency_key) DO NOTHING;
            GET DIAGNOSTICS written = ROW_COUNT;
            owed := owed + written;
        END IF;
    END LOOP;
    RETURN owed;
END
$$;
