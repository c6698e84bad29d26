"""Rewards: plain host-side functions of trajectories (and, for Dr.Free, of anchor log-likelihoods).

qa.py (EM / F1 / sub-EM / answer extraction), information_gain.py (Dr.Free), difficulty.py (Dr.Zero);
eviback.py, cycle.py and unsupervised.py for the other methods. Import the module you need.
"""
