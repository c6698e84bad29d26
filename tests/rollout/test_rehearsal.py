"""The scale rehearsal at CI size: configs/search_r1.py's real batch (512 prompts x 5 = 2,560 rows) for 2 searching
turns of at most 16 tokens, against the real retrieval server on loopback over the default BM25 corpus; and
configs/eviback.py (G = 8) with the scripted Teacher server at 64 prompts x 8 = 512 rows (the full 4,096 rows:
the documented command in docs/scale_rehearsal.md).

Expected values come from the script's rules written out here (which rows search, fail to act, answer right),
from an in-process BM25 search of the same queries, and from the tokenizer itself; the per-phase host times and
the peak memory are printed (pytest -s) and must be present.
"""

import json
import pathlib

import numpy as np
import pytest

from searchjax.experiment import rehearsal

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bm25():
    from retrieval import default_index
    return default_index(kind="bm25")


@pytest.fixture(scope="module")
def server(bm25):
    from retrieval.server import serve_in_thread
    running = serve_in_thread(bm25)
    yield running
    running.stop()


def _config(name: str, **overrides):
    from searchjax.config_files import sibling
    module, _, variant = name.partition(":")
    config = sibling(str(REPO / "configs" / f"{module}.py"), module).get_config(variant)
    for dotted, value in overrides.items():
        section = config
        *parents, leaf = dotted.split(".")
        for p in parents:
            section = section[p]
        section[leaf] = value
    return config


def _rcfg(url: str):
    rcfg = rehearsal.rehearsal_config()
    rcfg.retrieval_url = url
    return rcfg


def _print_report(title: str, report: dict) -> None:
    print(f"\n{title}: " + json.dumps(report, sort_keys=True))


@pytest.mark.heavy
def test_search_r1_batch_at_ci_size(server, bm25):
    from searchjax.agent import protocol
    config = _config("search_r1", **{"rollout.max_turns": 2, "rollout.max_new_tokens_per_turn": 16})
    before = dict(server.app.state.batcher.stats)
    result = rehearsal.run(config, _rcfg(server.url))
    report, trajectories = result.report, result.trajectories
    _print_report("search_r1 2,560 rows x 2 turns x 16 tokens", report)

    rows, group = 2560, 5
    invalid_rows = {r for r in range(rows) if r % 10 == 9}  # invalid_every = 10: the second turn of every 10th row
    assert len(trajectories) == report["rows"] == rows
    assert report["retrieval_errors"] == 0
    assert report["searches_sent"] == 2 * rows - len(invalid_rows) == 4864
    assert report["invalid_actions"] == len(invalid_rows)
    served = server.app.state.batcher.stats
    assert served["queries"] - before["queries"] == 4864 + 1  # every search, plus the start-up probe's query
    assert served["failed_batches"] == before["failed_batches"]
    for key in ("tokenize", "retrieval", "parse", "reward", "batching", "generate"):
        assert report[f"time/{key}_s"] > 0 and report[f"cpu/{key}_s"] >= 0, key
    assert report["memory/peak_rss_gib"] > 0

    # Every row: question (cut to the turn's room), then a title or an invalid turn, then its answer.
    questions = {t.prompt.uid: t.prompt.question for t in trajectories}
    correct = 0
    for r, t in enumerate(trajectories):
        prompt_index, sample = r // group, r % group
        assert (t.prompt.uid, t.sample_index) == (f"rehearsal/{prompt_index}", sample)
        assert t.num_turns == 3 and t.end_reason == "answer" and t.forced_termination and t.retrieval_errors == 0
        assert t.invalid_actions == (r in invalid_rows) and len(t.queries) == 2 - (r in invalid_rows)
        assert questions[t.prompt.uid].startswith(t.queries[0]) and len(t.queries[0].split()) >= 2
        right = prompt_index % 2 == 1 and sample % 2 == 0
        assert t.answer == (t.prompt.golden_answers[0] if right else "unknown")
        correct += right
    assert report["reward/mean"] == pytest.approx(correct / rows) == pytest.approx(0.3)

    # Retrieval is real: a sample of rows' hits equal an in-process BM25 search of the same queries, and their
    # observation counts as truncated exactly when its encoding is longer than max_obs_tokens.
    from searchjax.data.assets import resolve_model_path
    from searchjax.tokenization import load_tokenizer
    tok = load_tokenizer(resolve_model_path("smollm2"))
    for r in np.random.default_rng(0).choice(rows, 24, replace=False):
        t = trajectories[r]
        expected = bm25.search(t.queries, 3)
        assert t.doc_ids == [[h.id for h in hits] for hits in expected]
        truncated = sum(len(tok.encode(protocol.search_observation(hits))) > 500 for hits in expected)
        assert t.truncated_observations == truncated

    # GRPO: odd prompts' groups have rewards [1, 0, 1, 0, 1]; even prompts' groups are all zero.
    z = (np.array([1, 0, 1, 0, 1.0]) - 0.6) / (np.std([1, 0, 1, 0, 1.0], ddof=1) + 1e-6)
    np.testing.assert_allclose(result.advantages[5:10], z, rtol=1e-5)
    assert np.all(result.advantages[:5] == 0)
    batch = result.batch
    assert batch["input_ids"].shape[0] == rows and batch["input_ids"].shape[1] == 256 + report["batch/loss_columns"]
    assert batch["loss_mask"].sum() == sum(sum(t.loss_mask) for t in trajectories)


def test_eviback_batch_with_scripted_teacher(server):
    config = _config("eviback:qwen3-4b", **{"prompts_per_step": 64, "rollout.max_turns": 2,
                                            "rollout.max_new_tokens_per_turn": 16, "batch.mini_batch_size": 512})
    result = rehearsal.run(config, _rcfg(server.url))
    report = result.report
    _print_report("eviback 512 rows x 2 turns x 16 tokens", report)
    assert report["rows"] == 512 and report["retrieval_errors"] == 0
    assert report["reward/eviback/all_zero_groups"] == 32  # the even prompts' groups
    assert report["reward/eviback/teacher_failures"] == 0 and report["reward/eviback/stage_a_requests"] > 0
    rewards, advantages = result.rewards, result.advantages
    groups = rewards.reshape(64, 8)
    assert np.all(groups[0::2] == 0) and np.all(groups[1::2] == np.tile([1, 0], 4))  # EM of the scripted answers
    # Mixed groups keep plain GRPO; all-zero groups get the Teacher's backoff, at most lambda = 0.1 x a hit's.
    z = (np.tile([1, 0], 4) - 0.5) / (np.std(np.tile([1, 0], 4), ddof=1) + 1e-6)
    np.testing.assert_allclose(advantages.reshape(64, 8)[1::2], np.tile(z, (32, 1)), rtol=1e-5)
    backoff = np.abs(advantages.reshape(64, 8)[0::2])
    assert backoff.max() > 0 and backoff.max() <= 0.1 * (8 - 1) / np.sqrt(8) + 1e-6


def test_batch_tokenizer_calls_equal_one_by_one(rollout_tokenizer):
    from searchjax.agent.rollout import decode_many, encode_many
    tok = rollout_tokenizer
    texts = ["", "plain words", "  leading spaces and\ttabs\n\nnew lines", "<|im_start|>user\nhi<|im_end|>",
             "Doc 1(Title: Zürich) naïve café — 東京 🚀", "</information>\n\n<search> q </search>"]
    assert encode_many(tok, texts) == [tok.encode(t) for t in texts]
    ids = [tok.encode(t) for t in texts] + [[int(i) for i in np.random.default_rng(1).integers(0, tok.vocab_size, 40)]]
    assert decode_many(tok, ids) == [tok.decode(i) for i in ids]
