"""Data: assets.py (embedded-default assets, model-path aliases), jsonl.py, qa_datasets.py (Search-R1 parquet,
FlashRAG jsonl and embedded-default readers shared by training and evaluation), default_questions.py (the 75
FanOutQA questions), default_qa.py and default_qa_templates.py (the default QA set built from the corpus),
demonstrations.py (SFT warm-start traces), synthetic.py (the synthetic knowledge-graph world)."""
