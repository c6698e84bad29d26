"""Data: assets.py (embedded-default assets, model-path aliases), jsonl.py, qa_datasets.py (Search-R1 parquet,
FlashRAG jsonl and embedded-default readers shared by training and evaluation), default_questions.py,
synthetic.py (the synthetic knowledge-graph world)."""
