-- The fleet as each replica describes itself (ops/fleet.py, roles/presence.py): one row per
-- running process, written when it starts and renewed while it runs. `config` is the
-- replica's effective configuration without a secret, `fingerprint` a hash of the part every
-- replica should share; the CLI and the console check input against it, and `status` reports
-- replicas whose fingerprints differ. A replica is alive while `alive_until` (Postgres's clock,
-- a few of its publishing intervals ahead) has not passed and it has not said it stopped.
CREATE TABLE replicas (
    id           text PRIMARY KEY,  -- worker id and a token unique to the process's lifetime
    host         text NOT NULL,
    version      text NOT NULL,
    roles        text[] NOT NULL,
    slots        integer NOT NULL,
    config       jsonb NOT NULL,
    fingerprint  text NOT NULL,
    in_flight    integer NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL,
    seen_at      timestamptz NOT NULL,
    alive_until  timestamptz NOT NULL,
    stopped_at   timestamptz
);

CREATE INDEX replicas_alive_idx ON replicas (alive_until) WHERE stopped_at IS NULL;
