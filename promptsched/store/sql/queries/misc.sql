-- name: clock_now
-- The one clock: the database's now(), unless a test pinned an instant.
SELECT coalesce($1::timestamptz, now());
