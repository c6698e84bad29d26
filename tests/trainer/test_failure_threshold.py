"""A step whose searches fail above config.max_failure_rate stops the run; below it the errors are step metrics.

The retrieval server is the real one (searchjax's /retrieve on loopback) over the default BM25 index, wrapped
so that every other search call raises: the server answers those requests 500, and a client without retries
turns them into retrieval errors. The policy is the scale rehearsal's scripted one (search the question,
search a title, answer), so each rollout turn sends exactly one request: turn 0 fails, turn 1 succeeds, and
4 of the step's 8 searches fail (50 %).
"""

import json
import pathlib

import jax
import pytest

from searchjax.experiment import loop

REPO = pathlib.Path(__file__).resolve().parents[2]


class HalfFailingIndex:
    """An index whose odd-numbered search calls (1st, 3rd, ...) raise."""

    def __init__(self, index):
        self.index, self.size, self.calls = index, index.size, 0

    def search(self, queries, topk):
        self.calls += 1
        if self.calls % 2 == 1:
            raise RuntimeError("scripted index failure")
        return self.index.search(queries, topk)


@pytest.fixture(scope="module")
def half_failing_server():
    from retrieval import default_index
    from retrieval.server import serve_in_thread
    index = HalfFailingIndex(default_index(kind="bm25"))
    server = serve_in_thread(index, warmup=False)
    yield server, index
    server.stop()


def _config(max_failure_rate: float):
    from searchjax.config_files import sibling
    config = sibling(str(REPO / "configs" / "quickstart.py"), "quickstart").get_config()
    config.total_steps = 1
    config.max_failure_rate = max_failure_rate
    config.rollout_fn = "scripted_search"
    config.rollout.group_size = 2
    config.rollout.max_turns = 2
    config.rollout.max_new_tokens_per_turn = 16
    config.rollout.max_obs_tokens = 64
    config.rollout.max_cache_len = 512
    config.loss.kl_coef = 0.0
    config.batch.mini_batch_size = 4
    config.batch.micro_batch_size = 2
    config.batch.prompt_buckets = (256,)
    config.batch.response_buckets = (256,)
    config.eval.every = 0
    config.checkpoint.every = 1
    config.checkpoint.export_hf = False
    config.logging.trajectories_per_step = -1
    config.logging.progress_bar = False
    return config


def _run(tmp_path, monkeypatch, server_and_index, tokenizer, max_failure_rate):
    from retrieval.client import HttpRetriever
    from retrieval.corpus import default_corpus
    from searchjax.agent import protocol
    from searchjax.agent.rollout import RolloutConfig, rollout
    from searchjax.experiment import rehearsal
    from searchjax.models import Transformer, init_params
    from searchjax.models.presets import get_preset
    server, index = server_and_index
    index.calls = 0
    corpus = default_corpus()
    prompts = rehearsal.rehearsal_prompts(2, corpus, tokenizer, answer_room=8)
    marker = rehearsal.pick_marker(tokenizer, [protocol.build_prompt(p.question, tokenizer) for p in prompts])
    script = rehearsal.build_script(tokenizer, prompts, corpus, group_size=2, max_turns=2, budget=16, fill=False,
                                    invalid_every=0, marker=marker)
    logits_fn = rehearsal.scripted_logits_fn(script)

    def scripted_search(components, params, prompts, rollout_cfg, seed):
        cfg = RolloutConfig(**dict(rollout_cfg, temperature=0.0))
        return rollout(None, None, components.tokenizer, components.retriever, prompts, cfg, seed=seed,
                       logits_fn=logits_fn)
    monkeypatch.setitem(loop.ROLLOUT_FNS, "scripted_search", scripted_search)
    model_config = get_preset("tiny-llama", vocab_size=tokenizer.vocab_size, max_position_embeddings=1024)
    retriever = HttpRetriever(server.url, retries=0)  # a 500 is a failed search at once
    components = loop.Components(model=Transformer(model_config), params=init_params(model_config, jax.random.key(0)),
                                 tokenizer=tokenizer, retriever=retriever, train_prompts=prompts, eval_prompts=[])
    try:
        return loop.train(_config(max_failure_rate), tmp_path, components=components)
    finally:
        retriever.close()


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf_path):
    from searchjax.tokenization import load_tokenizer
    return load_tokenizer(smollm2_gguf_path)


def test_failure_rate_above_threshold_stops_the_run_before_training(tmp_path, monkeypatch, half_failing_server,
                                                                     tokenizer):
    with pytest.raises(loop.FailureRateError, match=r"stopped at step 1: 4 of 8 searches failed \(50\.0%\), above "
                                                    r"config\.max_failure_rate=0\.1; is the retrieval server up"):
        _run(tmp_path, monkeypatch, half_failing_server, tokenizer, max_failure_rate=0.1)
    assert half_failing_server[1].calls == 2  # one request per turn: the failing one, then a good one
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())
    assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text()


def test_failures_below_threshold_are_step_metrics_and_in_the_dump(tmp_path, monkeypatch, half_failing_server,
                                                                    tokenizer):
    metrics = _run(tmp_path, monkeypatch, half_failing_server, tokenizer, max_failure_rate=0.6)
    # 2 prompts x 2 samples x 2 searching turns; the whole first turn's request failed.
    assert metrics["rollout/searches_sent"] == 8 and metrics["rollout/retrieval_errors"] == 4
    assert metrics["rollout/retrieval_error_rate"] == 0.5
    assert metrics["rollout/invalid_actions"] == 0 and metrics["rollout/turns"] == 12
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["rollout/retrieval_errors"] == 4 and row["rollout/retrieval_error_rate"] == 0.5
    dumped = [json.loads(line) for line in (tmp_path / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert [(d["retrieval_errors"], d["invalid_actions"], d["num_turns"], d["end_reason"]) for d in dumped] == \
        [(1, 0, 3, "answer")] * 4
    assert all("The search engine failed" in d["response_text"] for d in dumped)


def test_threshold_is_exclusive_and_counts_over_what_was_asked():
    loop.check_failure_rate(3, "Teacher requests", 1, 10, 0.1, "hint")  # exactly 10 %: goes on
    loop.check_failure_rate(3, "Teacher requests", 0, 0, 0.1, "hint")  # nothing asked: nothing failed
    with pytest.raises(loop.FailureRateError, match=r"stopped at step 3: 2 of 10 Teacher requests failed \(20\.0%\), "
                                                    r"above config\.max_failure_rate=0\.1; is the judge up"):
        loop.check_failure_rate(3, "Teacher requests", 2, 10, 0.1, "is the judge up")
    # EviBack's Teacher counters are what the loop reads for the judge's rate.
    assert loop.JUDGE_FAILURE_METRICS == {"eviback/teacher_failures": ("eviback/stage_a_requests",
                                                                       "eviback/stage_b_requests")}
