-- Fleet-wide provider limits and back-pressure (docs/providers.md). One row per provider,
-- shared by every replica: its request-rate token bucket, and its circuit breaker (open until
-- an instant after a 429 with Retry-After or a run of failures; half-open, one probe at a
-- time, once that instant has passed; closed again after a success). Claimers of one provider
-- serialize on a transaction advisory lock, read this row and the provider's running runs,
-- claim at most what both allow, and write the bucket back; concurrency needs no row of its
-- own (the running runs are the count, and the reaper already returns a dead replica's).
CREATE TABLE provider_buckets (
    provider text PRIMARY KEY,
    tokens double precision,          -- NULL: a full bucket
    updated_at timestamptz,
    open_until timestamptz,           -- NULL: closed
    failures integer NOT NULL DEFAULT 0,  -- consecutive retryable failures
    reason text                       -- why it opened, for the console and the logs
);

-- The running runs of one provider, counted on every limited claim.
CREATE INDEX runs_running_provider_idx ON runs (provider) WHERE status = 'running';

-- What a provider's fleet-wide limits leave for one claim of up to p_want runs: its running
-- runs below p_max, whole tokens of its rate bucket (p_rate per second, at most p_burst; NULL:
-- no rate limit), none while its breaker is open and one probe at a time while half-open.
-- It takes the provider's transaction advisory lock first, so claimers of one provider take
-- turns until each one's claim commits; being VOLATILE, its reads take a fresh snapshot after
-- the lock, so every claim committed before it is counted (a plain statement's snapshot is
-- older than any lock it waits for). Only reads: the claim statement writes the bucket back.
CREATE FUNCTION provider_admit(
    p_provider text, p_want integer, p_max integer, p_rate double precision,
    p_burst double precision, p_now timestamptz
) RETURNS TABLE (allowed integer, tokens double precision, running integer,
                 open_for double precision, half_open boolean, failures integer)
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
    allowed := least(p_want, p_max - running);
    IF tokens IS NOT NULL THEN
        allowed := least(allowed, floor(tokens + 1e-9)::integer);
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
