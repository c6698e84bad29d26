"""A rule-based stand-in for the E2E-APE controller LLM, for CPU runs without a controller endpoint.

The paper's controller is GPT-5.5; a run on a laptop or in CI has none. `rule_controller(body)` answers an
OpenAI-compatible chat request (serve it with `searchjax.judges.testing_server.serve_scripted`, so the loop
goes through the same HTTP judge path as a real controller) by reading the state that `searchjax.judges.ape.
controller_request` sends and applying fixed rules to the current best candidate's diagnostics, one
hypothesis per candidate, in this priority order:

1. parse failures in a stage -> that stage gets a lenient regex parser (a verdict word anywhere in the reply;
   the first run of answer text after an optional `"answer": "`);
2. more missed than false Insufficient verdicts -> one stricter Stage A instruction (`ape_edits.EDITS`:
   "explicit", "find_sentence", "doubt_insufficient");
3. more false than missed Insufficient verdicts -> the lenient instruction ("any_document");
4. gold in the evidence left uncovered -> a grade-mode policy switches to refinement (eviback_stage_b_refine.v1),
   Ambiguous opens Stage B, or Stage B is told to copy the reference's wording.

Hypotheses already on the scoreboard or rejected are skipped; `candidate_index_in_round` picks among the
remaining ones, so the candidates of one round differ. With nothing left it replies with a sentence, not a
bundle (the loop logs the rejection and goes on). It never sees more than the controller would: it reads
only the request.
"""

from __future__ import annotations

import copy
import json

from searchjax.judges.ape_edits import EDITS, insert_instruction
from searchjax.judges.teacher_bundle import template_text
from searchjax.judges.templates import load_prompt

STATE_START, STATE_END = "The study so far:\n", "\n\nPropose the next candidate"
LENIENT_A = {"kind": "regex", "pattern": r"(?i)(?P<verdict>supported|ambiguous|insufficient)",
             "fields": {"verdict": {"enum": ["Supported", "Ambiguous", "Insufficient"]}},
             "choices": {v: json.dumps({"verdict": v}) for v in ("Supported", "Ambiguous", "Insufficient")}}
LENIENT_B = {"kind": "regex", "pattern": r'(?:"answer"\s*:\s*")?(?P<answer>[^"\n{}]+)',
             "fields": {"answer": {"type": "string", "max_chars": 200, "none_values": ["N/A", "none", "unknown"]}}}
COPY_REFERENCE = ("When the documents support the reference answer, copy the reference answer's exact wording; "
                  "do not add words around it.")
REFINE_PARSER = {"kind": "json", "fields": {"answer": {"type": "string", "none_values": ["N/A", "none", "unknown"]}}}


def read_state(body: dict) -> dict:
    """The state JSON of an E2E-APE controller request."""
    user = body["messages"][-1]["content"]
    start = user.index(STATE_START) + len(STATE_START)
    return json.loads(user[start:user.rindex(STATE_END)])


def _variant(best: dict, hypothesis: str, **changes) -> tuple[str, dict]:
    candidate = copy.deepcopy(best)
    candidate.update(changes)
    candidate["name"], candidate["hypothesis"] = hypothesis.split(":")[0], hypothesis
    return hypothesis, candidate


def proposals(state: dict) -> list[tuple[str, dict]]:
    """Every (hypothesis, candidate) the rules suggest for the current best, in priority order."""
    best, diag = state["current_best"], state["current_best_diagnostics"]
    out = []
    stages = {f["stage"] for f in diag["parse_failures"]}
    if "A" in stages and best["stage_a_parser"] != LENIENT_A:
        out.append(_variant(best, "lenient-a: Stage A replies fail to parse; take the first verdict word",
                            stage_a_parser=LENIENT_A))
    if "B" in stages and best["stage_b_mode"] == "refine" and best["stage_b_parser"] != LENIENT_B:
        out.append(_variant(best, "lenient-b: Stage B replies fail to parse; take the first answer text",
                            stage_b_parser=LENIENT_B))
    missed, false = diag["missed_insufficient_count"], diag["false_insufficient_count"]
    edits = dict(EDITS)
    names = ("explicit", "find_sentence", "doubt_insufficient") if missed >= false else ("any_document",)
    if missed or false:
        for name in names:
            if edits[name] not in best["stage_a_prompt"]:
                out.append(_variant(best, f"edit-{name}: {missed} missed and {false} false Insufficient verdicts; "
                                          f"add: {edits[name]}",
                                    stage_a_prompt=insert_instruction(best["stage_a_prompt"], edits[name])))
    if diag["uncovered_gold_count"]:
        gate = dict(best["gate"])
        if best["stage_b_mode"] == "grade":
            out.append(_variant(best, "refine: grading writes no answer; refine the answer from the evidence",
                                stage_b_mode="refine", stage_b_parser=REFINE_PARSER,
                                stage_b_prompt=template_text(load_prompt("eviback_stage_b_refine.v1"))))
        if "Ambiguous" not in gate["open_stage_b"]:
            gate["open_stage_b"] = ["Supported", "Ambiguous"]
            out.append(_variant(best, "open-ambiguous: gold uncovered; let Ambiguous verdicts open Stage B", gate=gate))
        if best["stage_b_mode"] == "refine" and COPY_REFERENCE not in best["stage_b_prompt"]:
            out.append(_variant(best, "copy-reference: refined answers miss the reference's wording",
                                stage_b_prompt=insert_instruction(best["stage_b_prompt"], COPY_REFERENCE)))
    return out


def rule_controller(body: dict) -> str:
    """The controller's reply to one request: a candidate bundle as JSON, or a sentence when out of ideas."""
    state = read_state(body)
    seen = {e["hypothesis"] for e in state["scoreboard"]} | set(state["rejected_replies"])
    options = [(h, c) for h, c in proposals(state) if h not in seen]
    if not options:
        return "I have no further candidate to propose."
    return json.dumps(options[state["candidate_index_in_round"] % len(options)][1], ensure_ascii=False)
