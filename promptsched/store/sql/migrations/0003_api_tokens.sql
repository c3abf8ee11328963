-- API bearer tokens, stored as the sha256 of a high-entropy random token (never the token),
-- each scoped to an owner; an admin token sees every owner's schedules and runs.

CREATE TABLE api_tokens (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner        text        NOT NULL CHECK (owner <> ''),
    admin        boolean     NOT NULL DEFAULT false,
    -- hex sha256 of the token; the token itself is shown once, at creation
    token_hash   text        NOT NULL UNIQUE CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    name         text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX api_tokens_owner_idx ON api_tokens (owner, id);

-- A dead run is replayed at most once (a second replay request conflicts instead of running
-- the slot twice); a replay that dies in turn can itself be replayed.
CREATE UNIQUE INDEX runs_replay_key ON runs (replay_of) WHERE origin = 'replay';
