-- Provider weather (docs/providers.md, "When the provider pushes back"). A provider that says
-- "not now" (a 429, a 503 with Retry-After) does not spend the run's max_attempts: the run
-- counts its throttled attempts apart (runs.throttles) and gives up only when the schedule's
-- give_up_after has passed since its first attempt. A schedule may name fallback providers
-- (`NAME` or `NAME:MODEL`, in order); the run's current place in that route is runs.route
-- (0: the schedule's own provider), with the provider it is queued for in runs.provider, as
-- before, and that place's model in runs.model (NULL: the schedule's model).
ALTER TABLE schedules
    ADD COLUMN give_up_after interval NOT NULL DEFAULT interval '1 hour',
    ADD COLUMN fallback text[] NOT NULL DEFAULT '{}';

ALTER TABLE runs
    ADD COLUMN throttles integer NOT NULL DEFAULT 0,
    ADD COLUMN route smallint NOT NULL DEFAULT 0,
    ADD COLUMN model text;

-- Each ended attempt says which provider and model it used, whether it was throttled, and how
-- long it was asked to wait. Rows written before this migration keep NULLs there.
ALTER TABLE ended_attempts
    ADD COLUMN provider text,
    ADD COLUMN model text,
    ADD COLUMN throttled boolean NOT NULL DEFAULT false,
    ADD COLUMN wait interval;

-- The fleet's breaker counts one burst once: opened_at is when it last opened, and a failure
-- of an attempt that started before then neither counts nor extends it. After it opens, the
-- provider's fleet-wide concurrency ramps back from one (ramp; NULL: no ramp, the configured
-- max_concurrency). paced_until: the provider's own rate-limit headers said nothing is left
-- until then (pace_reason says which), and no replica sends to it before.
ALTER TABLE provider_buckets
    ADD COLUMN opened_at timestamptz,
    ADD COLUMN ramp double precision,
    ADD COLUMN paced_until timestamptz,
    ADD COLUMN pace_reason text;

CREATE OR REPLACE VIEW run_attempts AS
SELECT e.attempt_id, e.run_id, e.number, e.worker_id, e.status, e.started_at, e.finished_at,
       e.error,
       coalesce((SELECT jsonb_agg(s.entry ORDER BY s.id) FROM attempt_steps s
                 WHERE s.run_id = e.run_id AND s.attempt_id = e.attempt_id),
                '[]'::jsonb) AS transcript,
       e.usage, e.provider, e.model, e.throttled, e.wait
FROM ended_attempts e
UNION ALL
SELECT r.attempt_id, r.id, r.attempts, r.worker_id, r.status, r.attempt_started_at,
       r.finished_at, NULL::text,
       coalesce((SELECT jsonb_agg(s.entry ORDER BY s.id) FROM attempt_steps s
                 WHERE s.run_id = r.id AND s.attempt_id = r.attempt_id),
                '[]'::jsonb),
       r.usage, r.provider,
       CASE WHEN r.route = 0 THEN (SELECT sc.model FROM schedules sc WHERE sc.id = r.schedule_id)
            ELSE r.model END,
       false, NULL::interval
FROM runs r
WHERE r.status IN ('running', 'succeeded') AND r.attempt_id IS NOT NULL;

DROP FUNCTION provider_admit(text, integer, integer, double precision, double precision,
                             double precision, timestamptz);

-- What a provider's fleet-wide limits leave for one claim of up to p_want runs, as in
-- 0014_provider_tokens.sql, and also: nothing before paced_until (the provider's headers said
-- nothing is left until then), and while the concurrency ramps back after the breaker opened,
-- at most floor(ramp) running at once.
CREATE FUNCTION provider_admit(
    p_provider text, p_want integer, p_max integer, p_rate double precision,
    p_burst double precision, p_tpm double precision, p_now timestamptz
) RETURNS TABLE (allowed integer, tokens double precision, running integer,
                 open_for double precision, half_open boolean, failures integer,
                 llm_tokens double precision, paced_for double precision,
                 ramp double precision)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    b provider_buckets%ROWTYPE;
    now_ timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('promptsched.provider:' || p_provider, 0));
    SELECT count(*)::integer INTO running FROM runs r
    WHERE r.status = 'running' AND r.provider = p_provider;
    SELECT * INTO b FROM provider_buckets pb WHERE pb.provider = p_provider;
    failures := coalesce(b.failures, 0);
    open_for := greatest(0.0, coalesce(extract(epoch FROM b.open_until - now_), 0.0));
    half_open := b.open_until IS NOT NULL AND b.open_until <= now_;
    paced_for := greatest(0.0, coalesce(extract(epoch FROM b.paced_until - now_), 0.0));
    ramp := b.ramp;
    tokens := CASE WHEN p_rate IS NULL THEN NULL
                   WHEN b.tokens IS NULL THEN p_burst
                   ELSE least(p_burst, b.tokens + p_rate * greatest(0.0,
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
