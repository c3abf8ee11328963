-- Console sessions (console/session.py): logging in with an API token starts a session whose
-- cookie holds a secret of its own, stored here as a sha256 hash like the tokens. Logging out
-- ends the session (its cookie is worthless from then on, wherever it was copied to), and an
-- open event stream of the session ends within a second or so on every replica, as it does
-- when the token itself is revoked (web/progress.py checks both while it streams).
CREATE TABLE console_sessions (
    id          bigserial PRIMARY KEY,
    secret_hash text NOT NULL UNIQUE,
    token_id    bigint NOT NULL REFERENCES api_tokens (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    ended_at    timestamptz
);

CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);
