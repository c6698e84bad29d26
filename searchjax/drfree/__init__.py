"""Dr.Free primitives: kg.py (Wikidata5M readers, CSR graph), chains.py (chain sampler), proposer.py (prompt and
parsing). The self-play driver that trains the proposer is searchjax.experiment.selfplay."""
