"""Dr.Free primitives: kg.py (Wikidata5M readers, CSR graph), chains.py (chain sampler), proposer.py (prompt and
parsing), search_proposer.py (the "w/o KG" ablation's proposer, which searches from a seed passage), audit.py
(the shortcut audits of Tables 4, 5 and 14). The self-play driver and the three-iteration
self-evolution are searchjax.experiment.selfplay and searchjax.experiment.self_evolution."""
