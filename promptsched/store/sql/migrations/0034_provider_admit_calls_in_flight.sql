-- The fleet's concurrency limit of a provider counts calls in flight (docs/providers.md,
-- "What the concurrency limit counts"). A run stays `running` until its final write commits,
-- after its call returned; a claimer passes the runs of its own whose call has returned and
-- whose final write is not known to have committed ($10 ids, $11 their attempts), and
-- provider_admit counts those out of the provider's running runs, everywhere it uses them (the
-- limit, the ramp, the half-open probe). The claimer's slot and permit are then free at call
-- return, not after the final write's queue, write and commit (W9, docs/performance.md).
-- A claimer passes only attempts that reported to the breaker already (Fleet.report), so a
-- half-open breaker still sees its probe either running or reported, never neither.
DROP FUNCTION provider_admit(text, integer, integer, double precision, double precision,
                             double precision, timestamptz);

-- provider_admit as in 0030_provider_learned_rate.sql, and also: the claimer's returned calls
-- do not count as running.
CREATE FUNCTION provider_admit(
    p_provider text, p_want integer, p_max integer, p_rate double precision,
    p_burst double precision, p_tpm double precision, p_now timestamptz,
    p_returned bigint[] DEFAULT NULL, p_returned_attempts uuid[] DEFAULT NULL
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
