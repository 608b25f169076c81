"""Generating trajectories.

    agent_loop   the multi-turn agent loop: raw rollouts, extensions from prefixes, evaluation
    interface    one rollouts interface for the stages (local, or the Ray pool of ``engines.pool``)
"""
