-- Answer the named queries from the raw nodes instead of the stored group summaries (a check of
-- the summaries, or a home whose summaries cannot be written): trajectory_groups recomputed.
CREATE OR REPLACE VIEW trajectory_groups AS
SELECT * FROM trajectory_groups_from_nodes;
