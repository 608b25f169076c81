-- The node store's catalogue: views over the Parquet shards under the home directory DIR.
-- Paths are relative to DIR here; trace_core.store makes them absolute under DIR when it writes
-- the catalogue DIR/trace.duckdb (so it answers from any working directory).
-- Shards sit in hive partitions named like the columns (shards/TABLE/run_id=R/iteration=N/), so
-- a filter on run_id or iteration skips the other files before reading them. Every table
-- directory holds an empty _schema.parquet, unioned in by name, so each view binds with the
-- declared columns before any data exists. Every data shard of a table holds exactly the declared
-- columns (trace_core.home.shards conforms them, and upgrades a home's older shards once when the
-- columns change), so a view binds from one file's footer, not all of them (union_by_name reads
-- every footer: ~0.4 s per 1,000 shards, on every query).

-- One row per rollout-tree node: the prompt's root, and the state after each agent turn (raw or extension).
CREATE OR REPLACE VIEW nodes AS
SELECT * FROM read_parquet('shards/nodes/_schema.parquet')
UNION ALL BY NAME
SELECT * FROM read_parquet('shards/nodes/run_id=*/iteration=*/*.parquet', hive_partitioning = true,
    hive_types = {'run_id': VARCHAR, 'iteration': INTEGER}, allow_empty = true);

-- One row per candidate prompt per iteration: predicted success, rollouts allocated, outcomes.
CREATE OR REPLACE VIEW prompts AS
SELECT * FROM read_parquet('shards/prompts/_schema.parquet')
UNION ALL BY NAME
SELECT * FROM read_parquet('shards/prompts/run_id=*/iteration=*/*.parquet', hive_partitioning = true,
    hive_types = {'run_id': VARCHAR, 'iteration': INTEGER}, allow_empty = true);

-- One row per iteration: budget asked and used, tokens, effective ratio, accuracy, loss, stage seconds.
CREATE OR REPLACE VIEW iterations AS
SELECT * FROM read_parquet('shards/iterations/_schema.parquet')
UNION ALL BY NAME
SELECT * FROM read_parquet('shards/iterations/run_id=*/iteration=*/*.parquet', hive_partitioning = true,
    hive_types = {'run_id': VARCHAR, 'iteration': INTEGER}, allow_empty = true);

-- One row per (evaluation, split, family): held-out accuracy after `iteration` iterations (0 = warm start).
CREATE OR REPLACE VIEW evaluations AS
SELECT * FROM read_parquet('shards/evaluations/_schema.parquet')
UNION ALL BY NAME
SELECT * FROM read_parquet('shards/evaluations/run_id=*/iteration=*/*.parquet', hive_partitioning = true,
    hive_types = {'run_id': VARCHAR, 'iteration': INTEGER}, allow_empty = true);

-- One row per prediction (a prompt's root or a prefix), made before its outcome was seen.
CREATE OR REPLACE VIEW predictions AS
SELECT * FROM read_parquet('shards/predictions/_schema.parquet')
UNION ALL BY NAME
SELECT * FROM read_parquet('shards/predictions/run_id=*/iteration=*/*.parquet', hive_partitioning = true,
    hive_types = {'run_id': VARCHAR, 'iteration': INTEGER}, allow_empty = true);

-- One row per sampling group, the unit the named queries count in: written once per iteration
-- beside its nodes (shards/trajectory_groups/.../summary.parquet, sorted by task and depth), so a
-- wasted-rollout question scans groups, not nodes. Columns and definitions as the
-- trajectory_groups_from_nodes view below; a home written before the summaries gets them when opened.
CREATE OR REPLACE VIEW trajectory_groups AS
SELECT * FROM read_parquet('shards/trajectory_groups/_schema.parquet')
UNION ALL BY NAME
SELECT * FROM read_parquet('shards/trajectory_groups/run_id=*/iteration=*/*.parquet', hive_partitioning = true,
    hive_types = {'run_id': VARCHAR, 'iteration': INTEGER}, allow_empty = true);

-- One row per prompt per iteration: its groups summed (trajectory_groups' columns of the same
-- names; wasted = trajectories - effective), written beside the group summary. Half the rows of
-- the group summaries: the named queries that need no group's depth or anchor read these, and so
-- does the one that groups by prompt (top_wasted_prompts: millions of distinct prompts in a long run).
CREATE OR REPLACE VIEW prompt_groups AS
SELECT * FROM read_parquet('shards/prompt_groups/_schema.parquet')
UNION ALL BY NAME
SELECT * FROM read_parquet('shards/prompt_groups/run_id=*/iteration=*/*.parquet', hive_partitioning = true,
    hive_types = {'run_id': VARCHAR, 'iteration': INTEGER}, allow_empty = true);

-- One row per run (its shard is rewritten when the run starts, finishes or fails).
CREATE OR REPLACE VIEW runs AS
SELECT * FROM read_parquet('shards/runs/_schema.parquet')
UNION ALL BY NAME
SELECT * FROM read_parquet('shards/runs/run_id=*/*.parquet', hive_partitioning = true,
    hive_types = {'run_id': VARCHAR}, allow_empty = true);

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
    NOT (g.contrastive OR c.trajectory_id IS NOT NULL) AS wasted,
    o.owner_id AS branched_from,  -- a continuation: the raw trajectory through its anchor
    CASE WHEN o.owner_id IS NOT NULL THEN t.reward IS DISTINCT FROM ow.reward END AS flipped  -- reward differs from it
FROM per_trajectory AS t
INNER JOIN anchor_groups AS g
    ON g.run_id = t.run_id AND g.iteration = t.iteration AND g.anchor_id = t.anchor_id
LEFT JOIN credited AS c
    ON c.run_id = t.run_id AND c.iteration = t.iteration AND c.trajectory_id = t.trajectory_id
LEFT JOIN anchor_owners AS o
    ON o.run_id = t.run_id AND o.iteration = t.iteration AND o.anchor_id = t.anchor_id
LEFT JOIN per_trajectory AS ow
    ON ow.run_id = o.run_id AND ow.iteration = o.iteration AND ow.trajectory_id = o.owner_id;

-- One row per sampling group computed from the nodes: the definitions of the trajectory_groups
-- summaries (what an iteration's writer stores, trace_core.home.groups), kept for drill-down and
-- to check them (every named query answers alike from both: tests/store/test_store_groups.py):
--   * raw groups: the raw rollouts of one prompt in one iteration (anchor: the prompt's root),
--     anchor_id NULL, anchor_depth 0;
--   * extension groups: the continuations from one prefix node plus the raw rollout through it.
-- trajectories / tokens / successes count the group's own generated trajectories (the owner of
-- an extension group is counted in its raw group, so sums over groups count each trajectory once);
-- group_size / group_successes count the whole group, the raw trajectory an extension group
-- branches from (owner_trajectory_id, owner_reward) included; flips: continuations whose reward
-- differs from the owner's. contrastive: rewards in the group differ.
-- effective / effective_tokens: the group's own trajectories that are effective (trajectories
-- view): all of them in a contrastive group; in a zero-contrast raw group, the raw rollouts that
-- own a contrastive branch group.
-- Every node carries its trajectory's anchor (anchor_id) and the trajectory through that anchor
-- (anchor_trajectory_id), so the groups come from one aggregation over the nodes; the owners'
-- rewards and tokens from a second, over the owners' nodes only. No join of nodes with nodes.
CREATE OR REPLACE VIEW trajectory_groups_from_nodes AS
WITH anchored AS (  -- one pass: every group, keyed by its anchor
    SELECT
        run_id,
        iteration,
        anchor_id,
        any_value(strategy) AS strategy,
        any_value(prompt_id) AS prompt_id,
        any_value(task) AS task,
        any_value(difficulty) AS difficulty,
        any_value(anchor_trajectory_id) AS owner_id,  -- NULL: the anchor is the root (a raw group)
        min(depth) - 1 AS anchor_depth,
        count(*) FILTER (WHERE is_leaf) AS trajectories,
        coalesce(sum(new_tokens), 0)::BIGINT AS tokens,
        sum(reward) FILTER (WHERE is_leaf) AS successes,
        max(reward) FILTER (WHERE is_leaf) AS max_reward,
        min(reward) FILTER (WHERE is_leaf) AS min_reward
    FROM nodes
    WHERE depth > 0 AND anchor_id IS NOT NULL
    GROUP BY run_id, iteration, anchor_id
),

owners AS (  -- the trajectories that extension groups branch from: reward, tokens, root
    SELECT
        run_id,
        iteration,
        trajectory_id AS owner_id,
        any_value(anchor_id) AS root_id,
        max(reward) FILTER (WHERE is_leaf) AS reward,
        coalesce(sum(new_tokens), 0)::BIGINT AS tokens
    FROM nodes
    WHERE depth > 0 AND trajectory_id IN (SELECT owner_id FROM anchored WHERE owner_id IS NOT NULL)
    GROUP BY run_id, iteration, trajectory_id
),

extension_groups AS (
    SELECT
        a.*,
        o.root_id,
        o.tokens AS owner_tokens,
        o.reward AS owner_reward,
        coalesce(greatest(a.max_reward, o.reward) > least(a.min_reward, o.reward), false) AS contrastive
    FROM anchored AS a
    LEFT JOIN owners AS o ON o.run_id = a.run_id AND o.iteration = a.iteration AND o.owner_id = a.owner_id
    WHERE a.owner_id IS NOT NULL
),

credit AS (  -- per raw group (its root): the rollouts that own a contrastive branch group
    SELECT run_id, iteration, root_id, count(*) AS trajectories, sum(tokens)::BIGINT AS tokens
    FROM (
        SELECT DISTINCT run_id, iteration, root_id, owner_id, owner_tokens AS tokens
        FROM extension_groups
        WHERE contrastive
    )
    GROUP BY run_id, iteration, root_id
)

SELECT
    g.run_id, g.strategy, g.iteration, g.prompt_id, g.task, g.difficulty, 'raw' AS origin,
    NULL::VARCHAR AS anchor_id, 0 AS anchor_depth, g.trajectories, g.tokens, g.successes,
    coalesce(g.max_reward > g.min_reward, false) AS contrastive,
    CASE WHEN g.max_reward > g.min_reward THEN g.trajectories ELSE coalesce(c.trajectories, 0) END AS effective,
    CASE WHEN g.max_reward > g.min_reward THEN g.tokens ELSE coalesce(c.tokens, 0) END::BIGINT AS effective_tokens,
    NULL::VARCHAR AS owner_trajectory_id, NULL::DOUBLE AS owner_reward, g.trajectories AS group_size,
    g.successes AS group_successes, NULL::BIGINT AS flips
FROM anchored AS g
LEFT JOIN credit AS c ON c.run_id = g.run_id AND c.iteration = g.iteration AND c.root_id = g.anchor_id
WHERE g.owner_id IS NULL
UNION ALL
SELECT
    run_id, strategy, iteration, prompt_id, task, difficulty, 'extension' AS origin,
    anchor_id, anchor_depth, trajectories, tokens, successes, contrastive,
    CASE WHEN contrastive THEN trajectories ELSE 0 END AS effective,
    CASE WHEN contrastive THEN tokens ELSE 0 END::BIGINT AS effective_tokens,
    owner_id AS owner_trajectory_id, owner_reward, trajectories + 1 AS group_size,
    successes + owner_reward AS group_successes,
    -- continuations whose (0/1) reward differs from the raw trajectory's
    CASE WHEN owner_reward >= 1 THEN trajectories - successes ELSE successes END::BIGINT AS flips
FROM extension_groups;

-- The run ids a named query's --run-id selects: that run and, for a comparison id, its children
-- (runs.parent_run_id). Queries test `$run_id IS NULL OR run_id IN (SELECT run_id FROM run_scope(...))`.
CREATE OR REPLACE MACRO run_scope(run_filter) AS TABLE
SELECT run_filter AS run_id
UNION
SELECT run_id FROM runs WHERE parent_run_id = run_filter;

-- The trajectory_groups of one run, or of every run when run_filter is NULL: the scope every
-- named query over groups starts from, written once (`FROM scoped_groups($run_id::VARCHAR)`).
-- A table macro is expanded into the query that calls it, so the filter still reaches the scan.
CREATE OR REPLACE MACRO scoped_groups(run_filter) AS TABLE
SELECT *
FROM trajectory_groups
WHERE run_filter IS NULL OR run_id = run_filter
    OR run_id IN (SELECT run_id FROM runs WHERE parent_run_id = run_filter);

-- The prompt_groups of one run (every run when run_filter is NULL), as scoped_groups.
CREATE OR REPLACE MACRO scoped_prompt_groups(run_filter) AS TABLE
SELECT *
FROM prompt_groups
WHERE run_filter IS NULL OR run_id = run_filter
    OR run_id IN (SELECT run_id FROM runs WHERE parent_run_id = run_filter);

-- The predictions of one run (every run when run_filter is NULL) whose outcome is known, a
-- missing weight counting as one outcome: what the predictor-quality queries score.
CREATE OR REPLACE MACRO scored_predictions(run_filter) AS TABLE
SELECT * REPLACE (coalesce(weight, 1.0) AS weight)
FROM predictions
WHERE (run_filter IS NULL OR run_id = run_filter
        OR run_id IN (SELECT run_id FROM runs WHERE parent_run_id = run_filter))
    AND v_pred IS NOT NULL AND outcome IS NOT NULL;
