"""Dr.Free: data-free proposer/solver self-evolution (kg.py chains, proposer.py, selfplay.py, audit.py)."""
