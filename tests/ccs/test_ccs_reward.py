"""CCS rewards through a real OpenAI-compatible server on loopback: cosine similarity against
sentence-transformers, N/A / empty / garbage replies scored 0 and counted, infrastructure failures turned into
zero-advantage groups and counters (never raised), deduplication and the audit file."""

import json

import numpy as np
import pytest

from ccs_helpers import final_turn, make_trajectory, search_turn, short_hits, trace_of
from searchjax.agent.rollout import Prompt
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.testing_server import ScriptedReply, dead_endpoint_url, serve_scripted
from searchjax.rewards import cycle
from searchjax.rl.advantages import apply_group_overrides, grpo_advantages

QUESTION = "What is the capital city of China?"
# Each trajectory's query carries a lowercase keyword that tells the scripted reconstructor what to reply; the
# keywords are words spaCy leaves unmasked (it tags lowercase "bravo" PERSON and "delta" ORG, for instance).
REPLIES = {
    "alpha": "What is the capital city of China?",
    "walnut": "Question: \"Which city is the capital of China?\"\nExplanation: Beijing is the capital.",
    "charlie": "N/A",
    "pebble": "",
    "echo": "%%% ### !!!",
    "foxtrot": "Doc 1(Title: China) China is a country in East Asia",
    "golf": "What is the capital city of [LOC]?",
    "hotel": "n/a - the [LOC] tag cannot be resolved from the results.",
    "lantern": " ".join(["capital"] * 80),
}
STATUS = {"alpha": "ok", "walnut": "ok", "charlie": "na", "pebble": "empty", "echo": "garbage", "foxtrot": "garbage",
          "golf": "unresolved_tag", "hotel": "na", "lantern": "garbage"}


def _keyword(body):
    return next(k for k in [*REPLIES, "broken"] if f"Search query: {k} " in trace_of(body))


def _http_judge(url, **kw):
    fields = dict(base_url=url, model="scripted-reconstructor", api_key_env="", timeout_s=5.0, max_attempts=2,
                  backoff_initial_s=0.01, backoff_max_s=0.02)
    fields.update(kw)
    return OpenAICompatJudge(OpenAICompatConfig(**fields))


def _trajectory(tokenizer, hits, uid, keyword, sample_index=0):
    prompt = Prompt(uid=uid, question=QUESTION, golden_answers=("Beijing",))
    turns = [search_turn("Let me search.", f"{keyword} capital of China", hits), final_turn("Found it.", "Beijing")]
    return make_trajectory(tokenizer, prompt, turns, sample_index=sample_index)


@pytest.fixture(scope="module")
def china_hits(bm25):
    return short_hits(bm25.search([QUESTION], 2)[0], 300)


def test_reply_statuses_rewards_and_counters(tokenizer, china_hits, spacy_ner, minilm, minilm_dir, tmp_path):
    from sentence_transformers import SentenceTransformer
    keywords = list(REPLIES)
    trajectories = [_trajectory(tokenizer, china_hits, f"test/{k}", k) for k in keywords]
    trajectories.append(_trajectory(tokenizer, china_hits, "test/alpha-twin", "alpha"))  # same request as alpha
    with serve_scripted(lambda body: REPLIES[_keyword(body)]) as server:
        cfg = cycle.CcsConfig(audit_path=str(tmp_path / "audit.jsonl"))
        result = cycle.ccs_rewards(trajectories, _http_judge(server.base_url), minilm, spacy_ner, tokenizer, cfg)
        received = server.request_bodies()
    assert len(received) == len(keywords)  # the twin's identical request was asked once
    assert result.statuses == [STATUS[k] for k in keywords] + ["ok"]
    reference = SentenceTransformer(str(minilm_dir), device="cpu")
    originals = reference.encode([QUESTION, QUESTION], normalize_embeddings=True)
    recon = reference.encode(["What is the capital city of China?", "Which city is the capital of China?"],
                             normalize_embeddings=True)
    expected = np.zeros(len(trajectories))
    expected[0] = expected[-1] = float(originals[0] @ recon[0])
    expected[1] = float(originals[1] @ recon[1])
    np.testing.assert_allclose(result.rewards, expected, rtol=1e-4, atol=1e-4)
    assert result.rewards[0] > 0.99 and 0.5 < result.rewards[1] < result.rewards[0]
    m = result.metrics
    assert (m["status/ok"], m["status/na"], m["status/empty"], m["status/garbage"], m["status/unresolved_tag"]) == \
        (3, 2, 1, 3, 1)
    assert m["zero_reward_replies"] == 7 and m["failed_groups"] == 0 and m["requests"] == 9 and m["deduplicated"] == 1
    assert not result.overrides
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert len(records) == 9 and {r["status"] for r in records} == set(STATUS.values())
    assert records[0]["trajectories"] == [["test/alpha", 0], ["test/alpha-twin", 0]]
    assert records[0]["masked_queries"] == ["alpha capital of [LOC]"]
    assert abs(records[0]["similarity"] - expected[0]) < 1e-4


FAILURES = {"http500": ScriptedReply(status=500), "http400": ScriptedReply(status=400),
            "timeout": ScriptedReply(content="What is it?", delay_s=1.0),
            "no_content": ScriptedReply(content=None)}
KINDS = {"http500": "http", "http400": "http", "timeout": "timeout", "no_content": "malformed", "dead": "connection"}


@pytest.mark.parametrize("failure", [*FAILURES, "dead"])
def test_infrastructure_failures_zero_the_group_and_are_counted(failure, tokenizer, china_hits, spacy_ner, minilm):
    # Group "test/bad": one trajectory whose request fails, one that works; group "test/good": two that work.
    trajectories = [_trajectory(tokenizer, china_hits, "test/bad", "broken", 0),
                    _trajectory(tokenizer, china_hits, "test/bad", "alpha", 1),
                    _trajectory(tokenizer, china_hits, "test/good", "alpha", 0),
                    _trajectory(tokenizer, china_hits, "test/good", "walnut", 1)]

    def responder(body):
        keyword = _keyword(body)
        return FAILURES[failure] if keyword == "broken" else REPLIES[keyword]
    with serve_scripted(responder) as server:
        url = dead_endpoint_url() if failure == "dead" else server.base_url
        judge = _http_judge(url, timeout_s=0.25)
        out = cycle.ccs_reward(trajectories, judge, minilm, spacy_ner, tokenizer, cycle.CcsConfig())  # never raises
    failed_groups = {"test/bad", "test/good"} if failure == "dead" else {"test/bad"}
    assert set(out.advantage_overrides) == failed_groups
    for uid in failed_groups:
        np.testing.assert_array_equal(out.advantage_overrides[uid], np.zeros(2, np.float32))
    assert out.metrics["ccs/failed_groups"] == len(failed_groups)
    assert out.metrics[f"ccs/failures/{KINDS[failure]}"] >= 1
    assert out.rewards[0] == 0.0
    uids = [t.prompt.uid for t in trajectories]
    advantages = apply_group_overrides(grpo_advantages(out.rewards, uids), uids, out.advantage_overrides)
    np.testing.assert_array_equal(advantages[:2], np.zeros(2, np.float32))
    if failure != "dead":  # the healthy group trains as usual
        assert out.rewards[2] > out.rewards[3] > 0 and advantages[2] > 0 > advantages[3]


def test_local_backend_error_is_a_failed_group(smollm2, tokenizer, china_hits, spacy_ner, minilm):
    from searchjax.judges.local import LocalJudge, LocalJudgeConfig
    model, params, tok = smollm2
    judge = LocalJudge(model, params, tok, LocalJudgeConfig(max_prompt_tokens=16))  # every chat is too long
    trajectories = [_trajectory(tokenizer, china_hits, "test/local", "alpha", g) for g in range(2)]
    out = cycle.ccs_reward(trajectories, judge, minilm, spacy_ner, tokenizer, cycle.CcsConfig())
    assert out.metrics["ccs/failures/backend"] == 1 and out.metrics["ccs/failed_groups"] == 1
    np.testing.assert_array_equal(out.advantage_overrides["test/local"], np.zeros(2, np.float32))


def test_inconsistent_trajectory_is_a_clear_error(tokenizer, china_hits, spacy_ner, minilm):
    trajectory = _trajectory(tokenizer, china_hits, "test/x", "alpha")
    trajectory.queries = trajectory.queries + ["a query without an observation"]
    with pytest.raises(ValueError, match="test/x.*2 queries but 1 information blocks"):
        cycle.ccs_reward([trajectory], _http_judge(dead_endpoint_url()), minilm, spacy_ner, tokenizer,
                         cycle.CcsConfig())


@pytest.mark.parametrize("reply, status, question", [
    ("What is the capital city of China?", "ok", "What is the capital city of China?"),
    ("Reconstructed question:\nWho wrote Hamlet?", "ok", "Who wrote Hamlet?"),
    ('The agent was trying to answer the question: "Who wrote Hamlet?" I think.', "ok", "Who wrote Hamlet?"),
    ("**Question:** Who wrote Hamlet?\nBecause the documents say so.", "ok", "Who wrote Hamlet?"),
    ("```\nWho wrote Hamlet?\n```", "ok", "Who wrote Hamlet?"),
    ("N/A", "na", None), ("n/a.", "na", None), ("Question: N/A", "na", None),
    ("NA - not enough evidence", "na", None),
    ("", "empty", None), ("  \n\n ", "empty", None), ('""', "empty", None),
    ("Hamlet", "garbage", None), ("42 17", "garbage", None), ("?!", "garbage", None),
    ("Born in 1917?", "ok", "Born in 1917?"),
    ("<information>Doc 1(Title: Hamlet) Hamlet is a play</information>", "garbage", None),
    ("Who founded [ORG]?", "unresolved_tag", None),
])
def test_parse_reconstruction(reply, status, question):
    assert cycle.parse_reconstruction(reply, cycle.CcsConfig()) == (status, question)


def _tiny_qwen3_embedding(directory, texts):
    """A 2-layer random Qwen3 saved by transformers with a byte-level BPE (a stand-in for Qwen3-Embedding-4B)."""
    import torch
    import transformers
    from tiny_bpe import tiny_bpe
    tokenizer = tiny_bpe(texts, vocab_size=300)
    config = transformers.Qwen3Config(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      tie_word_embeddings=False, max_position_embeddings=256, bos_token_id=0,
                                      eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                          dtype=torch.float32).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer


def test_decoder_embedder_from_config_matches_torch(tokenizer, china_hits, tmp_path):
    """configs/ccs.py's embedder section with kind "decoder" (Qwen3-Embedding's last-token pooling), the HTTP
    reconstructor and the spaCy NER, all built by reward_from_config; the reward against torch."""
    import importlib.util
    import pathlib

    import torch
    reconstruction = "Which city is the capital of China?"
    model, hf_tokenizer = _tiny_qwen3_embedding(tmp_path / "embedder", [QUESTION, reconstruction])
    spec = importlib.util.spec_from_file_location(
        "configs_ccs", pathlib.Path(__file__).resolve().parents[2] / "configs" / "ccs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("qwen3-4b-instruct-2507")
    config.ner.backend, config.ner.model = "spacy", ""
    config.embedder.path, config.embedder.dtype = str(tmp_path / "embedder"), "float32"
    with serve_scripted(lambda body: reconstruction) as server:
        config.reconstructor.base_url, config.reconstructor.api_key_env = server.base_url, ""
        reward_fn = cycle.reward_from_config(config, tokenizer=tokenizer, workdir=tmp_path / "run")
        out = reward_fn([_trajectory(tokenizer, china_hits, "test/decoder", "alpha")])
    eos = hf_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    rows = []
    for text in (QUESTION, reconstruction):  # bare text + <|endoftext|>, the last hidden state, L2-normalised
        ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        with torch.no_grad():
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        rows.append(torch.nn.functional.normalize(hidden, dim=-1).numpy())
    np.testing.assert_allclose(out.rewards, [float(rows[0] @ rows[1])], atol=1e-4)
    assert out.metrics["ccs/status/ok"] == 1
    assert json.loads((tmp_path / "run" / "ccs_audit.jsonl").read_text())["masked_queries"] == \
        ["alpha capital of [LOC]"]
