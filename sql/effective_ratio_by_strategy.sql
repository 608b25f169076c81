-- Which allocation strategy turns its budget into contrastive (learning) samples?
-- effective_per_1k_tokens: effective trajectories per 1000 generated tokens.
WITH scoped AS (
    SELECT *
    FROM trajectories
    WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id::VARCHAR
)

SELECT
    strategy,
    count(DISTINCT run_id) AS runs,
    count(*) AS trajectories,
    count(*) FILTER (WHERE effective) AS effective,
    round(count(*) FILTER (WHERE effective) / count(*), 4) AS effective_ratio,
    sum(tokens) AS tokens,
    round(1000 * count(*) FILTER (WHERE effective) / nullif(sum(tokens), 0), 4) AS effective_per_1k_tokens
FROM scoped
GROUP BY strategy
ORDER BY effective_ratio DESC, strategy;
