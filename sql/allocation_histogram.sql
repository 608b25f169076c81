-- How were rollouts spread over candidate prompts? Prompts per allocated count m (0 = skipped).
WITH scoped AS (
    SELECT run_id, m_alloc
    FROM prompts
    WHERE ($run_id::VARCHAR IS NULL OR run_id IN (SELECT run_id FROM run_scope($run_id::VARCHAR)))
)

SELECT
    run_id,
    m_alloc,
    count(*) AS prompts
FROM scoped
GROUP BY run_id, m_alloc
ORDER BY run_id, m_alloc;
