-- Is the success predictor calibrated? Predictions (made before the outcome) in ten equal-width
-- bins of v_pred, per kind (root = prompt, prefix = partial trajectory); outcome weighted by the
-- number of outcomes behind it.
WITH binned AS (
    SELECT kind, v_pred, outcome, weight, least(floor(v_pred * 10), 9)::INTEGER AS bin
    FROM scored_predictions($run_id::VARCHAR)
)

SELECT
    kind,
    bin,
    round(bin / 10, 1) AS bin_lo,
    round((bin + 1) / 10, 1) AS bin_hi,
    count(*) AS predictions,
    sum(weight) AS outcomes,
    round(avg(v_pred), 4) AS mean_pred,
    round(sum(outcome * weight) / sum(weight), 4) AS mean_outcome,
    round(sum(outcome * weight) / sum(weight) - avg(v_pred), 4) AS gap
FROM binned
GROUP BY kind, bin
ORDER BY kind, bin;
