"""EviBack inside the real trainer: one RL step of `searchjax.experiment.loop.train` with the Teacher behind a real
OpenAI-compatible HTTP server on loopback (a scripted rule-based judge), a real BM25 retriever, real
tokenisation and the jitted update. One group fails at the Teacher and must not stop training."""

import hashlib
import importlib.util
import json
import pathlib

import numpy as np

from eviback_scripts import question_of, scripted_teacher
from retrieval.bm25 import BM25Index
from retrieval.corpus import Passage
from searchjax.agent import protocol
from searchjax.agent.rollout import Prompt, Trajectory
from searchjax.judges.templates import PROMPTS_DIR
from searchjax.judges.testing_server import ScriptedReply, serve_scripted
from searchjax.experiment import loop
from searchjax.rl.advantages import grpo_advantages

REPO = pathlib.Path(__file__).resolve().parents[2]
GROUP = 4
LAM = 0.1
PASSAGES = [Passage("0", "Alpha tower", "alpha tower supported-marker stands in lyon near the river."),
            Passage("1", "Beta bridge", "beta bridge ambiguous-marker crosses a river somewhere in france."),
            Passage("2", "Gamma hill", "gamma hill is a small hill with nothing else to say."),
            Passage("3", "Delta lake", "delta lake is cold and deep and far away.")]
# sample index -> (search query, final answer); the gold of every question is "lyon"
SCRIPT = {"all-zero": [("alpha tower", "paris"), ("gamma hill", "rome"), ("beta bridge", "lyon city"),
                       ("delta lake", "oslo")],
          "mixed": [("alpha tower", "lyon"), ("gamma hill", "rome"), ("beta bridge", "nice"), ("delta lake", "oslo")],
          "bad": [("alpha tower", "paris"), ("gamma hill", "rome"), ("beta bridge", "lyon city"),
                  ("delta lake", "oslo")]}


def scripted_rollout(components, params, prompts, rollout_cfg, seed):
    """Trajectories with scripted policy text, real retrieval and the protocol's observation format; token ids
    from the real tokenizer (generated spans loss mask 1, observations 0)."""
    tok, retriever = components.tokenizer, components.retriever
    out = []
    for prompt in prompts:
        kind = prompt.uid.split("/")[1]
        prompt_ids = tok.encode(protocol.build_prompt(prompt.question, tok), add_special_tokens=False)
        queries = [q for q, _ in SCRIPT[kind]][:rollout_cfg["group_size"]]
        results = retriever.search(queries, rollout_cfg["topk"])
        for s, ((query, answer), hits) in enumerate(zip(SCRIPT[kind], results)):
            spans = [(f"<think> look it up </think>\n<search> {query} </search>", 1),
                     (protocol.search_observation(hits), 0), (f"<answer> {answer} </answer>", 1)]
            ids, mask = [], []
            for text, m in spans:
                piece = tok.encode(text, add_special_tokens=False)
                ids += piece
                mask += [m] * len(piece)
            out.append(Trajectory(prompt=prompt, sample_index=s, prompt_ids=prompt_ids, response_ids=ids,
                                  loss_mask=mask, sampler_logprobs=[-1.0 * m for m in mask],
                                  response_text=tok.decode(ids), queries=[query], doc_ids=[[h.id for h in hits]],
                                  retrieved=[list(hits)], answer=answer, num_searches=1, duplicate_queries=0,
                                  forced_termination=False, valid_answer=True, end_reason="answer", num_turns=2))
    return out


def _config(base_url):
    spec = importlib.util.spec_from_file_location("configs_eviback", REPO / "configs" / "eviback.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("quickstart")
    config.total_steps = 1
    config.prompts_per_step = 3
    config.rollout_fn = "scripted"
    config.rollout.group_size = GROUP
    config.rollout.topk = 1
    config.loss.kl_coef = 0.0
    config.batch.mini_batch_size = 12
    config.batch.micro_batch_size = 6
    config.batch.prompt_buckets = (512, 1024)
    config.batch.response_buckets = (128, 256)
    config.eval.every = 0
    config.checkpoint.every = 0
    # One group's Teacher requests fail on purpose (4 of 10): the step must count them and train on the rest, so
    # the run-stopping failure threshold is set above that rate here.
    config.max_failure_rate = 0.5
    config.logging.trajectories_per_step = -1
    config.logging.progress_bar = False
    config.teacher.backend = "openai_compat"
    config.teacher.base_url = base_url
    config.teacher.model = "scripted-teacher"
    config.teacher.api_key_env = ""
    config.teacher.max_attempts = 2
    config.teacher.backoff_initial_s = 0.01
    config.eviback.lam = LAM
    return config


def test_one_training_step_with_http_teacher(tiny_judge_model, tmp_path, monkeypatch):
    model, params, tokenizer, _ = tiny_judge_model
    prompts = [Prompt(uid=f"test/{kind}", question=f"Where is the {kind} tower?", golden_answers=("lyon",))
               for kind in ("all-zero", "mixed", "bad")]
    components = loop.Components(model=model, params=params, tokenizer=tokenizer,
                                 retriever=BM25Index.build(PASSAGES), train_prompts=prompts, eval_prompts=[])
    monkeypatch.setitem(loop.ROLLOUT_FNS, "scripted", scripted_rollout)

    def responder(body):
        if question_of(body).startswith("Where is the bad"):
            return ScriptedReply(status=500)
        return scripted_teacher(body)
    with serve_scripted(responder) as server:
        metrics = loop.train(_config(server.base_url), tmp_path, components=components)
        bodies = server.request_bodies()

    # The step ran to the end with finite update metrics.
    assert all(np.isfinite(v) for k, v in metrics.items() if k.startswith("update/"))
    assert metrics["reward/eviback/stage_b_calls"] >= 1 and metrics["reward/eviback/failed_groups"] == 1
    assert metrics["reward/eviback/all_zero_groups"] == 2 and metrics["reward/eviback/teacher_failures"] >= 1
    assert any(b["messages"][0]["content"].startswith("You grade") for b in bodies)

    rows = [json.loads(line) for line in (tmp_path / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    by_uid = {uid: [r for r in rows if r["uid"] == uid] for uid in ("test/all-zero", "test/mixed", "test/bad")}
    # all-zero group: Supported/paris 0.5, Insufficient 0, Ambiguous/"lyon city" (Correct) 0.5, Insufficient 0
    fallback = np.array([0.5, 0.0, 0.5, 0.0])
    z = (fallback - fallback.mean()) / (fallback.std(ddof=1) + 1e-6)
    adv = np.array([r["advantage"] for r in by_uid["test/all-zero"]])
    np.testing.assert_allclose(adv, LAM * z, rtol=1e-5)
    assert np.any(adv != 0) and np.all(adv <= LAM * (GROUP - 1) / np.sqrt(GROUP) * (1 + 1e-6))
    # mixed group: plain GRPO on EM, bit for bit; failed group: zero advantages
    mixed = by_uid["test/mixed"]
    em = np.array([r["reward"] for r in mixed], np.float32)
    assert em.tolist() == [1.0, 0.0, 0.0, 0.0]
    expected = grpo_advantages(em, ["m"] * GROUP)
    assert np.array_equal(np.array([r["advantage"] for r in mixed], np.float32), expected)
    assert [r["advantage"] for r in by_uid["test/bad"]] == [0.0] * GROUP

    # Every Teacher request is audited with the prompt file's hash.
    records = [json.loads(line) for line in (tmp_path / "eviback_audit.jsonl").read_text().splitlines()]
    sha = {s: hashlib.sha256((PROMPTS_DIR / f"eviback_stage_{s.lower()}.v1.txt").read_bytes()).hexdigest()
           for s in "AB"}
    assert {r["stage"] for r in records} == {"A", "B"}
    assert all(r["prompt_sha256"] == sha[r["stage"]] and r["step"] == 0 for r in records)
    assert any(r["error_kind"] == "http" for r in records)
