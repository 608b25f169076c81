-- The node store's catalogue: views over the Parquet shards under the home directory DIR.
-- Paths are relative to DIR here; trace_core.store makes them absolute under DIR when it writes
-- the catalogue DIR/trace.duckdb (so it answers from any working directory).
-- Every table directory holds an empty _schema.parquet, so each view binds with the declared
-- columns before any data exists; union_by_name lets newer shards carry extra columns.

CREATE OR REPLACE VIEW nodes AS
SELECT * FROM read_parquet('shards/nodes/**/*.parquet', union_by_name = true);

CREATE OR REPLACE VIEW prompts AS
SELECT * FROM read_parquet('shards/prompts/**/*.parquet', union_by_name = true);

CREATE OR REPLACE VIEW iterations AS
SELECT * FROM read_parquet('shards/iterations/**/*.parquet', union_by_name = true);

CREATE OR REPLACE VIEW predictions AS
SELECT * FROM read_parquet('shards/predictions/**/*.parquet', union_by_name = true);

CREATE OR REPLACE VIEW runs AS
SELECT * FROM read_parquet('shards/runs/**/*.parquet', union_by_name = true);

-- One row per generated trajectory (raw rollout or prefix continuation).
-- anchor_id: the node it branched from (the prompt's root for raw rollouts, a prefix node for
-- continuations). Its group: every trajectory with the same anchor, plus, for a prefix anchor,
-- the trajectory that passes through the anchor (the raw rollout the continuations contrast
-- with). A trajectory is effective when a group it belongs to holds both outcomes: its own
-- anchor's group, or, for a raw rollout, a branch group it owns; wasted otherwise (a group of
-- one is zero-contrast). Unverified rewards are ignored. trace_core.metrics.trajectory_table
-- computes the same in Python (the flow's metric); tests check that they agree.
CREATE OR REPLACE VIEW trajectories AS
WITH steps AS (
    SELECT
        run_id, strategy, iteration, trajectory_id, node_id, parent_id, prompt_id, task,
        difficulty, depth, origin, is_leaf, reward, new_tokens
    FROM nodes
    WHERE trajectory_id IS NOT NULL AND depth > 0
),

per_trajectory AS (
    -- the per-trajectory attributes are group keys rather than any_value() aggregates: every
    -- node of a trajectory shares them, and keys are ~25% cheaper for DuckDB (bench_store.py)
    SELECT
        run_id,
        iteration,
        trajectory_id,
        strategy,
        prompt_id,
        task,
        difficulty,
        origin,
        arg_min(parent_id, depth) AS anchor_id,
        min(depth) - 1 AS anchor_depth,
        max(reward) FILTER (WHERE is_leaf) AS reward,
        count(*) AS turns,
        coalesce(sum(new_tokens), 0)::BIGINT AS tokens
    FROM steps
    GROUP BY run_id, iteration, trajectory_id, strategy, prompt_id, task, difficulty, origin
),

anchor_owners AS (
    SELECT DISTINCT
        c.run_id,
        c.iteration,
        c.anchor_id,
        s.trajectory_id AS owner_id
    FROM per_trajectory AS c
    INNER JOIN steps AS s
        ON s.run_id = c.run_id AND s.iteration = c.iteration AND s.node_id = c.anchor_id
    WHERE c.anchor_depth > 0
),

members AS (
    SELECT run_id, iteration, anchor_id, reward FROM per_trajectory
    UNION ALL
    SELECT o.run_id, o.iteration, o.anchor_id, t.reward
    FROM anchor_owners AS o
    INNER JOIN per_trajectory AS t
        ON t.run_id = o.run_id AND t.iteration = o.iteration AND t.trajectory_id = o.owner_id
),

anchor_groups AS (
    SELECT
        run_id,
        iteration,
        anchor_id,
        count(*) AS group_size,
        coalesce(max(reward) > min(reward), false) AS contrastive
    FROM members
    GROUP BY run_id, iteration, anchor_id
),

credited AS (  -- raw trajectories that own a contrastive branch group
    SELECT DISTINCT o.run_id, o.iteration, o.owner_id AS trajectory_id
    FROM anchor_owners AS o
    INNER JOIN anchor_groups AS g
        ON g.run_id = o.run_id AND g.iteration = o.iteration AND g.anchor_id = o.anchor_id
    WHERE g.contrastive
)

SELECT
    t.run_id, t.strategy, t.iteration, t.trajectory_id, t.prompt_id, t.task, t.difficulty,
    t.origin, t.anchor_id, t.anchor_depth, t.reward, t.turns, t.tokens,
    g.group_size,
    g.contrastive OR c.trajectory_id IS NOT NULL AS effective,
    NOT (g.contrastive OR c.trajectory_id IS NOT NULL) AS wasted
FROM per_trajectory AS t
INNER JOIN anchor_groups AS g
    ON g.run_id = t.run_id AND g.iteration = t.iteration AND g.anchor_id = t.anchor_id
LEFT JOIN credited AS c
    ON c.run_id = t.run_id AND c.iteration = t.iteration AND c.trajectory_id = t.trajectory_id;

-- One row per sampling group, the unit the named queries count in (far cheaper than the
-- per-trajectory view over millions of nodes; the same definitions, checked against it in
-- tests/store/test_store_queries.py):
--   * raw groups: the raw rollouts of one prompt in one iteration (anchor: the prompt's root),
--     anchor_id NULL, anchor_depth 0;
--   * extension groups: the continuations from one prefix node plus the raw rollout through it.
-- trajectories / tokens / successes count the group's own generated trajectories (the owner of
-- an extension group is counted in its raw group). contrastive: rewards in the group differ.
-- effective / effective_tokens: the group's own trajectories that are effective (trajectories
-- view): all of them in a contrastive group; in a zero-contrast raw group, the raw rollouts that
-- own a contrastive branch group.
CREATE OR REPLACE VIEW trajectory_groups AS
WITH raw_groups AS (
    SELECT
        run_id, strategy, iteration, prompt_id, task, difficulty,
        count(*) FILTER (WHERE is_leaf) AS trajectories,
        coalesce(sum(new_tokens), 0)::BIGINT AS tokens,
        sum(reward) FILTER (WHERE is_leaf) AS successes,
        coalesce(max(reward) FILTER (WHERE is_leaf) > min(reward) FILTER (WHERE is_leaf), false) AS contrastive
    FROM nodes
    WHERE origin = 'raw'
    GROUP BY run_id, strategy, iteration, prompt_id, task, difficulty
),

extensions AS (
    SELECT
        run_id, strategy, iteration, prompt_id, task, difficulty, trajectory_id,
        arg_min(parent_id, depth) AS anchor_id,
        min(depth) - 1 AS anchor_depth,
        max(reward) FILTER (WHERE is_leaf) AS reward,
        coalesce(sum(new_tokens), 0)::BIGINT AS tokens
    FROM nodes
    WHERE origin = 'extension'
    GROUP BY run_id, strategy, iteration, prompt_id, task, difficulty, trajectory_id
),

anchors AS (
    SELECT DISTINCT run_id, iteration, anchor_id FROM extensions
),

anchor_owners AS (  -- the trajectory each anchor (prefix node) lies on
    SELECT n.run_id, n.iteration, n.node_id AS anchor_id, n.trajectory_id AS owner_id
    FROM nodes AS n
    INNER JOIN anchors AS a
        ON n.run_id = a.run_id AND n.iteration = a.iteration AND n.node_id = a.anchor_id
),

owner_rewards AS (
    SELECT o.run_id, o.iteration, o.anchor_id, max(n.reward) AS owner_reward
    FROM nodes AS n
    INNER JOIN anchor_owners AS o
        ON n.run_id = o.run_id AND n.iteration = o.iteration AND n.trajectory_id = o.owner_id
    WHERE n.is_leaf
    GROUP BY o.run_id, o.iteration, o.anchor_id
),

extension_groups AS (
    SELECT
        e.run_id, e.strategy, e.iteration, e.prompt_id, e.task, e.difficulty, e.anchor_id,
        min(e.anchor_depth) AS anchor_depth,
        count(*) AS trajectories,
        sum(e.tokens)::BIGINT AS tokens,
        sum(e.reward) AS successes,
        coalesce(
            greatest(max(e.reward), any_value(o.owner_reward)) > least(min(e.reward), any_value(o.owner_reward)),
            false
        ) AS contrastive
    FROM extensions AS e
    LEFT JOIN owner_rewards AS o
        ON e.run_id = o.run_id AND e.iteration = o.iteration AND e.anchor_id = o.anchor_id
    GROUP BY e.run_id, e.strategy, e.iteration, e.prompt_id, e.task, e.difficulty, e.anchor_id
),

raw_trajectories AS (
    SELECT run_id, iteration, prompt_id, trajectory_id, coalesce(sum(new_tokens), 0)::BIGINT AS tokens
    FROM nodes
    WHERE origin = 'raw' AND depth > 0
    GROUP BY run_id, iteration, prompt_id, trajectory_id
),

credit AS (  -- per raw group: its rollouts that own a contrastive branch group
    SELECT r.run_id, r.iteration, r.prompt_id, count(*) AS trajectories, sum(r.tokens)::BIGINT AS tokens
    FROM raw_trajectories AS r
    INNER JOIN (
        SELECT DISTINCT o.run_id, o.iteration, o.owner_id
        FROM anchor_owners AS o
        INNER JOIN extension_groups AS g
            ON g.run_id = o.run_id AND g.iteration = o.iteration AND g.anchor_id = o.anchor_id
        WHERE g.contrastive
    ) AS c ON c.run_id = r.run_id AND c.iteration = r.iteration AND c.owner_id = r.trajectory_id
    GROUP BY r.run_id, r.iteration, r.prompt_id
)

SELECT
    g.run_id, g.strategy, g.iteration, g.prompt_id, g.task, g.difficulty, 'raw' AS origin,
    NULL::VARCHAR AS anchor_id, 0 AS anchor_depth, g.trajectories, g.tokens, g.successes, g.contrastive,
    CASE WHEN g.contrastive THEN g.trajectories ELSE coalesce(c.trajectories, 0) END AS effective,
    CASE WHEN g.contrastive THEN g.tokens ELSE coalesce(c.tokens, 0) END::BIGINT AS effective_tokens
FROM raw_groups AS g
LEFT JOIN credit AS c ON c.run_id = g.run_id AND c.iteration = g.iteration AND c.prompt_id = g.prompt_id
UNION ALL
SELECT
    run_id, strategy, iteration, prompt_id, task, difficulty, 'extension' AS origin,
    anchor_id, anchor_depth, trajectories, tokens, successes, contrastive,
    CASE WHEN contrastive THEN trajectories ELSE 0 END AS effective,
    CASE WHEN contrastive THEN tokens ELSE 0 END::BIGINT AS effective_tokens
FROM extension_groups;

-- The trajectory_groups of one run, or of every run when run_filter is NULL: the scope every
-- named query over groups starts from, written once (`FROM scoped_groups($run_id::VARCHAR)`).
-- A table macro is expanded into the query that calls it, so the filter still reaches the scan.
CREATE OR REPLACE MACRO scoped_groups(run_filter) AS TABLE
SELECT *
FROM trajectory_groups
WHERE run_filter IS NULL OR run_id = run_filter;

-- The predictions of one run (every run when run_filter is NULL) whose outcome is known, a
-- missing weight counting as one outcome: what the predictor-quality queries score.
CREATE OR REPLACE MACRO scored_predictions(run_filter) AS TABLE
SELECT * REPLACE (coalesce(weight, 1.0) AS weight)
FROM predictions
WHERE (run_filter IS NULL OR run_id = run_filter)
    AND v_pred IS NOT NULL AND outcome IS NOT NULL;
