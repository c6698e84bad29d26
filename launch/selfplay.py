r"""Run Dr.Free, configured by one ml-collections file (configs/drfree.py): the proposer/solver self-evolution
loop (config.run = "self_evolution", the default), or the proposer's HRPO training alone ("proposer").

  python -m launch.selfplay --config configs/drfree.py:quickstart --workdir /tmp/drfree_quickstart
  python -m launch.selfplay --config configs/drfree.py:quickstart --workdir /tmp/drfree_quickstart --resume
  python -m launch.selfplay --config configs/drfree.py:qwen2.5-7b-instruct --workdir ~/runs/drfree_proposer \
      --config.chains.pool=~/chains/chains.jsonl --config.retrieval.url=http://127.0.0.1:8000

Like launch/train.py (same flags, SIGTERM saves and --resume continues), through launch/train.py's `run`:
flags -> `searchjax.experiment.self_evolution.run_self_evolution(config, workdir)` (one directory per
iteration and stage under --workdir: iter_<k>/proposer, iter_<k>/generation, iter_<k>/solver) or
`searchjax.experiment.selfplay.train_proposer(config, workdir)` (launch/train.py's outputs).
"""

from launch import train  # its --config, --workdir and --resume flags and its start-up body


def _train_proposer(config, workdir, *, resume: bool) -> dict:
    from searchjax.experiment import selfplay
    return selfplay.train_proposer(config, workdir, resume=resume)


def _self_evolution(config, workdir, *, resume: bool) -> dict:
    from searchjax.experiment import self_evolution
    return self_evolution.run_self_evolution(config, workdir, resume=resume)


RUNS = {"self_evolution": _self_evolution, "proposer": _train_proposer}


def _run(config, workdir, *, resume: bool) -> dict:
    if config.run not in RUNS:
        raise ValueError(f"config.run={config.run!r}; valid: {sorted(RUNS)}")
    return RUNS[config.run](config, workdir, resume=resume)


def main(argv):
    train.run(argv, _run)


if __name__ == "__main__":
    from searchjax.experiment.validate import start_launcher
    start_launcher(main)
