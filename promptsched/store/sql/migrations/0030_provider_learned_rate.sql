-- The fleet learns a request rate from what a throttling provider's window allowed
-- (docs/providers.md, "Learning the rate"). A counted throttled answer (provider_trip) marks
-- the window that ended with it: [learn_until - window_seconds, learn_until), the window being
-- what the provider asked to wait (Retry-After) or a minute without one. When the breaker's
-- probe succeeds (provider_recover), every success of that window has been written, and the
-- provider's allowance is the successes of attempts started in it (the first time), or the
-- smaller of those and the allowance in force less one (a throttle while paced: additive
-- decrease). The allowance doubles after every 3 windows without a throttle
-- (provider_allowance): a limit that was raised, or a one-off throttle, costs a few windows,
-- and a real limit one throttled request per probe. Claims pace to 0.9 x allowance / window_seconds, one request
-- at a time through the provider's rate bucket (tokens, updated_at), so no window of that
-- length sees more than the allowance; the margin absorbs the requests' unequal travel times.
ALTER TABLE provider_buckets
    ADD COLUMN allowance double precision,
    ADD COLUMN window_seconds double precision,
    ADD COLUMN learned_at timestamptz,
    ADD COLUMN learn_until timestamptz;

-- The allowance now: the learned one, doubled per 3 windows since it was learned. NULL:
-- nothing learned.
CREATE FUNCTION provider_allowance(
    p_allowance double precision, p_window double precision, p_learned_at timestamptz,
    p_now timestamptz
) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_allowance * 2 ^ least(30.0, floor(greatest(0.0,
                   extract(epoch FROM p_now - p_learned_at)) / (3 * p_window)))
$$;

-- The pacing rate (requests a second) the allowance leaves, with its 10 % margin.
CREATE FUNCTION provider_learned_rate(
    p_allowance double precision, p_window double precision, p_learned_at timestamptz,
    p_now timestamptz
) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT 0.9 * provider_allowance(p_allowance, p_window, p_learned_at, p_now) / p_window
$$;

DROP FUNCTION provider_admit(text, integer, integer, double precision, double precision,
                             double precision, timestamptz);

-- provider_admit as in 0027_provider_running.sql, and also: the rate bucket refills at the
-- smaller of the configured rate and the learned one (returned as rate), one at a time while
-- a rate is learned.
CREATE FUNCTION provider_admit(
    p_provider text, p_want integer, p_max integer, p_rate double precision,
    p_burst double precision, p_tpm double precision, p_now timestamptz
) RETURNS TABLE (allowed integer, tokens double precision, running integer,
                 open_for double precision, half_open boolean, failures integer,
                 llm_tokens double precision, paced_for double precision,
                 ramp double precision, rate double precision)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    b provider_buckets%ROWTYPE;
    now_ timestamptz := coalesce(p_now, clock_timestamp());
    burst double precision;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('promptsched.provider:' || p_provider, 0));
    running := provider_running_count(p_provider);
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
