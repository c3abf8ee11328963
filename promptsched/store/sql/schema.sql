CREATE FUNCTION public.budget_notice_of(p_reached jsonb, p_scope text, p_scope_id text, p_day_start timestamp with time zone, p_month_start timestamp with time zone) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT p_reached || jsonb_build_object(
        'scope', p_scope,
        'period_start', s.start,
        'key', format('%s-%s-%s-%s', p_scope, p_scope_id, p_reached ->> 'period',
                      to_char(s.start AT TIME ZONE 'UTC', 'YYYY-MM-DD')))
    FROM (SELECT CASE WHEN p_reached ->> 'period' = 'day' THEN p_day_start
                      ELSE p_month_start END AS start) s
$$;
CREATE FUNCTION public.budget_owe(run_ids bigint[], schedule_ids bigint[], notices jsonb[], at timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    written integer;
BEGIN
    IF run_ids IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO outbox (run_id, schedule_id, channel, target, event, idempotency_key, details,
                        available_at, created_at)
    SELECT f.id, f.schedule_id, c.channel, c.target, 'budget',
           format('promptsched-budget-%s-%s', f.notice ->> 'key', c.channel), f.notice, at, at
    FROM unnest(run_ids, schedule_ids, notices) AS f (id, schedule_id, notice)
    JOIN notify_channels c ON c.schedule_id = f.schedule_id AND c.on_failure
    ON CONFLICT (idempotency_key) DO NOTHING;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;
CREATE FUNCTION public.budget_reached(p_budget jsonb, p_day_tokens bigint, p_day_cost double precision, p_month_tokens bigint, p_month_cost double precision) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT jsonb_build_object('period', l.period, 'unit', l.unit, 'limit', l.lim,
                              'spent', l.spent)
    FROM (VALUES
        (1, 'day', 'tokens', (p_budget ->> 'tokens_per_day')::float8, p_day_tokens::float8),
        (2, 'day', 'cost', (p_budget ->> 'cost_per_day')::float8, p_day_cost),
        (3, 'month', 'tokens', (p_budget ->> 'tokens_per_month')::float8, p_month_tokens::float8),
        (4, 'month', 'cost', (p_budget ->> 'cost_per_month')::float8, p_month_cost)
    ) AS l (n, period, unit, lim, spent)
    WHERE l.lim IS NOT NULL AND l.spent >= l.lim
    ORDER BY l.n
    LIMIT 1
$$;
CREATE FUNCTION public.budget_verdict(p_schedule bigint, p_owner text, p_budget jsonb, p_now timestamp with time zone) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    utc timestamp := p_now AT TIME ZONE 'UTC';
    day_start timestamptz := date_trunc('day', utc) AT TIME ZONE 'UTC';
    month_start timestamptz := date_trunc('month', utc) AT TIME ZONE 'UTC';
    owner_budget jsonb;
    reached jsonb;
    spend record;
BEGIN
    IF p_budget IS NOT NULL AND p_budget <> '{}'::jsonb THEN
        SELECT coalesce(sum(r.tokens) FILTER (WHERE r.slot >= day_start), 0)::bigint AS dt,
               coalesce(sum(r.cost) FILTER (WHERE r.slot >= day_start), 0)::float8 AS dc,
               coalesce(sum(r.tokens), 0)::bigint AS mt,
               coalesce(sum(r.cost), 0)::float8 AS mc
        INTO spend
        FROM runs r
        WHERE r.schedule_id = p_schedule AND r.slot >= month_start
          AND r.slot < month_start + interval '1 month';
        reached := budget_reached(p_budget, spend.dt, spend.dc, spend.mt, spend.mc);
        IF reached IS NOT NULL THEN
            RETURN budget_notice_of(reached, 'schedule', p_schedule::text, day_start,
                                    month_start);
        END IF;
    END IF;
    SELECT ob.budget INTO owner_budget FROM owner_budgets ob WHERE ob.owner = p_owner;
    IF owner_budget IS NOT NULL AND owner_budget <> '{}'::jsonb THEN
        SELECT coalesce(sum(r.tokens) FILTER (WHERE r.slot >= day_start), 0)::bigint AS dt,
               coalesce(sum(r.cost) FILTER (WHERE r.slot >= day_start), 0)::float8 AS dc,
               coalesce(sum(r.tokens), 0)::bigint AS mt,
               coalesce(sum(r.cost), 0)::float8 AS mc
        INTO spend
        FROM schedules s
        JOIN runs r ON r.schedule_id = s.id AND r.slot >= month_start
                   AND r.slot < month_start + interval '1 month'
        WHERE s.owner = p_owner;
        reached := budget_reached(owner_budget, spend.dt, spend.dc, spend.mt, spend.mc);
        IF reached IS NOT NULL THEN
            RETURN budget_notice_of(reached, 'owner', md5(p_owner), day_start, month_start);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
CREATE FUNCTION public.followup_record(run_ids bigint[], schedule_ids bigint[], statuses text[], decisions jsonb[], at timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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
CREATE FUNCTION public.monitor_decide(run_ids bigint[], attempt_ids uuid[], watches jsonb[], at timestamp with time zone) RETURNS TABLE(id bigint, decision jsonb)
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
CREATE FUNCTION public.monitor_remember(p_schedule bigint, p_run bigint, p_fingerprint text, at timestamp with time zone) RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO monitor_memory (schedule_id, run_id, fingerprint, updated_at)
    VALUES (p_schedule, p_run, p_fingerprint, at)
    ON CONFLICT (schedule_id) DO UPDATE
    SET run_id = excluded.run_id, fingerprint = excluded.fingerprint,
        updated_at = excluded.updated_at
$$;
CREATE FUNCTION public.notify_targets_of(notify jsonb) RETURNS TABLE(channel text, target jsonb)
    LANGUAGE sql IMMUTABLE
    AS $$
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
CREATE FUNCTION public.outbox_owe(run_ids bigint[], schedule_ids bigint[], statuses text[], at timestamp with time zone, decisions jsonb[] DEFAULT NULL::jsonb[]) RETURNS integer
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
CREATE FUNCTION public.provider_admit(p_provider text, p_want integer, p_max integer, p_rate double precision, p_burst double precision, p_tpm double precision, p_now timestamp with time zone, p_returned bigint[] DEFAULT NULL::bigint[], p_returned_attempts uuid[] DEFAULT NULL::uuid[]) RETURNS TABLE(allowed integer, tokens double precision, running integer, open_for double precision, half_open boolean, failures integer, llm_tokens double precision, paced_for double precision, ramp double precision, rate double precision)
    LANGUAGE plpgsql
    AS $$
DECLARE
    b provider_buckets%ROWTYPE;
    now_ timestamptz := coalesce(p_now, clock_timestamp());
    burst double precision;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('promptsched.provider:' || p_provider, 0));
    running := provider_running_count(p_provider);
    -- Less the claimer's runs whose call has returned: counted after the running runs, so a
    -- final write that commits in between is counted once (as running) and never discounted
    -- twice. By primary key, the claimer's batch only; the attempt must still be the one the
    -- claimer made (a run reaped and claimed again elsewhere is that other call).
    IF p_returned IS NOT NULL THEN
        running := running - (
            SELECT count(*)::integer
            FROM unnest(p_returned, p_returned_attempts) AS f(id, attempt_id)
            JOIN runs r ON r.id = ANY (ARRAY[f.id])
            WHERE CASE WHEN r.status = 'running' AND r.provider = p_provider
                       THEN r.attempt_id = f.attempt_id ELSE false END);
    END IF;
    SELECT * INTO b FROM provider_buckets pb WHERE pb.provider = p_provider;
    failures := coalesce(b.failures, 0);
    open_for := greatest(0.0, coalesce(extract(epoch FROM b.open_until - now_), 0.0));
    half_open := b.open_until IS NOT NULL AND b.open_until <= now_;
    paced_for := greatest(0.0, coalesce(extract(epoch FROM b.paced_until - now_), 0.0));
    ramp := b.ramp;
    -- The learned rate paces evenly (a bucket of one request); a configured rate, its burst.
    rate := provider_learned_rate(b.allowance, b.window_seconds, b.learned_at, now_);
    burst := CASE WHEN rate IS NULL THEN p_burst ELSE 1 END;
    rate := CASE WHEN rate IS NULL THEN p_rate ELSE least(coalesce(p_rate, rate), rate) END;
    tokens := CASE WHEN rate IS NULL THEN NULL
                   WHEN b.tokens IS NULL THEN burst
                   ELSE least(burst, b.tokens + rate * greatest(0.0,
                                extract(epoch FROM now_ - b.updated_at)::double precision))
              END;
    llm_tokens := CASE WHEN p_tpm IS NULL THEN NULL
                       WHEN b.llm_tokens IS NULL THEN p_tpm / 60
                       ELSE least(p_tpm / 60, b.llm_tokens + p_tpm / 60 * greatest(0.0,
                                    extract(epoch FROM now_ - b.llm_updated_at)::double precision))
                  END;
    allowed := least(p_want, p_max - running);
    IF ramp IS NOT NULL THEN
        allowed := least(allowed, floor(ramp + 1e-6)::integer - running);
    END IF;
    IF tokens IS NOT NULL THEN
        allowed := least(allowed, floor(tokens + 1e-9)::integer);
    END IF;
    IF llm_tokens IS NOT NULL AND llm_tokens <= 0 THEN
        allowed := 0;
    END IF;
    IF paced_for > 0 THEN
        allowed := 0;
    END IF;
    IF open_for > 0 THEN
        allowed := 0;
    ELSIF half_open THEN
        allowed := least(allowed, 1 - running);
    END IF;
    allowed := greatest(allowed, 0);
    RETURN NEXT;
END;
$$;
CREATE FUNCTION public.provider_allowance(p_allowance double precision, p_window double precision, p_learned_at timestamp with time zone, p_now timestamp with time zone) RETURNS double precision
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT p_allowance * 2 ^ least(30.0, floor(greatest(0.0,
                   extract(epoch FROM p_now - p_learned_at)) / (3 * p_window)))
$$;
CREATE FUNCTION public.provider_learned_rate(p_allowance double precision, p_window double precision, p_learned_at timestamp with time zone, p_now timestamp with time zone) RETURNS double precision
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT 0.9 * provider_allowance(p_allowance, p_window, p_learned_at, p_now) / p_window
$$;
CREATE FUNCTION public.provider_running_count(p_provider text) RETURNS integer
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(sum(CASE WHEN side = 'started' THEN runs ELSE -runs END), 0)::integer
    FROM provider_running WHERE provider = p_provider
$$;
CREATE FUNCTION public.run_claim_lanes(p_provider text, p_now timestamp with time zone, p_limit integer) RETURNS SETOF bigint
    LANGUAGE plpgsql
    AS $$
BEGIN
    RETURN QUERY
    WITH RECURSIVE lanes AS (
        (SELECT r.owner FROM runs r
         WHERE r.status = 'pending' AND r.provider = p_provider
         ORDER BY r.owner DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT r.owner FROM runs r
                WHERE r.status = 'pending' AND r.provider = p_provider AND r.owner < l.owner
                ORDER BY r.owner DESC LIMIT 1)
        FROM lanes l
        WHERE l.owner IS NOT NULL
    )
    SELECT c.id
    FROM lanes l
    CROSS JOIN LATERAL (
        SELECT r.id, r.available_at
        FROM runs r
        WHERE r.status = 'pending'
          AND r.provider = p_provider
          AND r.owner = l.owner
          AND r.available_at <= p_now
          AND (NOT r.serial OR NOT EXISTS (
                SELECT 1 FROM runs o
                WHERE o.schedule_id = r.schedule_id AND o.status IN ('pending', 'running')
                  AND o.slot < r.slot))
        ORDER BY r.available_at, r.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE l.owner IS NOT NULL
    ORDER BY row_number() OVER (PARTITION BY l.owner ORDER BY c.available_at, c.id),
             c.available_at, c.id
    LIMIT p_limit;
END
$$;
CREATE FUNCTION public.run_claimable_count(p_provider text, p_now timestamp with time zone, p_limit integer) RETURNS integer
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (SELECT count(*)::integer FROM (
                SELECT 1
                FROM runs r
                WHERE r.status = 'pending'
                  AND r.provider = p_provider
                  AND r.available_at <= p_now
                  AND (NOT r.serial OR NOT EXISTS (
                        SELECT 1 FROM runs o
                        WHERE o.schedule_id = r.schedule_id
                          AND o.status IN ('pending', 'running')
                          AND o.slot < r.slot))
                ORDER BY r.available_at, r.id
                LIMIT p_limit) e);
END
$$;
CREATE FUNCTION public.runs_analyze_outgrown(p_written bigint) RETURNS real
    LANGUAGE plpgsql
    AS $$
DECLARE
    known real;
BEGIN
    SELECT c.reltuples INTO known FROM pg_class c WHERE c.oid = 'runs'::regclass;
    IF known < p_written THEN
        ANALYZE (SKIP_LOCKED) runs;
    END IF;
    RETURN known;
END
$$;
CREATE FUNCTION public.runs_count_changed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    -- Per provider, the rows running after the statement less those running before it: a
    -- renewal nets to nothing and writes nothing. Two aggregates, no join of the transition
    -- tables (0029). One counter row per provider side, in key order.
    INSERT INTO provider_running AS c (provider, shard, side, runs)
    SELECT t.provider, pg_backend_pid() % 16,
           CASE WHEN sum(t.runs) > 0 THEN 'started' ELSE 'ended' END, abs(sum(t.runs))
    FROM (
        SELECT n.provider, 1 AS runs FROM new_runs n WHERE n.status = 'running'
        UNION ALL
        SELECT o.provider, -1 FROM old_runs o WHERE o.status = 'running'
    ) AS t
    GROUP BY t.provider
    HAVING sum(t.runs) <> 0
    ORDER BY t.provider
    ON CONFLICT (provider, side, shard) DO UPDATE SET runs = c.runs + excluded.runs;
    RETURN NULL;
END
$$;
CREATE FUNCTION public.runs_count_row() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO provider_running AS c (provider, shard, side, runs)
    VALUES (CASE WHEN TG_OP = 'INSERT' THEN NEW.provider ELSE OLD.provider END,
            pg_backend_pid() % 16,
            CASE WHEN TG_OP = 'INSERT' THEN 'started' ELSE 'ended' END, 1)
    ON CONFLICT (provider, side, shard) DO UPDATE SET runs = c.runs + excluded.runs;
    RETURN NULL;
END
$$;
CREATE FUNCTION public.runs_count_truncated() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM provider_running;
    RETURN NULL;
END
$$;
CREATE FUNCTION public.schedule_name_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    cur record;
    holder bigint;
BEGIN
    -- The row as it is now: a later statement of the transaction may have renamed it again.
    SELECT s.owner, s.name, s.followup_key INTO cur FROM schedules s WHERE s.id = NEW.id;
    IF NOT FOUND OR cur.followup_key IS NOT NULL THEN
        RETURN NULL;
    END IF;
    WITH released AS (
        DELETE FROM schedule_names
        WHERE schedule_id = NEW.id AND (owner, name) IS DISTINCT FROM (cur.owner, cur.name)
    )
    INSERT INTO schedule_names (owner, name, schedule_id)
    VALUES (cur.owner, cur.name, NEW.id)
    ON CONFLICT (owner, name) DO UPDATE SET schedule_id = schedule_names.schedule_id
    RETURNING schedule_id INTO holder;
    IF holder <> NEW.id THEN
        RAISE EXCEPTION 'schedule % is already named % (names are unique per owner)',
            holder, quote_literal(cur.name)
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'schedule_names_pkey';
    END IF;
    RETURN NULL;
END
$$;
CREATE TABLE public.api_tokens (
    id bigint NOT NULL,
    owner text NOT NULL,
    admin boolean DEFAULT false NOT NULL,
    token_hash text NOT NULL,
    name text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    last_used_at timestamp with time zone,
    revoked_at timestamp with time zone,
    CONSTRAINT api_tokens_owner_check CHECK ((owner <> ''::text)),
    CONSTRAINT api_tokens_token_hash_check CHECK ((token_hash ~ '^[0-9a-f]{64}$'::text))
);
ALTER TABLE public.api_tokens ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.api_tokens_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.attempt_steps (
    run_id bigint NOT NULL,
    attempt_id uuid NOT NULL,
    id bigint NOT NULL,
    entry jsonb NOT NULL
);
ALTER TABLE public.attempt_steps ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.attempt_steps_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.console_sessions (
    id bigint NOT NULL,
    secret_hash text NOT NULL,
    token_id bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    ended_at timestamp with time zone
);
CREATE SEQUENCE public.console_sessions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;
ALTER SEQUENCE public.console_sessions_id_seq OWNED BY public.console_sessions.id;
CREATE TABLE public.ended_attempts (
    attempt_id uuid NOT NULL,
    run_id bigint NOT NULL,
    number integer NOT NULL,
    worker_id text NOT NULL,
    status text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    error text,
    usage jsonb,
    provider text,
    model text,
    throttled boolean DEFAULT false NOT NULL,
    wait interval,
    CONSTRAINT ended_attempts_status_check CHECK ((status = ANY (ARRAY['failed'::text, 'lost'::text, 'released'::text, 'cancelled'::text, 'skipped'::text])))
);
CREATE TABLE public.followup_checks (
    id bigint NOT NULL,
    schedule_id bigint NOT NULL,
    run_id bigint,
    number integer NOT NULL,
    status text NOT NULL,
    decision jsonb,
    outcome text NOT NULL,
    next_at timestamp with time zone,
    escalated integer[] DEFAULT '{}'::integer[] NOT NULL,
    at timestamp with time zone NOT NULL
);
ALTER TABLE public.followup_checks ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.followup_checks_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.followups (
    schedule_id bigint NOT NULL,
    owner text NOT NULL,
    key text NOT NULL,
    request jsonb NOT NULL,
    due_at timestamp with time zone NOT NULL,
    max_checks integer NOT NULL,
    horizon timestamp with time zone NOT NULL,
    escalate jsonb DEFAULT '[]'::jsonb NOT NULL,
    checks integer DEFAULT 0 NOT NULL,
    state text DEFAULT 'active'::text NOT NULL,
    ended_reason text,
    cancelled_by text,
    cancelled_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    resolution interval,
    CONSTRAINT followups_max_checks_check CHECK (((max_checks >= 1) AND (max_checks <= 1000))),
    CONSTRAINT followups_resolution_check CHECK (((resolution IS NULL) OR ((resolution >= '00:00:01'::interval) AND (resolution <= '1 day'::interval)))),
    CONSTRAINT followups_state_check CHECK ((state = ANY (ARRAY['active'::text, 'done'::text, 'ended'::text, 'cancelled'::text])))
);
CREATE TABLE public.leaders (
    name text NOT NULL,
    holder text NOT NULL,
    term bigint DEFAULT 1 NOT NULL,
    acquired_at timestamp with time zone NOT NULL,
    renewed_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT leaders_expiry_after_renewal CHECK ((expires_at > renewed_at))
);
CREATE TABLE public.monitor_memory (
    schedule_id bigint NOT NULL,
    run_id bigint NOT NULL,
    fingerprint text NOT NULL,
    updated_at timestamp with time zone NOT NULL
);
CREATE TABLE public.schedules (
    id bigint NOT NULL,
    owner text DEFAULT 'default'::text NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    expression text NOT NULL,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    dst_gap text DEFAULT 'shift'::text NOT NULL,
    dst_fold text DEFAULT 'first'::text NOT NULL,
    prompt text NOT NULL,
    provider text DEFAULT 'echo'::text NOT NULL,
    model text,
    params jsonb DEFAULT '{}'::jsonb NOT NULL,
    misfire_policy text DEFAULT 'run_once'::text NOT NULL,
    misfire_cap integer DEFAULT 100 NOT NULL,
    misfire_grace interval DEFAULT '00:01:00'::interval NOT NULL,
    catchup_window interval,
    overlap_policy text DEFAULT 'skip'::text NOT NULL,
    max_attempts integer DEFAULT 3 NOT NULL,
    timeout interval DEFAULT '00:05:00'::interval NOT NULL,
    jitter interval,
    enabled boolean DEFAULT true NOT NULL,
    paused_until timestamp with time zone,
    pause_reason text,
    pause_after_failures integer,
    next_fire_at timestamp with time zone,
    version integer DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    notify jsonb DEFAULT '{}'::jsonb NOT NULL,
    budget jsonb,
    vars jsonb,
    followup_key text,
    output_schema jsonb,
    notify_when text DEFAULT 'always'::text NOT NULL,
    give_up_after interval DEFAULT '01:00:00'::interval NOT NULL,
    fallback text[] DEFAULT '{}'::text[] NOT NULL,
    CONSTRAINT schedules_budget_is_object CHECK (((budget IS NULL) OR (jsonb_typeof(budget) = 'object'::text))),
    CONSTRAINT schedules_dst_fold_check CHECK ((dst_fold = ANY (ARRAY['first'::text, 'both'::text]))),
    CONSTRAINT schedules_dst_gap_check CHECK ((dst_gap = ANY (ARRAY['shift'::text, 'skip'::text]))),
    CONSTRAINT schedules_kind_check CHECK ((kind = ANY (ARRAY['cron'::text, 'rrule'::text, 'at'::text, 'every'::text]))),
    CONSTRAINT schedules_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 100))),
    CONSTRAINT schedules_misfire_cap_check CHECK ((misfire_cap > 0)),
    CONSTRAINT schedules_misfire_policy_check CHECK ((misfire_policy = ANY (ARRAY['run_once'::text, 'skip'::text, 'run_all'::text]))),
    CONSTRAINT schedules_notify_is_object CHECK ((jsonb_typeof(notify) = 'object'::text)),
    CONSTRAINT schedules_output_schema_is_object CHECK (((output_schema IS NULL) OR (jsonb_typeof(output_schema) = 'object'::text))),
    CONSTRAINT schedules_overlap_policy_check CHECK ((overlap_policy = ANY (ARRAY['skip'::text, 'allow'::text, 'buffer_one'::text, 'buffer_all'::text, 'cancel_other'::text]))),
    CONSTRAINT schedules_pause_after_failures_check CHECK ((pause_after_failures > 0)),
    CONSTRAINT schedules_vars_is_object CHECK (((vars IS NULL) OR (jsonb_typeof(vars) = 'object'::text)))
);
CREATE VIEW public.notify_channels AS
 SELECT s.id AS schedule_id,
    c.channel,
    c.target,
        CASE
            WHEN (jsonb_typeof((s.notify -> 'on_success'::text)) = 'boolean'::text) THEN ((s.notify -> 'on_success'::text))::boolean
            ELSE true
        END AS on_success,
        CASE
            WHEN (jsonb_typeof((s.notify -> 'on_failure'::text)) = 'boolean'::text) THEN ((s.notify -> 'on_failure'::text))::boolean
            ELSE true
        END AS on_failure
   FROM (public.schedules s
     CROSS JOIN LATERAL ( VALUES ('email'::text,
                CASE
                    WHEN ((jsonb_typeof((s.notify -> 'email'::text)) = 'array'::text) AND (jsonb_array_length((s.notify -> 'email'::text)) > 0)) THEN (s.notify -> 'email'::text)
                    ELSE NULL::jsonb
                END), ('webhook'::text,
                CASE
                    WHEN ((jsonb_typeof((s.notify -> 'webhook'::text)) = 'object'::text) AND (jsonb_typeof(((s.notify -> 'webhook'::text) -> 'url'::text)) = 'string'::text)) THEN ((s.notify -> 'webhook'::text) - 'secret'::text)
                    ELSE NULL::jsonb
                END), ('slack'::text,
                CASE
                    WHEN (jsonb_typeof(((s.notify -> 'slack'::text) -> 'url'::text)) = 'string'::text) THEN jsonb_build_object('host', COALESCE("substring"(((s.notify -> 'slack'::text) ->> 'url'::text), '^[a-z]+://([^/:?#]+)'::text), '?'::text))
                    ELSE NULL::jsonb
                END), ('discord'::text,
                CASE
                    WHEN (jsonb_typeof(((s.notify -> 'discord'::text) -> 'url'::text)) = 'string'::text) THEN jsonb_build_object('host', COALESCE("substring"(((s.notify -> 'discord'::text) ->> 'url'::text), '^[a-z]+://([^/:?#]+)'::text), '?'::text))
                    ELSE NULL::jsonb
                END), ('ntfy'::text,
                CASE
                    WHEN (jsonb_typeof(((s.notify -> 'ntfy'::text) -> 'url'::text)) = 'string'::text) THEN jsonb_build_object('host', COALESCE("substring"(((s.notify -> 'ntfy'::text) ->> 'url'::text), '^[a-z]+://([^/:?#]+)'::text), '?'::text))
                    ELSE NULL::jsonb
                END)) c(channel, target))
  WHERE (c.target IS NOT NULL);
CREATE TABLE public.outbox (
    id bigint NOT NULL,
    run_id bigint NOT NULL,
    schedule_id bigint NOT NULL,
    channel text NOT NULL,
    target jsonb NOT NULL,
    event text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_expires_at timestamp with time zone,
    claim_token uuid,
    last_error text,
    idempotency_key text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    sent_at timestamp with time zone,
    details jsonb,
    CONSTRAINT outbox_channel_check CHECK ((channel = ANY (ARRAY['email'::text, 'webhook'::text, 'slack'::text, 'discord'::text, 'ntfy'::text]))),
    CONSTRAINT outbox_event_check CHECK ((event = ANY (ARRAY['succeeded'::text, 'dead'::text, 'paused'::text, 'digest'::text, 'budget'::text, 'escalation'::text]))),
    CONSTRAINT outbox_max_attempts_check CHECK ((max_attempts > 0)),
    CONSTRAINT outbox_sending_has_lease CHECK (((status <> 'sending'::text) OR ((claim_token IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT outbox_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'sending'::text, 'sent'::text, 'dead'::text])))
);
ALTER TABLE public.outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.owner_budgets (
    owner text NOT NULL,
    budget jsonb NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT owner_budgets_budget_check CHECK ((jsonb_typeof(budget) = 'object'::text)),
    CONSTRAINT owner_budgets_owner_check CHECK ((owner <> ''::text))
);
CREATE TABLE public.owner_minutes (
    owner text NOT NULL,
    minute timestamp with time zone NOT NULL,
    shard integer NOT NULL,
    runs integer NOT NULL
);
CREATE TABLE public.promptsched_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);
CREATE TABLE public.promptsched_schema (
    version integer NOT NULL,
    name text NOT NULL,
    steps integer NOT NULL,
    steps_done integer NOT NULL,
    compat integer NOT NULL,
    release text NOT NULL,
    applied_at timestamp with time zone
);
CREATE TABLE public.provider_buckets (
    provider text NOT NULL,
    tokens double precision,
    updated_at timestamp with time zone,
    open_until timestamp with time zone,
    failures integer DEFAULT 0 NOT NULL,
    reason text,
    llm_tokens double precision,
    llm_updated_at timestamp with time zone,
    opened_at timestamp with time zone,
    ramp double precision,
    paced_until timestamp with time zone,
    pace_reason text,
    allowance double precision,
    window_seconds double precision,
    learned_at timestamp with time zone,
    learn_until timestamp with time zone
);
CREATE TABLE public.provider_running (
    provider text NOT NULL,
    shard integer NOT NULL,
    side text NOT NULL,
    runs bigint NOT NULL,
    CONSTRAINT provider_running_side_check CHECK ((side = ANY (ARRAY['started'::text, 'ended'::text])))
);
CREATE TABLE public.replicas (
    id text NOT NULL,
    host text NOT NULL,
    version text NOT NULL,
    roles text[] NOT NULL,
    slots integer NOT NULL,
    config jsonb NOT NULL,
    fingerprint text NOT NULL,
    in_flight integer DEFAULT 0 NOT NULL,
    started_at timestamp with time zone NOT NULL,
    seen_at timestamp with time zone NOT NULL,
    alive_until timestamp with time zone NOT NULL,
    stopped_at timestamp with time zone
);
CREATE TABLE public.runs (
    id bigint NOT NULL,
    schedule_id bigint NOT NULL,
    slot timestamp with time zone NOT NULL,
    origin text DEFAULT 'cadence'::text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    skip_reason text,
    missed_slots integer DEFAULT 0 NOT NULL,
    serial boolean DEFAULT false NOT NULL,
    provider text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    releases integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    attempt_id uuid,
    worker_id text,
    lease_expires_at timestamp with time zone,
    deadline_at timestamp with time zone,
    cancel_requested boolean DEFAULT false NOT NULL,
    output text,
    usage jsonb,
    error text,
    replay_of bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    tokens bigint DEFAULT 0 NOT NULL,
    cost double precision DEFAULT 0 NOT NULL,
    attempt_started_at timestamp with time zone,
    output_json jsonb,
    notify_decision jsonb,
    throttles integer DEFAULT 0 NOT NULL,
    route smallint DEFAULT 0 NOT NULL,
    model text,
    cleaned_chars integer,
    owner text DEFAULT ''::text NOT NULL,
    CONSTRAINT runs_lease_only_while_running CHECK (((lease_expires_at IS NULL) OR (status = 'running'::text))),
    CONSTRAINT runs_origin_check CHECK ((origin = ANY (ARRAY['cadence'::text, 'manual'::text, 'backfill'::text, 'replay'::text, 'check'::text]))),
    CONSTRAINT runs_running_has_lease CHECK (((status <> 'running'::text) OR ((attempt_id IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT runs_skipped_has_reason CHECK (((status <> 'skipped'::text) OR (skip_reason IS NOT NULL))),
    CONSTRAINT runs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'succeeded'::text, 'dead'::text, 'cancelled'::text, 'skipped'::text])))
);
CREATE VIEW public.run_attempts AS
 SELECT e.attempt_id,
    e.run_id,
    e.number,
    e.worker_id,
    e.status,
    e.started_at,
    e.finished_at,
    e.error,
    COALESCE(( SELECT jsonb_agg(s.entry ORDER BY s.id) AS jsonb_agg
           FROM public.attempt_steps s
          WHERE ((s.run_id = e.run_id) AND (s.attempt_id = e.attempt_id))), '[]'::jsonb) AS transcript,
    e.usage,
    e.provider,
    e.model,
    e.throttled,
    e.wait
   FROM public.ended_attempts e
UNION ALL
 SELECT r.attempt_id,
    r.id AS run_id,
    r.attempts AS number,
    r.worker_id,
    r.status,
    r.attempt_started_at AS started_at,
    r.finished_at,
    NULL::text AS error,
    COALESCE(( SELECT jsonb_agg(s.entry ORDER BY s.id) AS jsonb_agg
           FROM public.attempt_steps s
          WHERE ((s.run_id = r.id) AND (s.attempt_id = r.attempt_id))), '[]'::jsonb) AS transcript,
    r.usage,
    r.provider,
        CASE
            WHEN ((r.status = 'succeeded'::text) AND (r.model IS NOT NULL)) THEN r.model
            WHEN (r.route = 0) THEN ( SELECT sc.model
               FROM public.schedules sc
              WHERE (sc.id = r.schedule_id))
            ELSE r.model
        END AS model,
    false AS throttled,
    NULL::interval AS wait
   FROM public.runs r
  WHERE ((r.status = ANY (ARRAY['running'::text, 'succeeded'::text])) AND (r.attempt_id IS NOT NULL));
ALTER TABLE public.runs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.runs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.schedule_changes (
    id bigint NOT NULL,
    schedule_id bigint NOT NULL,
    owner text NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    changes jsonb DEFAULT '{}'::jsonb NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedule_changes_action_check CHECK ((action = ANY (ARRAY['create'::text, 'update'::text, 'pause'::text, 'resume'::text, 'delete'::text, 'trigger'::text, 'backfill'::text, 'auto_pause'::text, 'auto_resume'::text])))
);
ALTER TABLE public.schedule_changes ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.schedule_changes_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.schedule_names (
    owner text NOT NULL,
    name text NOT NULL,
    schedule_id bigint NOT NULL
);
ALTER TABLE public.schedules ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.schedules_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
ALTER TABLE ONLY public.console_sessions ALTER COLUMN id SET DEFAULT nextval('public.console_sessions_id_seq'::regclass);
ALTER TABLE ONLY public.api_tokens
    ADD CONSTRAINT api_tokens_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.api_tokens
    ADD CONSTRAINT api_tokens_token_hash_key UNIQUE (token_hash);
ALTER TABLE ONLY public.attempt_steps
    ADD CONSTRAINT attempt_steps_pkey PRIMARY KEY (run_id, attempt_id, id);
ALTER TABLE ONLY public.console_sessions
    ADD CONSTRAINT console_sessions_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.console_sessions
    ADD CONSTRAINT console_sessions_secret_hash_key UNIQUE (secret_hash);
ALTER TABLE ONLY public.ended_attempts
    ADD CONSTRAINT ended_attempts_pkey PRIMARY KEY (attempt_id);
ALTER TABLE ONLY public.ended_attempts
    ADD CONSTRAINT ended_attempts_run_id_number_key UNIQUE (run_id, number);
ALTER TABLE ONLY public.followup_checks
    ADD CONSTRAINT followup_checks_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.followups
    ADD CONSTRAINT followups_pkey PRIMARY KEY (schedule_id);
ALTER TABLE ONLY public.leaders
    ADD CONSTRAINT leaders_pkey PRIMARY KEY (name);
ALTER TABLE ONLY public.monitor_memory
    ADD CONSTRAINT monitor_memory_pkey PRIMARY KEY (schedule_id);
ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_idempotency_key_key UNIQUE (idempotency_key);
ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.owner_budgets
    ADD CONSTRAINT owner_budgets_pkey PRIMARY KEY (owner);
ALTER TABLE ONLY public.owner_minutes
    ADD CONSTRAINT owner_minutes_pkey PRIMARY KEY (owner, minute, shard);
ALTER TABLE ONLY public.promptsched_migrations
    ADD CONSTRAINT promptsched_migrations_pkey PRIMARY KEY (version);
ALTER TABLE ONLY public.promptsched_schema
    ADD CONSTRAINT promptsched_schema_pkey PRIMARY KEY (version);
ALTER TABLE ONLY public.provider_buckets
    ADD CONSTRAINT provider_buckets_pkey PRIMARY KEY (provider);
ALTER TABLE ONLY public.provider_running
    ADD CONSTRAINT provider_running_pkey PRIMARY KEY (provider, side, shard);
ALTER TABLE ONLY public.replicas
    ADD CONSTRAINT replicas_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.schedule_changes
    ADD CONSTRAINT schedule_changes_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.schedule_names
    ADD CONSTRAINT schedule_names_pkey PRIMARY KEY (owner, name);
ALTER TABLE ONLY public.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (id);
CREATE INDEX api_tokens_owner_idx ON public.api_tokens USING btree (owner, id);
CREATE INDEX console_sessions_expires_idx ON public.console_sessions USING btree (expires_at);
CREATE INDEX followup_checks_schedule_idx ON public.followup_checks USING btree (schedule_id, id);
CREATE INDEX followups_ended_idx ON public.followups USING btree (updated_at) WHERE (state <> 'active'::text);
CREATE UNIQUE INDEX followups_owner_key ON public.followups USING btree (owner, key);
CREATE INDEX outbox_claim_idx ON public.outbox USING btree (available_at, id) WHERE (status = 'pending'::text);
CREATE INDEX outbox_dead_idx ON public.outbox USING btree (id) WHERE (status = 'dead'::text);
CREATE INDEX outbox_lease_idx ON public.outbox USING btree (lease_expires_at) WHERE (status = 'sending'::text);
CREATE INDEX outbox_run_idx ON public.outbox USING btree (run_id);
CREATE INDEX outbox_schedule_idx ON public.outbox USING btree (schedule_id);
CREATE INDEX replicas_alive_idx ON public.replicas USING btree (alive_until) WHERE (stopped_at IS NULL);
CREATE UNIQUE INDEX runs_backfill_slot_key ON public.runs USING btree (schedule_id, slot) WHERE (origin = 'backfill'::text);
CREATE UNIQUE INDEX runs_cadence_slot_key ON public.runs USING btree (schedule_id, slot) WHERE (origin = 'cadence'::text);
CREATE INDEX runs_claim_idx ON public.runs USING btree (provider, available_at, id) WHERE (status = 'pending'::text);
CREATE INDEX runs_finished_idx ON public.runs USING btree (finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX runs_lease_idx ON public.runs USING btree (lease_expires_at) WHERE (lease_expires_at IS NOT NULL);
CREATE INDEX runs_owner_claim_idx ON public.runs USING btree (provider, owner, available_at, id) WHERE (status = 'pending'::text);
CREATE UNIQUE INDEX runs_replay_key ON public.runs USING btree (replay_of) WHERE (origin = 'replay'::text);
CREATE INDEX runs_replay_of_idx ON public.runs USING btree (replay_of) WHERE (replay_of IS NOT NULL);
CREATE INDEX runs_schedule_idx ON public.runs USING btree (schedule_id, slot DESC);
CREATE INDEX runs_unfinished_idx ON public.runs USING btree (schedule_id, slot) WHERE (status = ANY (ARRAY['pending'::text, 'running'::text]));
CREATE INDEX schedule_changes_schedule_idx ON public.schedule_changes USING btree (schedule_id, id);
CREATE INDEX schedule_names_schedule_idx ON public.schedule_names USING btree (schedule_id);
CREATE INDEX schedules_due_idx ON public.schedules USING btree (next_fire_at) WHERE (enabled AND (next_fire_at IS NOT NULL));
CREATE INDEX schedules_fallback_idx ON public.schedules USING btree (id) WHERE (cardinality(fallback) > 0);
CREATE INDEX schedules_owner_idx ON public.schedules USING btree (owner, id);
CREATE INDEX schedules_resume_idx ON public.schedules USING btree (paused_until) WHERE (NOT enabled);
CREATE TRIGGER runs_count_delete AFTER DELETE ON public.runs FOR EACH ROW WHEN ((old.status = 'running'::text)) EXECUTE FUNCTION public.runs_count_row();
CREATE TRIGGER runs_count_insert AFTER INSERT ON public.runs FOR EACH ROW WHEN ((new.status = 'running'::text)) EXECUTE FUNCTION public.runs_count_row();
CREATE TRIGGER runs_count_truncate AFTER TRUNCATE ON public.runs FOR EACH STATEMENT EXECUTE FUNCTION public.runs_count_truncated();
CREATE TRIGGER runs_count_update AFTER UPDATE ON public.runs REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs FOR EACH STATEMENT EXECUTE FUNCTION public.runs_count_changed();
CREATE CONSTRAINT TRIGGER schedules_name_unique AFTER INSERT OR UPDATE OF owner, name, followup_key ON public.schedules DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((new.followup_key IS NULL)) EXECUTE FUNCTION public.schedule_name_guard();
ALTER TABLE ONLY public.attempt_steps
    ADD CONSTRAINT attempt_steps_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.console_sessions
    ADD CONSTRAINT console_sessions_token_id_fkey FOREIGN KEY (token_id) REFERENCES public.api_tokens(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.ended_attempts
    ADD CONSTRAINT ended_attempts_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.followup_checks
    ADD CONSTRAINT followup_checks_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id) ON DELETE SET NULL;
ALTER TABLE ONLY public.followup_checks
    ADD CONSTRAINT followup_checks_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.followups(schedule_id) ON DELETE CASCADE;
ALTER TABLE ONLY public.followups
    ADD CONSTRAINT followups_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.monitor_memory
    ADD CONSTRAINT monitor_memory_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_replay_of_fkey FOREIGN KEY (replay_of) REFERENCES public.runs(id) ON DELETE SET NULL;
ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.schedule_names
    ADD CONSTRAINT schedule_names_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id) ON DELETE CASCADE;
