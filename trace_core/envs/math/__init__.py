"""Math family: a calculator tool (``calculator``), numeric / fraction / string answer checks
(``answers``), synthetic operation chains (``generator``), the env and its demonstrations (``env``)."""

from trace_core.envs.families import register_demonstration, register_env, register_generator
from trace_core.envs.math.env import MathEnv, demonstration
from trace_core.envs.math.generator import make_math_task

register_env("math")(MathEnv)
register_generator("math", salt=1)(make_math_task)
register_demonstration("math")(demonstration)

__all__ = ["MathEnv", "make_math_task"]
