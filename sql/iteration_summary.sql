-- The per-iteration record the training flow wrote (budget, effective ratio, accuracy, loss).
-- accuracy_before: held-out accuracy of the policy that generated the iteration's rollouts (the
-- evaluation after `iteration` iterations; iteration 0: before training); accuracy: after its update.
WITH scoped AS (
    SELECT *
    FROM iterations
    WHERE ($run_id::VARCHAR IS NULL OR run_id IN (SELECT run_id FROM run_scope($run_id::VARCHAR)))
),

heldout AS (
    SELECT run_id, iteration, accuracy
    FROM evaluations
    WHERE split = 'heldout' AND family = 'all'
        AND ($run_id::VARCHAR IS NULL OR run_id IN (SELECT run_id FROM run_scope($run_id::VARCHAR)))
)

SELECT
    s.run_id, s.strategy, s.iteration, s.budget_asked, s.budget_used, s.tokens, s.effective_ratio,
    s.wasted_share, b.accuracy AS accuracy_before, s.accuracy, s.accuracy_math, s.accuracy_qa, s.accuracy_fc,
    s.loss, s.timings
FROM scoped AS s
LEFT JOIN heldout AS b ON b.run_id = s.run_id AND b.iteration = s.iteration
ORDER BY s.run_id, s.iteration;
