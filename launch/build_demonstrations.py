r"""Build SFT warm-start demonstrations (searchjax.data.demonstrations) on default-QA questions.

The tokenizer, retriever and observation settings come from the training config the demonstrations are for
(model.path / model.tokenizer, retrieval, rollout.topk / max_obs_tokens / max_new_tokens_per_turn / max_turns),
so the information blocks are the ones that run's rollouts append:

  python -m launch.build_demonstrations --config configs/quickstart.py --output /tmp/demos/quickstart.jsonl
  python -m launch.train --config configs/quickstart.py --workdir /tmp/qs \
      --config.sft.demonstrations=/tmp/demos/quickstart.jsonl --config.sft.steps=50

--limit N takes the first N questions of the split (0 = all). Prints kept / tried, the drop reasons, the yield
per template and the time; the file is checked against the tokenizer (check_demonstrations) after writing.
"""

from __future__ import annotations

import collections
import time

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config the demonstrations are for.",
                                          lock_config=True)
_OUTPUT = flags.DEFINE_string("output", None, "jsonl file to write.", required=True)
_SPLIT = flags.DEFINE_enum("split", "train", ["train", "dev", "test"], "Default-QA split to build from.")
_QUESTIONS = flags.DEFINE_string("questions", "", "A QA jsonl in searchjax.data.default_qa's format instead of "
                                 "the default set's --split.")
_LIMIT = flags.DEFINE_integer("limit", 0, "First N questions only (0 = all).")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show the traceback of a bad-input error, not just its one line.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required (the training config the demonstrations are for)")
    from searchjax.experiment.validate import exit_on_user_error
    exit_on_user_error(build, verbose=_VERBOSE.value, program="launch.build_demonstrations")


def build():
    from searchjax.agent.rollout import RolloutConfig
    from searchjax.data import default_qa, demonstrations
    from searchjax.data.assets import resolve_model_path
    from searchjax.experiment.setup import build_retriever
    from searchjax.tokenization import load_tokenizer
    config = _CONFIG.value
    start = time.perf_counter()
    rows = default_qa.read_qa_file(_QUESTIONS.value) if _QUESTIONS.value else default_qa.default_qa_split(_SPLIT.value)
    rows = rows[:_LIMIT.value] if _LIMIT.value > 0 else rows
    tokenizer = load_tokenizer(resolve_model_path(config.model.tokenizer or config.model.path))
    retriever = build_retriever(config.retrieval)
    built = demonstrations.build_demonstrations(rows, tokenizer, retriever, RolloutConfig(**config.rollout.to_dict()))
    path = demonstrations.write_demonstrations(built.records, _OUTPUT.value)
    demonstrations.check_demonstrations(path, tokenizer)
    elapsed = time.perf_counter() - start

    kept_ids = {r["id"] for r in built.records}
    per_template = collections.defaultdict(lambda: [0, 0])
    for row in rows:
        counts = per_template["two-hop" if row["hops"] == 2 else row["metadata"]["template"]]
        counts[0] += row["id"] in kept_ids
        counts[1] += 1
    print(f"kept {len(built.records)} / {len(rows)} questions ({len(built.records) / max(len(rows), 1):.1%})")
    print("reasons: " + ", ".join(f"{k} {v}" for k, v in sorted(built.reasons.items())))
    print("per template (kept/tried): " + ", ".join(f"{t} {k}/{n}" for t, (k, n) in sorted(per_template.items())))
    tokens = sum(len(r["response_ids"]) for r in built.records)
    print(f"response tokens: {tokens} ({sum(sum(r['loss_mask']) for r in built.records)} in the loss)")
    print(f"built in {elapsed:.1f}s -> {path}")


if __name__ == "__main__":
    app.run(main)
