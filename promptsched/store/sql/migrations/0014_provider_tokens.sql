-- A provider's tokens-per-minute limit, for the whole fleet (docs/providers.md). A second
-- bucket in the provider's row, of LLM tokens: refilled at tokens_per_minute / 60 per second
-- up to one second's worth, debited by the tokens each attempt reported when it ended
-- (provider_debit_tokens in runs.sql). A run's tokens are known only after it ran, so the
-- claim cannot take them in advance: it takes no run while the bucket is not positive, and
-- the bucket goes negative by what the runs admitted meanwhile spent, to be refilled before
-- the next claim.
ALTER TABLE provider_buckets
    ADD COLUMN llm_tokens double precision,       -- NULL: a full bucket
    ADD COLUMN llm_updated_at timestamptz;

DROP FUNCTION provider_admit(text, integer, integer, double precision, double precision,
                             timestamptz);

-- What a provider's fleet-wide limits leave for one claim of up to p_want runs: its running
-- runs below p_max, whole tokens of its rate bucket (p_rate per second, at most p_burst; NULL:
-- no rate limit), none while its LLM-token bucket (p_tpm tokens a minute, at most one
-- second's worth; NULL: no limit) is not positive, none while its breaker is open and one
-- probe at a time while half-open. It takes the provider's transaction advisory lock first,
-- so claimers of one provider take turns until each one's claim commits; being VOLATILE, its
-- reads take a fresh snapshot after the lock, so every claim committed before it is counted
-- (a plain statement's snapshot is older than any lock it waits for). Only reads: the claim
-- statement writes the rate bucket back, and each attempt's end debits the LLM tokens.
CREATE FUNCTION provider_admit(
    p_provider text, p_want integer, p_max integer, p_rate double precision,
    p_burst double precision, p_tpm double precision, p_now timestamptz
) RETURNS TABLE (allowed integer, tokens double precision, running integer,
                 open_for double precision, half_open boolean, failures integer,
                 llm_tokens double precision)
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
    IF tokens IS NOT NULL THEN
        allowed := least(allowed, floor(tokens + 1e-9)::integer);
    END IF;
    IF llm_tokens IS NOT NULL AND llm_tokens <= 0 THEN
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
