-- Which prompts soaked up the most wasted trajectories (all iterations together)? Top 20.
-- iterations: the iterations that sampled the prompt (each holds one raw group of it).
WITH top AS (
    -- two passes over the groups: the waste of every prompt first (one sum per prompt: the only
    -- aggregation that sees every distinct prompt, millions in a long run over a fresh prompt
    -- stream), then the other columns of the top 20 alone
    SELECT run_id, prompt_id
    FROM scoped_groups($run_id::VARCHAR)
    GROUP BY run_id, prompt_id
    HAVING sum(trajectories - effective) > 0
    ORDER BY sum(trajectories - effective) DESC, run_id, prompt_id
    LIMIT 20
)

SELECT
    g.run_id,
    g.prompt_id,
    any_value(g.task) AS task,
    any_value(g.difficulty) AS difficulty,
    count(*) FILTER (WHERE g.origin = 'raw') AS iterations,
    sum(g.trajectories)::BIGINT AS trajectories,
    sum(g.trajectories - g.effective)::BIGINT AS wasted,
    round(sum(g.successes) / sum(g.trajectories), 4) AS mean_reward
FROM scoped_groups($run_id::VARCHAR) AS g
SEMI JOIN top AS t ON t.run_id = g.run_id AND t.prompt_id = g.prompt_id
GROUP BY g.run_id, g.prompt_id
ORDER BY wasted DESC, g.run_id, g.prompt_id;
