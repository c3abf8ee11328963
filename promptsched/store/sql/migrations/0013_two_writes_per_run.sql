-- Two row writes per run (docs/performance.md, "The write path"). A run's latest attempt lives
-- in the run row itself: the claim writes its attempt_id, worker, lease and start there, and a
-- successful finish leaves them in place, so the happy path is the claim's update and the
-- finish's update of one row, and nothing else. An attempt is written to a row of its own once,
-- when it ends and the run row can no longer tell it: it failed (a retry, or dead), it was
-- lost, released, cancelled or skipped. `run_attempts` becomes the view that joins the two, so
-- every history query, the API and the console read one relation as before.
--
-- Transcripts leave the attempt row for insert-only rows keyed by attempt (an append no longer
-- rewrites a growing jsonb array, and needs no attempt row to exist while the attempt runs).

ALTER TABLE run_attempts RENAME TO ended_attempts;
ALTER TABLE ended_attempts RENAME CONSTRAINT run_attempts_pkey TO ended_attempts_pkey;
ALTER TABLE ended_attempts RENAME CONSTRAINT run_attempts_run_id_number_key
    TO ended_attempts_run_id_number_key;
ALTER TABLE ended_attempts RENAME CONSTRAINT run_attempts_run_id_fkey
    TO ended_attempts_run_id_fkey;

-- When the run's latest attempt started (runs.started_at stays the run's first start).
ALTER TABLE runs ADD COLUMN attempt_started_at timestamptz;

CREATE TABLE attempt_steps (
    run_id     bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    attempt_id uuid   NOT NULL,
    id         bigint GENERATED ALWAYS AS IDENTITY,
    entry      jsonb  NOT NULL,
    PRIMARY KEY (run_id, attempt_id, id)
);

INSERT INTO attempt_steps (run_id, attempt_id, entry)
SELECT e.run_id, e.attempt_id, t.entry
FROM ended_attempts e
CROSS JOIN LATERAL jsonb_array_elements(e.transcript) WITH ORDINALITY AS t (entry, n)
ORDER BY e.run_id, e.attempt_id, t.n;

-- The attempt a running or succeeded run still holds moves into the run row.
UPDATE runs r
SET attempt_started_at = e.started_at, worker_id = coalesce(r.worker_id, e.worker_id)
FROM ended_attempts e
WHERE e.attempt_id = r.attempt_id AND r.status IN ('running', 'succeeded');
DELETE FROM ended_attempts e
USING runs r
WHERE e.attempt_id = r.attempt_id AND r.status IN ('running', 'succeeded');

ALTER TABLE ended_attempts DROP COLUMN transcript;
ALTER TABLE ended_attempts ALTER COLUMN status DROP DEFAULT;
ALTER TABLE ended_attempts ALTER COLUMN started_at DROP DEFAULT;
ALTER TABLE ended_attempts DROP CONSTRAINT run_attempts_status_check;
ALTER TABLE ended_attempts ADD CONSTRAINT ended_attempts_status_check
    CHECK (status IN ('failed', 'lost', 'released', 'cancelled', 'skipped'));

-- Every attempt of every run, in the shape the attempt table had: the ended ones, then the
-- one a running or succeeded run holds. A query by run_id reaches both through their keys.
CREATE VIEW run_attempts AS
SELECT e.attempt_id, e.run_id, e.number, e.worker_id, e.status, e.started_at, e.finished_at,
       e.error,
       coalesce((SELECT jsonb_agg(s.entry ORDER BY s.id) FROM attempt_steps s
                 WHERE s.run_id = e.run_id AND s.attempt_id = e.attempt_id),
                '[]'::jsonb) AS transcript,
       e.usage
FROM ended_attempts e
UNION ALL
SELECT r.attempt_id, r.id, r.attempts, r.worker_id, r.status, r.attempt_started_at,
       r.finished_at, NULL::text,
       coalesce((SELECT jsonb_agg(s.entry ORDER BY s.id) FROM attempt_steps s
                 WHERE s.run_id = r.id AND s.attempt_id = r.attempt_id),
                '[]'::jsonb),
       r.usage
FROM runs r
WHERE r.status IN ('running', 'succeeded') AND r.attempt_id IS NOT NULL;

-- A limited claim counts the provider's running runs through runs_lease_idx (every running
-- run, a few per worker slot of the fleet): one index entry fewer per claim.
DROP INDEX runs_running_provider_idx;
