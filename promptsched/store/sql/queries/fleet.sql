-- name: replica_publish
-- A replica's row, written at start and renewed every publishing interval: its configuration,
-- its fingerprint and the attempts it runs now; alive until now + $9. started_at is kept from
-- the first write. Rows of replicas gone for a day are deleted on the way (a handful at most).
WITH forgotten AS (
    DELETE FROM replicas
    WHERE coalesce(stopped_at, alive_until) < coalesce($10::timestamptz, now()) - interval '1 day'
      AND id <> $1
)
INSERT INTO replicas AS r (id, host, version, roles, slots, config, fingerprint, in_flight,
                           started_at, seen_at, alive_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, coalesce($10::timestamptz, now()),
        coalesce($10::timestamptz, now()), coalesce($10::timestamptz, now()) + $9::interval)
ON CONFLICT (id) DO UPDATE
SET config = excluded.config,
    fingerprint = excluded.fingerprint,
    in_flight = excluded.in_flight,
    seen_at = excluded.seen_at,
    alive_until = excluded.alive_until,
    stopped_at = NULL;

-- name: replica_stop
-- A clean stop: the replica says so at once instead of letting alive_until run out.
UPDATE replicas SET stopped_at = coalesce($2::timestamptz, now()), in_flight = 0
WHERE id = $1;

-- name: replica_fingerprints
-- The fingerprints the live replicas publish, with how many publish each, most first.
SELECT fingerprint, count(*)::integer AS replicas
FROM replicas
WHERE stopped_at IS NULL AND alive_until > coalesce($1::timestamptz, now())
GROUP BY fingerprint
ORDER BY count(*) DESC, max(started_at) DESC;

-- name: replica_list
-- The live replicas (and those stopped or silent for less than $2), newest first, with the
-- duties each leads and the database's now.
SELECT r.id, r.host, r.version, r.roles, r.slots, r.config, r.fingerprint, r.in_flight,
       r.started_at, r.seen_at, r.alive_until, r.stopped_at,
       (r.stopped_at IS NULL AND r.alive_until > coalesce($1::timestamptz, now())) AS alive,
       coalesce((SELECT array_agg(l.name ORDER BY l.name) FROM leaders l
                 WHERE starts_with(l.holder, r.id || '/')
                   AND l.expires_at > coalesce($1::timestamptz, now())),
                '{}') AS leads,
       coalesce($1::timestamptz, now()) AS db_now
FROM replicas r
WHERE coalesce(r.stopped_at, r.alive_until) > coalesce($1::timestamptz, now()) - $2::interval
ORDER BY r.started_at DESC, r.id;
