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
