-- How does waste depend on prompt difficulty (the generator's difficulty level)?
SELECT
    run_id,
    task,
    difficulty,
    sum(trajectories)::BIGINT AS trajectories,
    coalesce(sum(trajectories) FILTER (WHERE NOT contrastive), 0)::BIGINT AS wasted,
    round(coalesce(sum(trajectories) FILTER (WHERE NOT contrastive), 0) / sum(trajectories), 4) AS wasted_share,
    round(sum(successes) / sum(trajectories), 4) AS mean_reward
FROM scoped_groups($run_id::VARCHAR)
GROUP BY run_id, task, difficulty
ORDER BY run_id, task, difficulty;
