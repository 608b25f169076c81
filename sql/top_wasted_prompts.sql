-- Which prompts soaked up the most wasted trajectories (all iterations together)? Top 20.
-- iterations: the iterations that sampled the prompt (each holds one raw group of it).
WITH per_prompt AS (
    SELECT
        run_id,
        prompt_id,
        any_value(task) AS task,
        any_value(difficulty) AS difficulty,
        count(*) FILTER (WHERE origin = 'raw') AS iterations,
        sum(trajectories)::BIGINT AS trajectories,
        sum(trajectories - effective)::BIGINT AS wasted,
        round(sum(successes) / sum(trajectories), 4) AS mean_reward
    FROM scoped_groups($run_id::VARCHAR)
    GROUP BY run_id, prompt_id
)

SELECT run_id, prompt_id, task, difficulty, iterations, trajectories, wasted, mean_reward
FROM per_prompt
WHERE wasted > 0
ORDER BY wasted DESC, run_id, prompt_id
LIMIT 20;
