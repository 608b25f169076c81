"""Analysis over finished runs and plans: nothing here runs inside a training iteration.

    learning         held-out accuracy against tokens and seconds, per strategy (curves, paired CIs)
    compare          strategies side by side (means with 95% CIs over seeds)
    headroom         effective ratio lost to prediction (oracle root rule against the predictor's)
    simulate         every strategy on synthetic trees with known success rates
    capacity         memory per GPU of the update and the vLLM engine; ``capacity_report`` prints it
    rollout_stats    the rollout statistics TRL and verl users look for
    outfile          output files the user names (``sql --out``, ``report --out``)
"""
