-- How much of the root budget went to prompts the predictor was already sure about
-- (v_pred < 0.05 or > 0.95), and how much of it came out as predicted (all failed / all
-- succeeded): rollouts that a better-calibrated allocation could have spent elsewhere.
WITH scoped AS (
    SELECT run_id, iteration, v_pred, m_alloc, n_success, n_total
    FROM prompts
    WHERE ($run_id::VARCHAR IS NULL OR run_id IN (SELECT run_id FROM run_scope($run_id::VARCHAR)))
        AND m_alloc > 0
)

SELECT
    run_id,
    iteration,
    sum(m_alloc)::BIGINT AS rollouts,
    coalesce(sum(m_alloc) FILTER (WHERE v_pred < 0.05 OR v_pred > 0.95), 0)::BIGINT AS confident_rollouts,
    coalesce(sum(m_alloc) FILTER (
        WHERE (v_pred < 0.05 AND n_success = 0) OR (v_pred > 0.95 AND n_success = n_total)
    ), 0)::BIGINT AS confirmed_rollouts,
    round(coalesce(sum(m_alloc) FILTER (
        WHERE (v_pred < 0.05 AND n_success = 0) OR (v_pred > 0.95 AND n_success = n_total)
    ), 0) / sum(m_alloc), 4) AS confirmed_share
FROM scoped
GROUP BY run_id, iteration
ORDER BY run_id, iteration;
