-- Records which version of schema.sql built this catalogue (trace_core.store.ensure_catalog).
CREATE OR REPLACE TABLE catalog_meta AS
SELECT
    $schema_sha::VARCHAR AS schema_sha,
    now() AS created_at;
