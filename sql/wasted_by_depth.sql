-- At which branching depth is budget wasted? anchor_depth 0 = raw rollouts from the prompt,
-- t > 0 = continuations from the prefix after turn t.
SELECT
    run_id,
    anchor_depth,
    sum(trajectories)::BIGINT AS trajectories,
    sum(trajectories - effective)::BIGINT AS wasted,
    round(sum(trajectories - effective) / sum(trajectories), 4) AS wasted_share,
    sum(tokens - effective_tokens)::BIGINT AS wasted_tokens
FROM scoped_groups($run_id::VARCHAR)
GROUP BY run_id, anchor_depth
ORDER BY run_id, anchor_depth;
