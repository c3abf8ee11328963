-- name: leader_acquire
-- Take duty $1 for holder $2 until now + $3 when nobody holds it or the holder's term has
-- expired, or renew it when $2 holds it already; a row back means $2 leads. One statement,
-- so it is correct through any pooler: when two replicas race for a free or expired row,
-- the second waits on the first's row lock and then re-checks the WHERE against the row the
-- first wrote, whose fresh expiry makes it fail.
INSERT INTO leaders AS l (name, holder, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, coalesce($4::timestamptz, now()), coalesce($4::timestamptz, now()),
        coalesce($4::timestamptz, now()) + $3::interval)
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder,
    term = CASE WHEN l.holder = excluded.holder THEN l.term ELSE l.term + 1 END,
    acquired_at = CASE WHEN l.holder = excluded.holder THEN l.acquired_at
                       ELSE excluded.acquired_at END,
    renewed_at = excluded.renewed_at,
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at <= excluded.renewed_at
RETURNING term;

-- name: leader_release
-- Step down at once (a clean stop), so another replica need not wait for the expiry.
DELETE FROM leaders WHERE name = $1 AND holder = $2;

-- name: stats_queue_depth
-- Running runs, and those whose lease or deadline has passed, through runs_lease_idx (a run
-- holds a lease exactly while it runs, 0026_lease_means_running.sql): finished history,
-- however large, is never scanned. Pending runs are stats_pending_runs.
SELECT
    (SELECT count(*) FROM runs WHERE lease_expires_at IS NOT NULL)::bigint AS running,
    (SELECT count(*) FROM runs
     WHERE lease_expires_at IS NOT NULL
       AND lease_expires_at < coalesce($1::timestamptz, now()))::bigint
        AS lease_expired,
    (SELECT count(*) FROM runs
     WHERE lease_expires_at IS NOT NULL
       AND deadline_at < coalesce($1::timestamptz, now()))::bigint
        AS deadline_passed;

-- name: stats_pending_runs
-- Pending runs by provider, read through runs_claim_idx (only pending rows): due later
-- (`scheduled`: retry backoff, jitter), due but waiting behind an earlier unfinished run of
-- their own schedule (`waiting`: overlap buffer_*, the claim's own predicate, see
-- run_claim_batch), and `ready`, with how long the oldest ready run has been claimable: since
-- its available_at, or for a serial run since its predecessor finished, if that was later.
-- Whether a provider's fleet-wide limits leave room for the ready runs is stats_provider_room.
WITH pending AS (
    SELECT r.provider, r.available_at, r.serial, r.schedule_id, r.slot,
           r.available_at > coalesce($1::timestamptz, now()) AS later
    FROM runs r
    WHERE r.status = 'pending'
), classed AS (
    SELECT p.provider, p.later,
           NOT p.later AND p.serial AND EXISTS (
               SELECT 1 FROM runs o
               WHERE o.schedule_id = p.schedule_id AND o.status IN ('pending', 'running')
                 AND o.slot < p.slot) AS behind,
           p.available_at, p.serial, p.schedule_id, p.slot
    FROM pending p
)
SELECT s.provider,
       count(*) FILTER (WHERE s.later)::bigint AS scheduled,
       count(*) FILTER (WHERE s.behind)::bigint AS waiting,
       count(*) FILTER (WHERE NOT s.later AND NOT s.behind)::bigint AS ready,
       coalesce(extract(epoch FROM coalesce($1::timestamptz, now()) - min(
           CASE WHEN s.later OR s.behind THEN NULL
                WHEN NOT s.serial THEN s.available_at
                ELSE greatest(s.available_at, (
                    SELECT o.finished_at FROM runs o
                    WHERE o.schedule_id = s.schedule_id AND o.slot < s.slot
                    ORDER BY o.slot DESC LIMIT 1))
           END)), 0)::float8 AS oldest_ready
FROM classed s
GROUP BY s.provider;

-- name: stats_provider_room
-- How many of the ready runs (`want`) of each provider with fleet-wide limits the next claim
-- would be allowed: provider_admit, the claim's own admission (run_claim_limited), with its
-- running runs, rate and LLM-token buckets, breaker, concurrency ramp and header pacing
-- (`promptsched status` shows them all). It takes each provider's advisory lock for this
-- statement only (a claimer waits a moment) and writes nothing.
SELECT l.provider, a.allowed, a.running, a.tokens, a.open_for, a.half_open, a.llm_tokens,
       a.failures, a.paced_for, a.ramp
FROM unnest($2::text[], $3::int[], $4::int[], $5::float8[], $6::float8[], $7::float8[])
         AS l(provider, want, max_concurrency, rate, burst, tokens_per_minute)
CROSS JOIN LATERAL provider_admit(l.provider, l.want, l.max_concurrency, l.rate, l.burst,
                                  l.tokens_per_minute, coalesce($1::timestamptz, now())) a
ORDER BY l.provider;

-- name: stats_outbox_depth
-- Undelivered notifications by status; each status has its own partial index (outbox_claim_idx,
-- outbox_lease_idx, outbox_dead_idx), so sent history is never scanned.
SELECT status, count(*)::bigint AS count
FROM outbox
WHERE status IN ('pending', 'sending', 'dead')
GROUP BY status;
