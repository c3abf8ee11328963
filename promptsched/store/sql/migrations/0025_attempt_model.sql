-- Each attempt shows the model it used, also when neither the schedule nor its route's place
-- names one (the provider's default model): a success records it in runs.model
-- (run_finish_many), and the run_attempts view shows it for succeeded rows. A run still
-- pending or running keeps runs.model as its route's place model (NULL on place 0: the
-- schedule's model), as in 0023_provider_weather.sql; rows that succeeded before this
-- migration show the schedule's model, as before.
CREATE OR REPLACE VIEW run_attempts AS
SELECT e.attempt_id, e.run_id, e.number, e.worker_id, e.status, e.started_at, e.finished_at,
       e.error,
       coalesce((SELECT jsonb_agg(s.entry ORDER BY s.id) FROM attempt_steps s
                 WHERE s.run_id = e.run_id AND s.attempt_id = e.attempt_id),
                '[]'::jsonb) AS transcript,
       e.usage, e.provider, e.model, e.throttled, e.wait
FROM ended_attempts e
UNION ALL
SELECT r.attempt_id, r.id, r.attempts, r.worker_id, r.status, r.attempt_started_at,
       r.finished_at, NULL::text,
       coalesce((SELECT jsonb_agg(s.entry ORDER BY s.id) FROM attempt_steps s
                 WHERE s.run_id = r.id AND s.attempt_id = r.attempt_id),
                '[]'::jsonb),
       r.usage, r.provider,
       CASE WHEN r.status = 'succeeded' AND r.model IS NOT NULL THEN r.model
            WHEN r.route = 0 THEN (SELECT sc.model FROM schedules sc WHERE sc.id = r.schedule_id)
            ELSE r.model END,
       false, NULL::interval
FROM runs r
WHERE r.status IN ('running', 'succeeded') AND r.attempt_id IS NOT NULL;
