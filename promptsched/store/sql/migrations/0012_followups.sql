-- Follow-ups (docs/followups.md): keyed one-shots an application places at its own event ("if
-- order 4711 has not shipped in 24 h, ..."). A follow-up is a schedule of kind `at` with a
-- `followup_key` (unique per owner) and `vars` (its template variables); the first check is
-- that schedule's one slot, fired by the scheduler like any other due schedule. A check that
-- ends with "check again at/in X" gets the next check written by the statement that finishes
-- it (a run of origin `check`, pending until X), bounded by max_checks and the horizon.
-- Every check's decision is a row of followup_checks; escalation steps owe an `escalation`
-- notification to their own targets, once per step.

ALTER TABLE schedules
    ADD COLUMN vars jsonb CONSTRAINT schedules_vars_is_object
        CHECK (vars IS NULL OR jsonb_typeof(vars) = 'object'),
    ADD COLUMN followup_key text;
CREATE UNIQUE INDEX schedules_followup_key ON schedules (owner, followup_key)
    WHERE followup_key IS NOT NULL;

ALTER TABLE runs DROP CONSTRAINT runs_origin_check;
ALTER TABLE runs ADD CONSTRAINT runs_origin_check
    CHECK (origin IN ('cadence', 'manual', 'backfill', 'replay', 'check'));

ALTER TABLE outbox DROP CONSTRAINT outbox_event_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_check
    CHECK (event IN ('succeeded', 'dead', 'paused', 'digest', 'budget', 'escalation'));

CREATE TABLE followups (
    schedule_id  bigint      PRIMARY KEY REFERENCES schedules (id) ON DELETE CASCADE,
    owner        text        NOT NULL,
    key          text        NOT NULL,
    -- the create request as stored, for telling an idempotent repeat from a different body
    request      jsonb       NOT NULL,
    due_at       timestamptz NOT NULL,
    max_checks   integer     NOT NULL CHECK (max_checks BETWEEN 1 AND 1000),
    horizon      timestamptz NOT NULL,
    -- [{"after_checks": N, "notify": {...}}]: the targets are read from here when sent
    escalate     jsonb       NOT NULL DEFAULT '[]'::jsonb,
    checks       integer     NOT NULL DEFAULT 0,
    -- active | done (a check decided so) | ended (a guard stopped it: ended_reason) | cancelled
    state        text        NOT NULL DEFAULT 'active'
                             CHECK (state IN ('active', 'done', 'ended', 'cancelled')),
    ended_reason text,
    cancelled_by text,
    cancelled_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX followups_owner_key ON followups (owner, key);
-- Retention walks the follow-ups that ended, oldest first.
CREATE INDEX followups_ended_idx ON followups (updated_at) WHERE state <> 'active';

-- One row per finished check: its run, its number, what it decided and what came of it.
CREATE TABLE followup_checks (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id bigint      NOT NULL REFERENCES followups (schedule_id) ON DELETE CASCADE,
    run_id      bigint      REFERENCES runs (id) ON DELETE SET NULL,
    number      integer     NOT NULL,
    status      text        NOT NULL,          -- the run's final status
    decision    jsonb,                         -- what the check answered (NULL: no answer)
    outcome     text        NOT NULL,          -- recheck | done | max_checks | horizon | past | failed | cancelled
    next_at     timestamptz,                   -- the next check, for outcome recheck
    escalated   integer[]   NOT NULL DEFAULT '{}',  -- the escalation steps this check owed
    at          timestamptz NOT NULL
);
CREATE INDEX followup_checks_schedule_idx ON followup_checks (schedule_id, id);

-- Record how follow-up checks ended, from the statement that finishes their runs
-- (run_finish_many): per run, its schedule, final status and the decision the worker read
-- (NULL unless it succeeded with one): {"recheck_at": ISO} or {"recheck_in": "seconds"}.
-- A recheck within max_checks and the horizon writes the next check as a pending run of
-- origin `check` available at that instant; anything else ends the follow-up with its
-- reason. Escalation steps whose after_checks equals this check's number, when it did not
-- resolve the follow-up, owe an `escalation` notification to each of their targets, once
-- (the key names the follow-up and the step). Returns how many notifications it owed.
CREATE FUNCTION followup_record(run_ids bigint[], schedule_ids bigint[], statuses text[],
                                decisions jsonb[], at timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    item record;
    f followups%ROWTYPE;
    number integer;
    next_at timestamptz;
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
        next_at := NULL;
        IF item.status = 'succeeded' AND item.decision IS NOT NULL THEN
            next_at := coalesce((item.decision ->> 'recheck_at')::timestamptz,
                                at + make_interval(secs => (item.decision ->> 'recheck_in')::float8));
        END IF;
        outcome := CASE
            WHEN item.status = 'dead' THEN 'failed'
            WHEN item.status = 'cancelled' THEN 'cancelled'
            WHEN item.status <> 'succeeded' THEN item.status
            WHEN next_at IS NULL THEN 'done'
            WHEN next_at < at THEN 'past'
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

-- The channels of a notify object, as notify_channels lists a schedule's (0008).
CREATE FUNCTION notify_targets_of(notify jsonb)
RETURNS TABLE (channel text, target jsonb)
LANGUAGE sql IMMUTABLE AS $$
    SELECT c.channel, c.target
    FROM (VALUES
        ('email',
         CASE WHEN jsonb_typeof(notify -> 'email') = 'array'
                   AND jsonb_array_length(notify -> 'email') > 0
              THEN notify -> 'email' END),
        ('webhook',
         CASE WHEN jsonb_typeof(notify -> 'webhook') = 'object'
                   AND jsonb_typeof(notify -> 'webhook' -> 'url') = 'string'
              THEN (notify -> 'webhook') - 'secret' END),
        ('slack',
         CASE WHEN jsonb_typeof(notify -> 'slack' -> 'url') = 'string'
              THEN jsonb_build_object('host', coalesce(
                  substring(notify -> 'slack' ->> 'url' FROM '^[a-z]+://([^/:?#]+)'), '?')) END),
        ('discord',
         CASE WHEN jsonb_typeof(notify -> 'discord' -> 'url') = 'string'
              THEN jsonb_build_object('host', coalesce(
                  substring(notify -> 'discord' ->> 'url' FROM '^[a-z]+://([^/:?#]+)'), '?')) END),
        ('ntfy',
         CASE WHEN jsonb_typeof(notify -> 'ntfy' -> 'url') = 'string'
              THEN jsonb_build_object('host', coalesce(
                  substring(notify -> 'ntfy' ->> 'url' FROM '^[a-z]+://([^/:?#]+)'), '?')) END)
    ) AS c (channel, target)
    WHERE c.target IS NOT NULL
$$;
