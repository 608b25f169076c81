-- The node store's catalogue: views over the Parquet shards under the home directory DIR.
-- Paths are relative to DIR: trace_core.store sets DuckDB's file_search_path to DIR; from the
-- DuckDB CLI, run `cd DIR && duckdb -readonly trace.duckdb`.
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
-- with). A trajectory is wasted when its group is zero-contrast: all verified rewards in it are
-- equal (a group of one included); it is effective otherwise. Unverified rewards are ignored.
CREATE OR REPLACE VIEW trajectories AS
WITH steps AS (
    SELECT
        run_id, strategy, iteration, trajectory_id, node_id, parent_id, prompt_id, task,
        difficulty, depth, origin, is_leaf, reward, new_tokens
    FROM nodes
    WHERE trajectory_id IS NOT NULL AND depth > 0
),

per_trajectory AS (
    SELECT
        run_id,
        iteration,
        trajectory_id,
        any_value(strategy) AS strategy,
        any_value(prompt_id) AS prompt_id,
        any_value(task) AS task,
        any_value(difficulty) AS difficulty,
        arg_min(origin, depth) AS origin,
        arg_min(parent_id, depth) AS anchor_id,
        min(depth) - 1 AS anchor_depth,
        max(reward) FILTER (WHERE is_leaf) AS reward,
        count(*) AS turns,
        coalesce(sum(new_tokens), 0)::BIGINT AS tokens
    FROM steps
    GROUP BY run_id, iteration, trajectory_id
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
)

SELECT
    t.run_id, t.strategy, t.iteration, t.trajectory_id, t.prompt_id, t.task, t.difficulty,
    t.origin, t.anchor_id, t.anchor_depth, t.reward, t.turns, t.tokens,
    g.group_size,
    g.contrastive AS effective,
    NOT g.contrastive AS wasted
FROM per_trajectory AS t
INNER JOIN anchor_groups AS g
    ON g.run_id = t.run_id AND g.iteration = t.iteration AND g.anchor_id = t.anchor_id;
