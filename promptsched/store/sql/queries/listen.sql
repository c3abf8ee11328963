-- name: listen_check_notify
-- The listener's self-check: a notification sent the way every wake-up is sent (a pooled
-- connection, through the pooler if there is one), which must come back on the LISTEN
-- connection.
SELECT pg_notify('promptsched_listen_check', $1::text);
