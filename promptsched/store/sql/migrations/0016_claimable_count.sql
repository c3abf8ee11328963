-- How many runs of a provider a claim could have taken had no other claimer held any: the
-- claim's own predicate (runs_claim_idx order, serial runs behind their predecessors), read
-- without SKIP LOCKED and capped at what the claim asked for. The claim statements call it
-- only when they came back short (docs/observability.md, contention). A function rather than
-- the statement's own subquery: Postgres planned that second copy of the claim's predicate
-- on every claim, a third of a 16-run claim's time (docs/performance.md). STABLE, so it reads
-- with the calling statement's snapshot, the claim's own moment; PL/pgSQL, so it is not
-- inlined back into the claim and its plan is kept per connection.
CREATE FUNCTION run_claimable_count(p_provider text, p_now timestamptz, p_limit integer)
RETURNS integer
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
