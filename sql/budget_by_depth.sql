-- Where did the budget go: how many trajectories and tokens were spent branching at each depth?
WITH by_depth AS (
    SELECT
        run_id,
        anchor_depth,
        sum(trajectories)::BIGINT AS trajectories,
        sum(tokens)::BIGINT AS tokens,
        sum(effective)::BIGINT AS effective
    FROM scoped_groups($run_id::VARCHAR)
    GROUP BY run_id, anchor_depth
)

SELECT
    run_id,
    anchor_depth,
    trajectories,
    round(trajectories / sum(trajectories) OVER (PARTITION BY run_id), 4) AS trajectory_share,
    tokens,
    round(tokens / nullif(sum(tokens) OVER (PARTITION BY run_id), 0), 4) AS token_share,
    effective
FROM by_depth
ORDER BY run_id, anchor_depth;
