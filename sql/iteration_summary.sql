-- The per-iteration record the training flow wrote (budget, effective ratio, accuracy, loss).
WITH scoped AS (
    SELECT *
    FROM iterations
    WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id::VARCHAR
)

SELECT
    run_id, strategy, iteration, budget_asked, budget_used, tokens, effective_ratio,
    wasted_share, accuracy, accuracy_math, accuracy_qa, accuracy_fc, loss, timings
FROM scoped
ORDER BY run_id, iteration;
