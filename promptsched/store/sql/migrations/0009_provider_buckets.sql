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
