-- A rush that outgrows the statistics of `runs` analyzes it at once, rather than a minute later
-- when autovacuum would. Every session's cached plans on `runs` are then built again for the
-- table as it is: a generic plan Postgres settled on while the table was nearly empty (asyncpg
-- prepares every statement; after five executions Postgres may keep a generic plan) scans
-- `runs` whole. Measured with 100,000 runs behind such plans: a 16-run claim took 13 ms instead
-- of 1 ms and its finish 9 ms instead of 1 ms, and the 100,000 rush drained in 50 s instead
-- of 12 (docs/performance.md, "Plans that outgrow their tables").
--
-- The scheduler calls it once a rush has written p_written rows (roles/scheduler.py). It
-- analyzes when the statistics hold fewer rows than that rush alone wrote, and returns the
-- row count the statistics held before (-1: never analyzed). SKIP_LOCKED: an ANALYZE or
-- VACUUM under way (autovacuum's, another replica's) is as good, and a rush never waits on
-- it. A role that does not own the table gets Postgres's warning and no analyze.
CREATE FUNCTION runs_analyze_outgrown(p_written bigint)
RETURNS real
LANGUAGE plpgsql
AS $$
DECLARE
    known real;
BEGIN
    SELECT c.reltuples INTO known FROM pg_class c WHERE c.oid = 'runs'::regclass;
    IF known < p_written THEN
        ANALYZE (SKIP_LOCKED) runs;
    END IF;
    RETURN known;
END
$$;
