r"""Train Dr.Free's proposer with HRPO, configured by one ml-collections file (configs/drfree.py).

  python -m launch.selfplay --config configs/drfree.py:quickstart --workdir /tmp/drfree_quickstart
  python -m launch.selfplay --config configs/drfree.py:quickstart --workdir /tmp/drfree_quickstart --resume
  python -m launch.selfplay --config configs/drfree.py:qwen2.5-7b-instruct --workdir ~/runs/drfree_proposer \
      --config.chains.pool=~/chains/chains.jsonl --config.retrieval.url=http://127.0.0.1:8000

Like launch/train.py (same flags, same outputs under --workdir, SIGTERM saves and --resume continues), but
the prompts are chain-pool proposer prompts and the loop gets the proposer's rollout and rewards:
flags -> `searchjax.drfree.selfplay.train_proposer(config, workdir)` through launch/train.py's `run`.
"""

from absl import app, flags

from launch import train  # its --config, --workdir and --resume flags and its start-up body


def _train_proposer(config, workdir, *, resume: bool) -> dict:
    from searchjax.drfree import selfplay
    return selfplay.train_proposer(config, workdir, resume=resume)


def main(argv):
    train.run(argv, _train_proposer)


if __name__ == "__main__":
    from searchjax.runtime import use_transparent_huge_pages
    use_transparent_huge_pages()  # re-executes once with GLIBC_TUNABLES set (faster XLA:CPU buffers)
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)
