-- name: token_insert
-- Only the sha256 of the token is stored; the token itself is shown once, by the caller.
INSERT INTO api_tokens (owner, admin, token_hash, name)
VALUES ($1, $2, $3, $4)
RETURNING id, owner, admin, name, created_at, last_used_at, revoked_at;

-- name: token_authenticate
-- The live token with this hash. last_used_at is written at most once a minute per token, so
-- a busy client does not turn every request into a row update.
WITH found AS (
    SELECT id, owner, admin, last_used_at
    FROM api_tokens
    WHERE token_hash = $1 AND revoked_at IS NULL
), touched AS (
    UPDATE api_tokens t
    SET last_used_at = coalesce($2::timestamptz, now())
    FROM found f
    WHERE t.id = f.id
      AND (f.last_used_at IS NULL
           OR f.last_used_at < coalesce($2::timestamptz, now()) - interval '1 minute')
)
SELECT id, owner, admin FROM found;

-- name: token_list
SELECT id, owner, admin, name, created_at, last_used_at, revoked_at
FROM api_tokens
WHERE ($1::text IS NULL OR owner = $1)
ORDER BY id;

-- name: token_revoke
UPDATE api_tokens
SET revoked_at = coalesce($2::timestamptz, now())
WHERE id = $1 AND revoked_at IS NULL
RETURNING id, owner, admin, name, created_at, last_used_at, revoked_at;

-- name: console_session_start
-- A new console session for a live token, until now + $3; sessions that expired a day ago are
-- deleted on the way (a login is rare, the index finds them). Nothing back: the token is gone.
WITH forgotten AS (
    DELETE FROM console_sessions
    WHERE expires_at < coalesce($4::timestamptz, now()) - interval '1 day'
)
INSERT INTO console_sessions (secret_hash, token_id, created_at, expires_at)
SELECT $1, t.id, coalesce($4::timestamptz, now()), coalesce($4::timestamptz, now()) + $3::interval
FROM api_tokens t
WHERE t.id = $2 AND t.revoked_at IS NULL
RETURNING id;

-- name: console_session_authenticate
-- The session with this secret's hash while it and its token live, with the token's principal.
SELECT c.id AS session_id, t.id, t.owner, t.admin
FROM console_sessions c
JOIN api_tokens t ON t.id = c.token_id
WHERE c.secret_hash = $1 AND c.ended_at IS NULL
  AND c.expires_at > coalesce($2::timestamptz, now()) AND t.revoked_at IS NULL;

-- name: console_session_end
-- Log out: the session ends at once (again: nothing changes).
UPDATE console_sessions SET ended_at = coalesce($2::timestamptz, now())
WHERE secret_hash = $1 AND ended_at IS NULL;

-- name: run_stream_check
-- What an open event stream checks every second: its run's status (NULL: gone, or not the
-- owner's) and whether the token it was opened with (and its console session, $4 NOT NULL)
-- still lives. Revoking the token or logging out ends the stream on whichever replica serves it.
SELECT (SELECT r.status FROM runs r JOIN schedules s ON s.id = r.schedule_id
        WHERE r.id = $1 AND ($2::text IS NULL OR s.owner = $2)) AS status,
       EXISTS (SELECT 1 FROM api_tokens t WHERE t.id = $3 AND t.revoked_at IS NULL)
       AND ($4::bigint IS NULL OR EXISTS (
            SELECT 1 FROM console_sessions c
            WHERE c.id = $4 AND c.ended_at IS NULL
              AND c.expires_at > coalesce($5::timestamptz, now()))) AS live;
