"""Reinforcement learning: advantages.py (host numpy: GRPO, HRPO, group overrides), losses.py (jax: clipped
surrogate, KL, entropy, SFT, aggregation), trainer.py (the jitted, sharded update), batching.py, checkpoint.py,
sft.py. Primitives only: the train loop that drives them is searchjax.experiment.loop."""
