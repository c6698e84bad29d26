"""Data: embedded-default assets, QA dataset readers, the synthetic knowledge-graph world."""
