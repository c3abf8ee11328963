-- How many runs of each provider are running, kept as counters by the writes that start and
-- end them, so that a limited claim (provider_admit) reads a few counter rows instead of
-- counting every running run of its provider: at 2,000 runs in flight that count read 5,500
-- rows per claim, at 7,500 in flight 15,600 (docs/performance.md, "Plans that stay right").
--
-- Triggers keep the counters, so no way of starting or ending a run can forget them: the
-- claims, the finish, a retry, the drain's release, the reaper, a schedule deleted with its
-- runs, and any statement written later. A statement-level trigger reads the rows an UPDATE
-- changed (its transition tables) and adds, per provider, how many started running and how
-- many stopped; rows inserted or deleted while running (rare: a schedule deleted while its
-- runs run) are counted one by one. Each counter is one row that only grows, and a run's
-- start and its end are counted on different rows, in one of 16 shards chosen by the
-- worker, so a finish waiting for its commit never holds up a claim, and two replicas'
-- finishes share a row only when their workers hash alike. The count of a provider is its
-- started less its ended, summed over at most 32 rows.
CREATE TABLE provider_running (
    provider text    NOT NULL,
    shard    integer NOT NULL,
    side     text    NOT NULL CHECK (side IN ('started', 'ended')),
    runs     bigint  NOT NULL,
    PRIMARY KEY (provider, side, shard)
);

-- Whatever ran before this migration (it holds runs' lock while it counts them).
LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO provider_running (provider, shard, side, runs)
SELECT provider, hashtext(coalesce(worker_id, '')) & 15, 'started', count(*)
FROM runs WHERE status = 'running'
GROUP BY 1, 2;

CREATE FUNCTION provider_running_count(p_provider text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(CASE WHEN side = 'started' THEN runs ELSE -runs END), 0)::integer
    FROM provider_running WHERE provider = p_provider
$$;

CREATE FUNCTION provider_running_add(p_provider text, p_worker text, p_side text, p_runs bigint)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO provider_running AS c (provider, shard, side, runs)
    VALUES (p_provider, hashtext(coalesce(p_worker, '')) & 15, p_side, p_runs)
    ON CONFLICT (provider, side, shard) DO UPDATE SET runs = c.runs + excluded.runs
$$;

CREATE FUNCTION runs_count_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- In key order, so that two statements never wait on each other's counter rows crosswise.
    INSERT INTO provider_running AS c (provider, shard, side, runs)
    SELECT t.provider, t.shard, t.side, count(*)
    FROM (
        SELECT n.provider, hashtext(coalesce(n.worker_id, '')) & 15 AS shard,
               'started' AS side
        FROM new_runs n JOIN old_runs o ON o.id = n.id
        WHERE n.status = 'running' AND o.status <> 'running'
        UNION ALL
        SELECT o.provider, hashtext(coalesce(o.worker_id, '')) & 15, 'ended'
        FROM old_runs o JOIN new_runs n ON n.id = o.id
        WHERE o.status = 'running' AND n.status <> 'running'
    ) AS t
    GROUP BY t.provider, t.side, t.shard
    ORDER BY t.provider, t.side, t.shard
    ON CONFLICT (provider, side, shard) DO UPDATE SET runs = c.runs + excluded.runs;
    RETURN NULL;
END
$$;

CREATE FUNCTION runs_count_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM provider_running_add(NEW.provider, NEW.worker_id, 'started', 1);
    ELSE
        PERFORM provider_running_add(OLD.provider, OLD.worker_id, 'ended', 1);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_count_update AFTER UPDATE ON runs
    REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION runs_count_changed();
CREATE TRIGGER runs_count_insert AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.status = 'running') EXECUTE FUNCTION runs_count_row();
CREATE TRIGGER runs_count_delete AFTER DELETE ON runs
    FOR EACH ROW WHEN (OLD.status = 'running') EXECUTE FUNCTION runs_count_row();

CREATE FUNCTION runs_count_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM provider_running;
    RETURN NULL;
END
$$;
CREATE TRIGGER runs_count_truncate AFTER TRUNCATE ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION runs_count_truncated();

-- provider_admit as in 0023_provider_weather.sql, its running runs read from the counters.
CREATE OR REPLACE FUNCTION provider_admit(
    p_provider text, p_want integer, p_max integer, p_rate double precision,
    p_burst double precision, p_tpm double precision, p_now timestamptz
) RETURNS TABLE (allowed integer, tokens double precision, running integer,
                 open_for double precision, half_open boolean, failures integer,
                 llm_tokens double precision, paced_for double precision,
                 ramp double precision)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    b provider_buckets%ROWTYPE;
    now_ timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('promptsched.provider:' || p_provider, 0));
    running := provider_running_count(p_provider);
    SELECT * INTO b FROM provider_buckets pb WHERE pb.provider = p_provider;
    failures := coalesce(b.failures, 0);
    open_for := greatest(0.0, coalesce(extract(epoch FROM b.open_until - now_), 0.0));
    half_open := b.open_until IS NOT NULL AND b.open_until <= now_;
    paced_for := greatest(0.0, coalesce(extract(epoch FROM b.paced_until - now_), 0.0));
    ramp := b.ramp;
    tokens := CASE WHEN p_rate IS NULL THEN NULL
                   WHEN b.tokens IS NULL THEN p_burst
                   ELSE least(p_burst, b.tokens + p_rate * greatest(0.0,
                                extract(epoch FROM now_ - b.updated_at)::double precision))
              END;
    llm_tokens := CASE WHEN p_tpm IS NULL THEN NULL
                       WHEN b.llm_tokens IS NULL THEN p_tpm / 60
                       ELSE least(p_tpm / 60, b.llm_tokens + p_tpm / 60 * greatest(0.0,
                                    extract(epoch FROM now_ - b.llm_updated_at)::double precision))
                  END;
    allowed := least(p_want, p_max - running);
    IF ramp IS NOT NULL THEN
        allowed := least(allowed, floor(ramp + 1e-6)::integer - running);
    END IF;
    IF tokens IS NOT NULL THEN
        allowed := least(allowed, floor(tokens + 1e-9)::integer);
    END IF;
    IF llm_tokens IS NOT NULL AND llm_tokens <= 0 THEN
        allowed := 0;
    END IF;
    IF paced_for > 0 THEN
        allowed := 0;
    END IF;
    IF open_for > 0 THEN
        allowed := 0;
    ELSIF half_open THEN
        allowed := least(allowed, 1 - running);
    END IF;
    allowed := greatest(allowed, 0);
    RETURN NEXT;
END;
$$;
