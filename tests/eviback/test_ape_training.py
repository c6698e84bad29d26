"""The CPU demonstration end to end on a tiny model: labelled traces -> E2E-APE with the tiny model as local
Teacher and the rule-based controller over HTTP -> a frozen bundle -> one step of the real trainer whose
EviBack reward loads that bundle (and refuses it once a file is changed)."""

import hashlib
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from retrieval.bm25 import BM25Index
from retrieval.corpus import Hit, Passage
from searchjax.agent import protocol
from searchjax.agent.rollout import Prompt, Trajectory
from searchjax.eval.stage_a_harness import INSUFFICIENT, SUFFICIENT, StageATrace
from searchjax.experiment import loop
from searchjax.judges.ape import ApeConfig, run_ape
from searchjax.judges.ape_rules import rule_controller
from searchjax.judges.local import LocalJudge, LocalJudgeConfig
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.teacher_bundle import BUNDLE_FORMAT, load_bundle, policy_from_dict
from searchjax.judges.testing_server import serve_scripted
from searchjax.rewards.eviback import EvibackConfig

REPO = pathlib.Path(__file__).resolve().parents[2]
CITIES = ["Lyon", "Paris", "Rome", "Oslo"]
# Short seed prompts (same placeholders and reply formats as eviback_stage_a.v1 / eviback_stage_b_refine.v1):
# with a byte-level tokenizer every character is a token, and the tiny Teacher's time grows with the prompt.
STAGE_A = ('[system]\nYou are an evidence auditor.\n[user]\nQuestion: {question}\nDocuments:\n{evidence}\n\n'
           'Reply with only one of these JSON objects: {"verdict": "Supported"} or {"verdict": "Ambiguous"} or '
           '{"verdict": "Insufficient"}\n')
STAGE_B = ('[system]\nYou are an evidence-grounded answer editor.\n[user]\nQuestion: {question}\nDocuments:\n'
           '{evidence}\nSystem\'s answer: {answer}\nReference answer(s): {references}\n\n'
           'Reply with only a JSON object of the form {"answer": "<the answer or N/A>"}\n')
LIMITS = {"max_evidence_passages": 2, "max_passage_chars": 80, "max_reply_tokens": 6}
PASSAGES = [Passage("0", "Alpha tower", "The alpha tower stands in Lyon."),
            Passage("1", "Beta bridge", "The beta bridge crosses a river."),
            Passage("2", "Gamma hill", "Gamma hill is small.")]


def _traces():
    out = []
    for i, city in enumerate(CITIES):
        for label, text in ((SUFFICIENT, f"Item {i} was made in {city}."), (INSUFFICIENT, f"Item {i} is old.")):
            out.append(StageATrace(f"q{i}/{label}", f"Where was item {i} made?", (Hit(f"{i}{label}", f"Item {i}",
                                   text, 0.0),), (city,), "It is Nice.", label))
    return out


def scripted_rollout(components, params, prompts, rollout_cfg, seed):
    """One search (query = the prompt's uid tail) then a wrong answer, with real tokenisation and retrieval."""
    tok, out = components.tokenizer, []
    for prompt in prompts:
        prompt_ids = tok.encode(protocol.build_prompt(prompt.question, tok))
        for s, query in enumerate(["alpha tower", "beta bridge", "gamma hill", "alpha tower"][:rollout_cfg["group_size"]]):
            hits = components.retriever.search([query], rollout_cfg["topk"])[0]
            spans = [(f"<search> {query} </search>", 1), (protocol.search_observation(hits), 0),
                     ("<answer> Nice </answer>", 1)]
            ids, mask = [], []
            for text, m in spans:
                piece = tok.encode(text)
                ids, mask = ids + piece, mask + [m] * len(piece)
            out.append(Trajectory(prompt=prompt, sample_index=s, prompt_ids=prompt_ids, response_ids=ids,
                                  loss_mask=mask, sampler_logprobs=[-1.0 * m for m in mask],
                                  response_text=tok.decode(ids), queries=[query], doc_ids=[[h.id for h in hits]],
                                  retrieved=[list(hits)], answer="Nice", num_searches=1, duplicate_queries=0,
                                  forced_termination=False, valid_answer=True, end_reason="answer", num_turns=2))
    return out


def _config(bundle):
    spec = importlib.util.spec_from_file_location("configs_eviback", REPO / "configs" / "eviback.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("quickstart")
    config.update(total_steps=1, prompts_per_step=2, rollout_fn="scripted")
    config.rollout.update(group_size=4, topk=1)
    config.loss.kl_coef = 0.0
    config.batch.update(mini_batch_size=8, micro_batch_size=4, prompt_buckets=(512, 1024), response_buckets=(128, 256))
    config.eval.every = config.checkpoint.every = 0
    config.logging.update(trajectories_per_step=-1, progress_bar=False)
    config.eviback.update(bundle=str(bundle), **LIMITS)
    config.teacher.update(backend="local", local_checkpoint="policy", max_prompt_tokens=1024)
    return config


@pytest.mark.heavy
def test_traces_to_frozen_bundle_to_a_training_step(tiny_judge_model, tmp_path, monkeypatch):
    model, params, tokenizer, _ = tiny_judge_model
    teacher = LocalJudge(model, params, tokenizer, LocalJudgeConfig(max_prompt_tokens=1024, batch_rows=8))
    cfg = EvibackConfig(stage_b_mode="refine", stage_b_prompt="eviback_stage_b_refine.v1", **LIMITS)
    seed = policy_from_dict({"format": BUNDLE_FORMAT, "name": "short-v1",
                             "stage_a": {"prompt": "a.txt", "parser": {"kind": "json", "fields": {
                                 "verdict": {"enum": ["Supported", "Ambiguous", "Insufficient"]}}}},
                             "stage_b": {"prompt": "b.txt", "mode": "refine", "parser": {"kind": "json", "fields": {
                                 "answer": {"type": "string", "none_values": ["N/A"]}}}}},
                            {"a.txt": STAGE_A, "b.txt": STAGE_B})
    with serve_scripted(rule_controller) as server:
        controller = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="rules", api_key_env=""))
        result = run_ape(_traces(), teacher, controller, cfg, ApeConfig(
            rounds=1, candidates_per_round=1, repeats=1, finalists=2, max_parse_failure_rate=1.0, min_stability=0.0),
            seeds=[seed], output_dir=tmp_path / "bundle")
        assert len(server.request_bodies()) == 1
    bundle = load_bundle(result.bundle)
    assert bundle.name == result.winner.name and {"controller_log.jsonl", "scores.json"} <= {
        p.name for p in result.bundle.iterdir()}
    assert json.loads((result.bundle / "scores.json").read_text())["split_sizes"] == [4, 2, 2]

    prompts = [Prompt(uid=f"t/{k}", question=f"Where is tower {k}?", golden_answers=("Lyon",)) for k in range(2)]
    components = loop.Components(model=model, params=params, tokenizer=tokenizer,
                                 retriever=BM25Index.build(PASSAGES), train_prompts=prompts, eval_prompts=[])
    calls = []
    monkeypatch.setitem(loop.ROLLOUT_FNS, "scripted", lambda *a: calls.append(1) or scripted_rollout(*a))
    metrics = loop.train(_config(result.bundle), tmp_path / "run", components=components)
    assert calls == [1] and all(np.isfinite(v) for k, v in metrics.items() if k.startswith("update/"))
    assert metrics["reward/eviback/all_zero_groups"] == 2.0
    records = [json.loads(line) for line in (tmp_path / "run" / "eviback_audit.jsonl").read_text().splitlines()]
    manifest_sha = hashlib.sha256((result.bundle / "manifest.json").read_bytes()).hexdigest()
    files = {s: hashlib.sha256((result.bundle / f"stage_{s.lower()}.txt").read_bytes()).hexdigest() for s in "AB"}
    assert records and {r["stage"] for r in records} <= {"A", "B"}
    assert all(r["bundle_sha256"] == manifest_sha and r["prompt_sha256"] == files[r["stage"]] for r in records)
    assert all(r["judge"]["backend"] == "local" for r in records)

    # A changed bundle is refused before anything runs.
    text = (result.bundle / "stage_b.txt").read_text()
    (result.bundle / "stage_b.txt").write_text(text + "\nAlso answer in French.\n")
    with pytest.raises(ValueError, match=r"stage_b\.txt has sha256 .* changed after it was frozen"):
        loop.train(_config(result.bundle), tmp_path / "run2", components=components)
    assert calls == [1]
