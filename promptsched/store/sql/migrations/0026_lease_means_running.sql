-- A run holds a lease exactly while it runs, and the lease index is defined by the lease
-- itself, so that the reaper's reads can use no other index (docs/performance.md, "Plans
-- that stay right").
--
-- runs_lease_idx was partial on status = 'running'. Any statement asking for running runs
-- could then also be served by runs_unfinished_idx (pending or running), and under the
-- statistics a table with history usually has (running runs too few to be in them, so one
-- row is expected) Postgres took that one: the reap and the reaper's wake-up read every
-- pending and running run, at 2,500 in flight 15,000 rows where a few would do. Defined by
-- `lease_expires_at IS NOT NULL`, the index is the only one a condition on the lease can use.
--
-- Every way out of `running` (finish, retry, release, reap) already clears the lease; the
-- new constraint makes it the rule, so a lease is also proof that the run is running.
--
-- Online (docs/deploying.md, "Upgrading"): the steps below leave the schema this file always
-- made, without holding `runs` for the length of a scan. The clean-up takes only row locks; the
-- constraint is added NOT VALID (a moment's ACCESS EXCLUSIVE) and validated apart (SHARE UPDATE
-- EXCLUSIVE: the fleet reads and writes on); the index is built CONCURRENTLY under another name
-- before the old one goes, so a lease is never without its index.
-- promptsched: step
UPDATE runs SET lease_expires_at = NULL
WHERE status <> 'running' AND lease_expires_at IS NOT NULL;

-- promptsched: step
ALTER TABLE runs ADD CONSTRAINT runs_lease_only_while_running
    CHECK (lease_expires_at IS NULL OR status = 'running') NOT VALID;

-- promptsched: step
ALTER TABLE runs VALIDATE CONSTRAINT runs_lease_only_while_running;

-- promptsched: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_lease_next_idx
    ON runs (lease_expires_at) WHERE lease_expires_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS runs_lease_idx;
ALTER INDEX runs_lease_next_idx RENAME TO runs_lease_idx;
