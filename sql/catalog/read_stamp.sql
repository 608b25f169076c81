-- The schema.sql version this catalogue was built from.
SELECT schema_sha FROM catalog_meta LIMIT 1;
