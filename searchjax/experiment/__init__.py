"""Orchestration of a run, above every primitive package (rl/, rewards/, drfree/, eval/, agent/, data/, models/):
setup.py (components from a config: mesh, policy, tokenizer, retriever, prompts), validate.py (pre-flight checks
before anything expensive loads, and the launchers' shared start-up), run_dir.py (workdir acceptance, atomic
writes, torn-line-tolerant logs, resume fingerprints), loop.py (the RL train loop and its reward / rollout /
advantage tables), scoring.py (a step's rewards, advantages, batch and old-policy pass, in the order the reward
needs them), step_log.py (a step's metrics, logs and trajectory dumps), selfplay.py (the Dr.Free proposer step),
self_evolution.py (proposer -> generation -> solver -> anchor iterations), evaluation.py (the evaluation run of
launch/evaluate.py), rehearsal.py (the full-size host loop with a scripted policy), shuffled_retrieval.py (the
learning run's control), main_job.py (demonstrations -> warm start -> GRPO arms -> the evaluation table, run by
launch/main_job.py). Nothing below this package imports it (tests/structure/test_import_graph.py)."""
