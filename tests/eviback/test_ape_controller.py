"""E2E-APE's controller loop over real HTTP: a scripted controller whose replies depend on the diagnostics it
receives (so the search only succeeds when the loop passes them), replies that are not bundles, a parser spec
that does not compile, a gold leak, the budget, the split discipline and the frozen bundle."""

import json

import numpy as np
import pytest

from retrieval.corpus import Hit
from searchjax.eval.stage_a_harness import INSUFFICIENT, SUFFICIENT, StageATrace
from searchjax.judges.ape import ApeConfig, objective, partition, run_ape
from searchjax.judges.ape_edits import EDITS, insert_instruction
from searchjax.judges.ape_rules import COPY_REFERENCE, read_state, rule_controller
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.teacher_bundle import load_bundle, policy_from_prompts
from searchjax.judges.testing_server import serve_scripted
from searchjax.rewards.eviback import EvibackConfig

CITIES = ["Lyon", "Oslo", "Cairo", "Quito", "Hanoi", "Dakar", "Perth", "Turin", "Minsk", "Tunis", "Lagos", "Riga"]
MAGIC_A = "Say Supported only when a sentence names the place."
MAGIC_B = "Write only the place name."
CFG = EvibackConfig(stage_b_mode="refine", stage_b_prompt="eviback_stage_b_refine.v1", max_reply_tokens=64)


def _traces():
    """Two traces per question (the gold stated, or not), the Actor answering wrongly or not at all."""
    out = []
    for i, city in enumerate(CITIES):
        question = f"Where was item {i} made?"
        for label, text in ((SUFFICIENT, f"Item {i} was made in {city}."), (INSUFFICIENT, f"Item {i} is in a museum.")):
            out.append(StageATrace(f"q{i}/{label}", question, (Hit(f"{i}{label}", f"Item {i}", text, 0.0),), (city,),
                                   "Paris" if i % 3 else "", label))
    return out


def _section(text, start, end):
    k = text.index(start) + len(start)
    return text[k:text.index(end, k)]


def _place(user):
    evidence = _section(user, "Retrieved documents:\n", "\n\n")
    return evidence.split("was made in ")[1].rstrip(".") if "was made in" in evidence else None


def teacher(body):
    """Stage A is right only with MAGIC_A in its prompt (else always Supported); refinement writes the bare place
    only with MAGIC_B (else "the town of <place>", which misses the gold under normalize_answer)."""
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    if system.startswith("You are an evidence auditor"):
        verdict = ("Supported" if _place(user) else "Insufficient") if MAGIC_A in user else "Supported"
        return json.dumps({"verdict": verdict})
    place = _place(user)
    if place is None:
        return '{"answer": "N/A"}'
    return json.dumps({"answer": place if MAGIC_B in user else f"the town of {place}"})


class DiagnosticController:
    """Replies from the request alone: prose first, then a bad parser spec, then whatever the diagnostics ask
    for (MAGIC_A for missed Insufficient verdicts, MAGIC_B for uncovered gold), then a gold-leaking candidate."""

    def __init__(self):
        self.states, self.golds = [], []

    def __call__(self, body):
        state = read_state(body)
        self.states.append(state)
        best, diag = dict(state["current_best"]), state["current_best_diagnostics"]
        self.golds += [g for kind in ("missed_insufficient", "uncovered_gold") for x in diag[kind] for g in x["golds"]]
        if not state["rejected_replies"]:
            return "Let me look at the traces first; I will propose a candidate next."
        if len(state["rejected_replies"]) == 1:
            best["stage_a_parser"] = {"kind": "regex", "pattern": "(?P<verdict>Supported", "fields": {
                "verdict": {"enum": ["Supported", "Insufficient"]}}}
            return json.dumps(best)
        missed = [x for x in diag["missed_insufficient"] if x["label"] == "Insufficient" and x["question"]]
        if missed and diag["missed_insufficient_count"] == len(missed):
            best.update(name="strict", hypothesis="missed Insufficient",
                        stage_a_prompt=insert_instruction(best["stage_a_prompt"], MAGIC_A))
            return "```json\n" + json.dumps(best) + "\n```"
        if diag["uncovered_gold"] and all(x["output"] for x in diag["uncovered_gold"]):
            best.update(name="bare", hypothesis="uncovered gold",
                        stage_b_prompt=insert_instruction(best["stage_b_prompt"], MAGIC_B))
            return json.dumps(best)
        best.update(name="leak", hypothesis="memorise",
                    stage_a_prompt=insert_instruction(best["stage_a_prompt"], f"Places: {', '.join(self.golds)}."))
        return json.dumps(best)


def _judges(teacher_server, controller_server):
    return (OpenAICompatJudge(OpenAICompatConfig(base_url=teacher_server.base_url, model="t", api_key_env="")),
            OpenAICompatJudge(OpenAICompatConfig(base_url=controller_server.base_url, model="c", api_key_env="",
                                                 max_concurrency=1)))


def test_partition_by_question_with_a_fixed_seed():
    traces = _traces()
    search, validation, heldout = partition(traces, 7, (0.5, 0.25, 0.25))
    assert (len(search), len(validation), len(heldout)) == (12, 6, 6)
    questions = [{t.question for t in split} for split in (search, validation, heldout)]
    assert not (questions[0] & questions[1] or questions[0] & questions[2] or questions[1] & questions[2])
    assert sorted(t.uid for s in (search, validation, heldout) for t in s) == sorted(t.uid for t in traces)
    assert partition(traces, 7) == (search, validation, heldout) and partition(traces, 8) != (search, validation, heldout)
    with pytest.raises(ValueError, match="cannot fill"):
        partition(traces[:4], 0)


def test_controller_loop_uses_diagnostics_skips_bad_replies_and_freezes(tmp_path):
    seed = policy_from_prompts("eviback_stage_a.v1", "eviback_stage_b_refine.v1", mode="refine", name="v1")
    controller = DiagnosticController()
    cfg = ApeConfig(seed=3, rounds=3, candidates_per_round=2, max_candidates=6, repeats=2, finalists=3)
    with serve_scripted(teacher) as ts, serve_scripted(controller) as cs:
        teacher_judge, controller_judge = _judges(ts, cs)
        result = run_ape(_traces(), teacher_judge, controller_judge, CFG, cfg, seeds=[seed], output_dir=tmp_path / "b")
        controller_bodies = cs.request_bodies()
    search, validation, heldout = partition(_traces(), 3)
    candidates = [r for r in result.log if r["event"] == "candidate"]
    assert [r["accepted"] for r in candidates] == [False, False, True, True, False, False]
    assert "is not a bundle: no JSON object" in candidates[0]["error"]
    assert "pattern does not compile" in candidates[1]["error"]
    assert "spells out the gold answer" in candidates[4]["error"]
    # The rejections reached the controller, and so did the diagnostics of the current best.
    assert controller.states[1]["rejected_replies"] == [candidates[0]["error"]]
    assert controller.states[2]["current_best_diagnostics"]["missed_insufficient_count"] == 6
    assert controller.states[3]["current_best"]["name"] == "r1.0:strict"
    names = [e.name for e in result.entries]
    assert names == ["v1", "r1.0:strict", "r1.1:bare"]
    scores = {e.name: e.search for e in result.entries}
    assert scores["v1"]["insufficient_f1"] == 0.0 and scores["r1.0:strict"]["insufficient_f1"] == 1.0
    assert scores["r1.0:strict"]["gold_coverage"] == 0.0 and scores["r1.1:bare"]["gold_coverage"] == 1.0
    assert scores["r1.1:bare"]["stability"] == 1.0 and scores["r1.1:bare"]["parse_failure_rate"] == 0.0
    assert result.winner.name == "r1.1:bare" and objective(result.winner.validation) == 1.0
    assert result.stop_reason == "rounds"
    assert result.heldout["r1.1:bare"]["insufficient_f1"] == 1.0 and result.heldout["v1"]["insufficient_f1"] == 0.0
    # Validation and held-out questions never reach the controller.
    shown = json.dumps(controller_bodies)
    assert all(t.question not in shown for t in validation + heldout)
    assert any(t.question in shown for t in search)
    # The frozen bundle: the winner's prompts, the full controller log, the scores, all hashed.
    bundle = load_bundle(result.bundle)
    assert MAGIC_A in bundle.stage_a.messages[-1][1] and MAGIC_B in bundle.stage_b.messages[-1][1]
    log = [json.loads(line) for line in (result.bundle / "controller_log.jsonl").read_text().splitlines()]
    assert [r["reply"] for r in log if r["event"] == "candidate"] == [r["reply"] for r in candidates]
    scores_file = json.loads((result.bundle / "scores.json").read_text())
    assert scores_file["winner"] == "r1.1:bare" and scores_file["split_sizes"] == [12, 6, 6]
    assert json.loads(bundle.provenance)["heldout"]["gold_coverage"] == 1.0


def test_budget_stops_the_loop():
    seed = policy_from_prompts("eviback_stage_a.v1", "eviback_stage_b_refine.v1", mode="refine", name="v1")
    with serve_scripted(teacher) as ts, serve_scripted(DiagnosticController()) as cs:
        teacher_judge, controller_judge = _judges(ts, cs)
        result = run_ape(_traces(), teacher_judge, controller_judge, CFG,
                         ApeConfig(rounds=5, candidates_per_round=2, max_candidates=3, repeats=1), seeds=[seed])
        assert len(cs.request_bodies()) == 3
    assert result.stop_reason == "max_candidates" and result.bundle is None
    tokens = ApeConfig(rounds=5, max_tokens=1, repeats=1)  # the seed's own Teacher calls spend it
    with serve_scripted(teacher) as ts, serve_scripted(DiagnosticController()) as cs:
        result = run_ape(_traces(), *_judges(ts, cs), CFG, tokens, seeds=[seed])
        assert cs.request_bodies() == []
    assert result.stop_reason == "max_tokens" and result.winner.name == "v1"


def test_rule_controller_follows_the_diagnostics():
    """The CPU stand-in: the stricter Stage A edit for missed Insufficient verdicts, then the Stage B edit for
    uncovered gold, each only because the diagnostics show that mistake."""
    strict = dict(EDITS)["explicit"]

    def rule_teacher(body):
        user = body["messages"][1]["content"]
        patched = {**body, "messages": [body["messages"][0], {"role": "user", "content": user.replace(
            strict, MAGIC_A).replace(COPY_REFERENCE, MAGIC_B)}]}
        return teacher(patched)
    seed = policy_from_prompts("eviback_stage_a.v1", "eviback_stage_b_refine.v1", mode="refine", name="v1")
    with serve_scripted(rule_teacher) as ts, serve_scripted(rule_controller) as cs:
        result = run_ape(_traces(), *_judges(ts, cs), CFG, ApeConfig(rounds=2, candidates_per_round=1, repeats=1),
                         seeds=[seed])
    assert [e.name for e in result.entries] == ["v1", "r0.0:edit-explicit", "r1.0:copy-reference"]
    assert np.isclose(objective(result.winner.search), 1.0) and result.winner.name == "r1.0:copy-reference"


def test_launcher_runs_from_a_config(tmp_path):
    """launch/ape.py's run(): traces file, the rule-based controller on loopback, the Teacher from config.teacher
    (here the scripted HTTP Teacher), the bundle under the workdir; every variant of configs/ape.py builds."""
    import importlib.util
    import pathlib
    from launch.ape import run
    from searchjax.eval.stage_a_harness import write_traces_jsonl
    repo = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("configs_ape", repo / "configs" / "ape.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for variant in ("", "paper", "quickstart"):
        c = module.get_config(variant)
        ApeConfig(**{k: v for k, v in c.ape.to_dict().items() if k not in ("traces", "controller", "seeds")})
    assert module.get_config("paper").controller.model == "gpt-5.5"
    write_traces_jsonl(_traces(), tmp_path / "traces.jsonl")
    config = module.get_config("quickstart")
    config.ape.update(traces=str(tmp_path / "traces.jsonl"), rounds=1, candidates_per_round=1)
    config.eviback.update(stage_b_mode="refine", stage_b_prompt="eviback_stage_b_refine.v1", max_reply_tokens=64)
    with serve_scripted(teacher) as ts:
        config.teacher.update(backend="openai_compat", base_url=ts.base_url, model="t", api_key_env="")
        summary = run(config, str(tmp_path / "work"))
    assert summary["bundle"] == str(tmp_path / "work" / "bundle") and load_bundle(summary["bundle"]).mode == "refine"
    assert [c["name"] for c in summary["candidates"]] == ["eviback_stage_a.v1+eviback_stage_b_refine.v1",
                                                          "r0.0:edit-explicit"]
    config.ape.traces = ""
    with pytest.raises(ValueError, match="config.ape.traces is empty"):
        run(config, str(tmp_path / "work2"))
