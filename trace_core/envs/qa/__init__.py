"""Multi-hop QA family: BM25 ``search`` over the task's paragraphs (``search``), exact-match / F1
checks (``answers``), synthetic fact chains (``generator``), the env and its demonstrations (``env``)."""

from trace_core.envs.families import register_demonstration, register_env, register_generator
from trace_core.envs.qa.env import QAEnv, demonstration
from trace_core.envs.qa.generator import make_qa_task

register_env("qa")(QAEnv)
register_generator("qa", salt=2)(make_qa_task)
register_demonstration("qa")(demonstration)

__all__ = ["QAEnv", "make_qa_task"]
