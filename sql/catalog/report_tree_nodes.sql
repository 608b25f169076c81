-- The rollout trees the report draws: every node of the (iteration, prompt) groups with the most
-- wasted trajectories (then the most branch groups), $trees of them, or of one chosen $prompt_id;
-- each continuation with whether its reward differs from the raw trajectory it branched from.
WITH per_prompt AS (
    SELECT
        iteration,
        prompt_id,
        sum(trajectories) AS trajectories,
        sum(trajectories - effective) AS wasted,
        count(*) FILTER (WHERE origin = 'extension') AS branch_groups
    FROM trajectory_groups
    WHERE run_id = $run_id::VARCHAR
    GROUP BY iteration, prompt_id
),

picked AS (
    SELECT iteration, prompt_id, trajectories, wasted, branch_groups
    FROM per_prompt
    WHERE $prompt_id::VARCHAR IS NULL OR prompt_id = $prompt_id::VARCHAR
    ORDER BY wasted DESC, branch_groups DESC, trajectories DESC, iteration, prompt_id
    LIMIT $trees::INTEGER
),

flips AS (
    SELECT iteration, trajectory_id, flipped, effective
    FROM trajectories
    WHERE run_id = $run_id::VARCHAR
)

SELECT
    n.iteration, n.prompt_id, n.task, n.difficulty, n.node_id, n.parent_id, n.trajectory_id, n.depth,
    n.origin, n.action_text, n.observation_text, n.new_tokens, n.is_leaf, n.reward, n.reward_reason,
    n.v_pred, n.alloc_children, n.utility, n.subtree_mean_reward, n.subtree_count,
    f.flipped, f.effective, p.trajectories AS tree_trajectories, p.wasted AS tree_wasted
FROM nodes AS n
INNER JOIN picked AS p ON p.iteration = n.iteration AND p.prompt_id = n.prompt_id
LEFT JOIN flips AS f ON f.iteration = n.iteration AND f.trajectory_id = n.trajectory_id
WHERE n.run_id = $run_id::VARCHAR
ORDER BY p.wasted DESC, p.branch_groups DESC, p.trajectories DESC, n.iteration, n.prompt_id, n.depth, n.node_id;
