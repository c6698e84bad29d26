"""Orchestration of a run, above every primitive package (rl/, rewards/, drfree/, eval/, agent/, data/, models/):
setup.py (components from a config: mesh, policy, tokenizer, retriever, prompts), loop.py (the RL train loop and
its reward / rollout / advantage tables), selfplay.py (the Dr.Free proposer driver), evaluation.py (the
evaluation run of launch/evaluate.py). Nothing below this package imports it (tests/structure/test_import_graph.py)."""
