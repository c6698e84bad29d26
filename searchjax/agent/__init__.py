"""The search agent: protocol.py (Search-R1 prompt, action parsing, observations) and rollout.py (host loop)."""
