-- Leadership of a fleet-wide duty (the stats gauges): one row per duty, held by one replica
-- until expires_at and renewed by its heartbeats. A row, not a session advisory lock, so that
-- leadership stays correct through a transaction pooler, where a session lock lands on
-- whichever server connection the statement happened to use (and stays there after a crash).
-- Every time in it is Postgres's (one clock).
CREATE TABLE leaders (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    -- Grows by one at each change of holder: tells a renewal from a new term.
    term        bigint NOT NULL DEFAULT 1,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT leaders_expiry_after_renewal CHECK (expires_at > renewed_at)
);
