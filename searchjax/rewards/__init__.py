"""Rewards: plain host-side functions of trajectories (and, for Dr.Free, of anchor log-likelihoods).

qa.py (EM / F1 / sub-EM / answer extraction), base.py (the reward output type), information_gain.py (Dr.Free),
difficulty.py (Dr.Zero), eviback.py (EviBack's Teacher backoff), cycle.py (CCS) with ner.py (entity masking),
the gold-free baselines rlif.py, ttrl.py and constitutional_judge.py, compose.py (reward designs combined by one
config value) and judge_failures.py (the failure-rate stop shared by judge-based rewards). Import what you need.
"""
