-- Budgets (docs/providers.md): a schedule, or every schedule of an owner, may set a limit in
-- tokens and/or cost per UTC day and/or UTC month. A run claimed while its schedule or its
-- owner has spent its limit in the current period is not sent: the worker ends it `skipped`
-- with reason `budget`, and the finish owes one `budget` notice per scope, period and channel
-- (the idempotency key names them), so the owner hears once a period however many runs drop.
-- Spend is what the runs recorded (runs.tokens, runs.cost), in the period of their slot.
-- A budget is an object of up to four limits: tokens_per_day, cost_per_day, tokens_per_month,
-- cost_per_month (NULL or {}: none).

ALTER TABLE schedules ADD COLUMN budget jsonb
    CONSTRAINT schedules_budget_is_object CHECK (budget IS NULL OR jsonb_typeof(budget) = 'object');

CREATE TABLE owner_budgets (
    owner      text        PRIMARY KEY CHECK (owner <> ''),
    budget     jsonb       NOT NULL CHECK (jsonb_typeof(budget) = 'object'),
    updated_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE outbox DROP CONSTRAINT outbox_event_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_check
    CHECK (event IN ('succeeded', 'dead', 'paused', 'digest', 'budget'));

-- The first limit a budget has reached at p_now, as the notice and the run's error describe
-- it, or NULL. p_spend holds the spend of the scope in the current UTC day and month.
CREATE FUNCTION budget_reached(p_budget jsonb, p_day_tokens bigint, p_day_cost float8,
                               p_month_tokens bigint, p_month_cost float8)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
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

-- A reached limit with its scope, its period's UTC start and the notice key: one per scope
-- (a schedule id, or the md5 of an owner: keys become Message-IDs), period and period start.
CREATE FUNCTION budget_notice_of(p_reached jsonb, p_scope text, p_scope_id text,
                                 p_day_start timestamptz, p_month_start timestamptz)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_reached || jsonb_build_object(
        'scope', p_scope,
        'period_start', s.start,
        'key', format('%s-%s-%s-%s', p_scope, p_scope_id, p_reached ->> 'period',
                      to_char(s.start AT TIME ZONE 'UTC', 'YYYY-MM-DD')))
    FROM (SELECT CASE WHEN p_reached ->> 'period' = 'day' THEN p_day_start
                      ELSE p_month_start END AS start) s
$$;

-- Whether a run of schedule p_schedule (of p_owner, with budget p_budget) may start at p_now:
-- NULL when neither the schedule's budget nor its owner's is reached, else what was reached,
-- with the scope ('schedule' first, then 'owner'), the period's UTC start and the notice key
-- (one per scope and period). The claim calls it only when a budget exists (see the claim
-- statements), so schedules without one pay nothing. The schedule's spend is read through
-- runs_schedule_idx, the owner's through schedules_owner_idx and the same index.
CREATE FUNCTION budget_verdict(p_schedule bigint, p_owner text, p_budget jsonb,
                               p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
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

-- The notices runs skipped for a reached budget owe (run_finish_many): one per scope, period
-- and channel to the failure targets of the skipped run's schedule, keyed so that only the
-- period's first skip writes it. `details` keeps what was reached, for the message. Returns
-- how many rows it wrote.
CREATE FUNCTION budget_owe(run_ids bigint[], schedule_ids bigint[], notices jsonb[],
                           at timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
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
