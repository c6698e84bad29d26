"""Ahead-of-time compilation of a run's programs for TPU topologies on a CPU host (compiler, programs, check)."""
