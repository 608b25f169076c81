"""The stages of one iteration and the records they pass.

    iteration      the seven stages in the order the method runs them
    records        the rows an iteration writes beside its nodes (rewards, prompts, predictions)
    results        what each stage returns: small, frozen, JSON-serialisable records
    prompt_pools   the run's prompt pools: training set, candidates, held-out set
    spending       what earlier iterations spent, read back for the planner
    run            a run's identity: its directory and the seeds its stages draw from
"""
