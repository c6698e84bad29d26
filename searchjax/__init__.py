"""searchjax: training LLM search agents with reinforcement learning, in JAX.

See README.md for the layout and the two commands that run the main job and the tests.
"""

__version__ = "0.1.0"

from searchjax.runtime import skip_absent_tpu as _skip_absent_tpu

_skip_absent_tpu()  # before any JAX backend starts: no TPU probe on hosts without one
