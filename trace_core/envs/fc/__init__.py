"""Function-calling family: a sandboxed in-memory API (``world``), BFCL schema and AST checks
(``check``, BFCL's AST rule in ``ast_rule``), BFCL data (``bfcl``), synthetic multi-call tasks
(``generator``), the env and its demonstrations (``env``)."""

from trace_core.envs.families import register_demonstration, register_env, register_generator
from trace_core.envs.fc.env import FCEnv, demonstration
from trace_core.envs.fc.generator import make_fc_task

register_env("fc")(FCEnv)
register_generator("fc", salt=3)(make_fc_task)
register_demonstration("fc")(demonstration)

__all__ = ["FCEnv", "make_fc_task"]
