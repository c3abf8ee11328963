-- Fair to every owner (docs/reliability.md, "Fair to every owner"): a claim interleaves the
-- owners whose runs wait, so one owner's backlog never starves another's due runs.
--
-- Each run carries its schedule's owner, written by whoever inserts it (the tick, a trigger,
-- a backfill, a replay). A run written without one (by the release before this one while
-- both run, or a follow-up's next check) has the owner '' and waits in a lane of its own.
-- A constant default: adding the column changes the catalog only (no rewrite, no scan), under
-- the migration's short lock_timeout; the previous release never names it.
ALTER TABLE runs ADD COLUMN owner text NOT NULL DEFAULT '';

-- A claim while several owners have runs waiting for provider p_provider: the ids of up to
-- p_limit runs, locked (SKIP LOCKED), taken round-robin from the owners' lanes: every owner's
-- first run in claim order (available_at, id), then every owner's second, and so on. The
-- owners come from a loose scan of runs_owner_claim_idx, one probe per owner from the end of
-- its lane (its newest runs wait; the front of a lane being drained is the entries of runs
-- claimed since the last vacuum). Each lane is read up to p_limit runs, so a claim costs and
-- locks up to p_limit runs per waiting owner until it commits; it takes p_limit of them.
-- The predicate is the claim's own (run_claim_batch, run_claimable_count); keep them the
-- same. PL/pgSQL, as run_claimable_count: planned apart from the claim, whose generic plan
-- then stays cheap, and run only when the claim finds a second owner waiting.
CREATE FUNCTION run_claim_lanes(p_provider text, p_now timestamptz, p_limit integer)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
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

-- Runs each owner's schedules were made due in a minute (PROMPTSCHED_OWNER_RUNS_PER_MINUTE:
-- schedule_tick defers what is past it to a later minute). One row per writer (shard: the
-- backend), summed when read, so two batches of one owner at once never wait for each
-- other's commit; the tick prunes an owner's rows older than an hour.
CREATE TABLE owner_minutes (
    owner  text        NOT NULL,
    minute timestamptz NOT NULL,
    shard  integer     NOT NULL,
    runs   integer     NOT NULL,
    PRIMARY KEY (owner, minute, shard)
);

-- promptsched: step no-transaction
-- The claim's lanes: one per (provider, owner), each in the claim order of runs_claim_idx.
-- Partial on pending, as runs_claim_idx: a claimed run leaves both, and only an insert (or a
-- run back to pending) writes an entry here. Built without blocking the writes to runs.
CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_owner_claim_idx
ON runs (provider, owner, available_at, id) WHERE status = 'pending';
