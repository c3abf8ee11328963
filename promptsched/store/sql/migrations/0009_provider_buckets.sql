-- Fleet-wide provider limits (docs/providers.md): the request-rate token bucket of each
-- provider, shared by every replica. Claimers of one provider serialize on a transaction
-- advisory lock, read the bucket and the provider's running runs, claim at most what both
-- allow, and write the bucket back; concurrency needs no row of its own (the running runs
-- are the count, and the reaper already returns a dead replica's).
CREATE TABLE provider_buckets (
    provider text PRIMARY KEY,
    tokens double precision NOT NULL,
    updated_at timestamptz NOT NULL
);

-- The running runs of one provider, counted on every limited claim.
CREATE INDEX runs_running_provider_idx ON runs (provider) WHERE status = 'running';
