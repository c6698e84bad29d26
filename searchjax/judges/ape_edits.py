"""Stage-A-only instruction search: the controller-free, cheap relative of E2E-APE (searchjax.judges.ape).

After APE (Zhou et al. 2023, "Large Language Models Are Human-Level Prompt Engineers"): propose candidate
instructions, score each by running the gate end to end on labelled data (the same request builder, judge
backend, parsing and metric as training and the harness), keep the best, propose again around it. Only the
Stage A prompt changes; the gate table, Stage B and the parsers stay as configured. E2E-APE searches the whole
Teacher policy instead, and `searchjax.judges.ape_rules` reuses this module's edits.

1. The base prompt file (e.g. eviback_stage_a.v1) is scored on the training traces. Objective:
   insufficient-evidence F1 (Insufficient positive), ties broken by accuracy.
2. Candidates, each a complete prompt file: (a) the current best with one instruction sentence from
   `EDITS` inserted before its reply-format line; (b) with a proposer judge, `num_proposals` rewrites of
   the current best's last user message written by that LLM from `ape_proposer.v1` given up to
   `max_mistakes` training traces the current best misjudged. A candidate must parse and keep exactly
   the base's placeholders, else it is dropped.
3. Every candidate is scored; the best so far is kept; steps 2-3 repeat for `rounds` rounds.
4. If the best beats the base on the training traces, it is written as a new version
   (`<base>.v<N+1>.txt`, never overwriting) with a provenance comment (source, train and held-out
   scores); held-out traces are scored for the base and the winner and reported, never used to choose.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Sequence

from searchjax.judges.base import Judge, JudgeRequest
from searchjax.judges.templates import (PromptTemplate, load_prompt, next_version_path, parse_prompt_text,
                                        render_prompt, split_version)

# One instruction sentence per edit; each is a hypothesis about what the gate gets wrong.
EDITS = (
    ("explicit", "Choose Supported only if a document states the answer explicitly; a document that is merely "
                 "about the same topic is not enough."),
    ("find_sentence", "First look for a sentence in the documents that answers the question. If there is no such "
                      "sentence, the verdict is Insufficient."),
    ("doubt_insufficient", "When in doubt, choose Insufficient."),
    ("any_document", "If any single document states the answer, choose Supported even if the other documents "
                     "are unrelated."),
)
_REPLY_LINE = re.compile(r"^Reply with", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Candidate:
    name: str        # "base", "edit:<name>", "proposal:<round>.<k>"
    text: str        # the complete prompt file text


@dataclasses.dataclass
class ApeResult:
    base: Candidate
    best: Candidate
    history: list[tuple[str, dict]]       # (candidate name, training metrics), in scoring order
    base_heldout: dict | None = None
    best_heldout: dict | None = None
    written: pathlib.Path | None = None


def _template_text(template: PromptTemplate) -> str:
    return pathlib.Path(template.path).read_text(encoding="utf-8") if template.path else "\n".join(
        f"[{role}]\n{content}" for role, content in template.messages) + "\n"


def _last_user(text: str) -> tuple[int, int]:
    """(start, end) character span of the last [user] section's content."""
    headers = list(re.finditer(r"^\[(system|user|assistant)\][ \t]*$", text, re.MULTILINE))
    users = [k for k, h in enumerate(headers) if h.group(1) == "user"]
    if not users:
        raise ValueError("prompt has no [user] section")
    k = users[-1]
    start = headers[k].end() + 1
    end = headers[k + 1].start() if k + 1 < len(headers) else len(text)
    return start, end


def insert_instruction(text: str, sentence: str) -> str:
    """The prompt with `sentence` inserted before the last user message's "Reply with ..." line (else appended)."""
    start, end = _last_user(text)
    section = text[start:end]
    match = None
    for match in _REPLY_LINE.finditer(section):
        pass
    if match is None:
        return text[:start] + section.rstrip("\n") + "\n" + sentence + "\n" + text[end:]
    return text[:start] + section[:match.start()] + sentence + "\n\n" + section[match.start():] + text[end:]


def replace_user(text: str, new_user: str) -> str:
    start, end = _last_user(text)
    return text[:start] + new_user.strip("\n") + "\n" + text[end:]


def valid_candidate(text: str, fields: frozenset[str]) -> bool:
    try:
        return parse_prompt_text(text).fields == fields
    except ValueError:
        return False


def objective(metrics: dict) -> tuple[float, float]:
    return metrics["insufficient_f1"], metrics["accuracy"]


def score_candidate(text: str, judge: Judge, traces, cfg, template_b: PromptTemplate) -> dict:
    from searchjax.eval.stage_a_harness import evaluate_stage_a  # the harness imports rewards, not judges
    template_a = parse_prompt_text(text, name="candidate")
    return evaluate_stage_a(traces, judge, cfg, templates=(template_a, template_b), run_stage_b=False)


def propose_rewrites(proposer: Judge, current: Candidate, traces, rows: list[dict], *, num_proposals: int,
                     max_mistakes: int, round_index: int, max_tokens: int = 512) -> list[Candidate]:
    """LLM rewrites of the current best's last user message, from the cases it misjudged."""
    meta = load_prompt("ape_proposer.v1")
    by_uid = {t.uid: t for t in traces}
    wrong = [r for r in rows if (r["verdict"] == "Insufficient") != (r["label"] == "Insufficient")]
    mistakes = "\n".join(f"- {by_uid[r['uid']].question} | correct: "
                         f"{'Insufficient' if r['label'] == 'Insufficient' else 'Supported or Ambiguous'} | "
                         f"given: {r['verdict']}" for r in wrong[:max_mistakes]) or "- (none)"
    start, end = _last_user(current.text)
    request = JudgeRequest(messages=render_prompt(meta, instruction=current.text[start:end].strip("\n"),
                                                  mistakes=mistakes), max_tokens=max_tokens)
    out = []
    for k, reply in enumerate(proposer.complete_many([request] * num_proposals)):
        if isinstance(reply, Exception):
            continue
        body = re.sub(r"^```\w*\n|```$", "", reply.text.strip()).strip("<>\n ")
        out.append(Candidate(f"proposal:{round_index}.{k}", replace_user(current.text, body)))
    return out


def ape_search(judge: Judge, train_traces: Sequence, cfg, *, base_prompt: str | None = None,
               heldout_traces: Sequence = (), proposer: Judge | None = None, rounds: int = 1,
               num_proposals: int = 2, max_mistakes: int = 8, edits=EDITS,
               output_dir: str | pathlib.Path | None = None) -> ApeResult:
    """Search Stage A prompt variants (module docstring); write the winner to output_dir when it improves."""
    base_template = load_prompt(base_prompt or cfg.stage_a_prompt)
    template_b = load_prompt(cfg.stage_b_prompt)
    base = Candidate("base", _template_text(base_template))
    fields = base_template.fields
    scored = {base.text: score_candidate(base.text, judge, train_traces, cfg, template_b)}
    history = [(base.name, scored[base.text]["metrics"])]
    best = base
    for round_index in range(rounds):
        candidates = [Candidate(f"edit:{name}", insert_instruction(best.text, sentence)) for name, sentence in edits]
        if proposer is not None:
            candidates += propose_rewrites(proposer, best, train_traces, scored[best.text]["rows"],
                                           num_proposals=num_proposals, max_mistakes=max_mistakes,
                                           round_index=round_index)
        for candidate in candidates:
            if candidate.text in scored or not valid_candidate(candidate.text, fields):
                continue
            scored[candidate.text] = score_candidate(candidate.text, judge, train_traces, cfg, template_b)
            history.append((candidate.name, scored[candidate.text]["metrics"]))
            if objective(scored[candidate.text]["metrics"]) > objective(scored[best.text]["metrics"]):
                best = candidate
    result = ApeResult(base=base, best=best, history=history)
    if heldout_traces:
        result.base_heldout = score_candidate(base.text, judge, heldout_traces, cfg, template_b)["metrics"]
        result.best_heldout = (result.base_heldout if best is base else
                               score_candidate(best.text, judge, heldout_traces, cfg, template_b)["metrics"])
    if best is not base and output_dir is not None:
        stem, _ = split_version(base_template.name)
        path = next_version_path(stem, output_dir)
        train_base, train_best = objective(scored[base.text]["metrics"])[0], objective(scored[best.text]["metrics"])[0]
        header = [f"# written by searchjax.judges.ape from {base_template.name} (sha256 {base_template.sha256})",
                  f"# candidate {best.name}; train insufficient-F1 {train_base:.4f} -> {train_best:.4f} "
                  f"on {len(train_traces)} traces"]
        if result.best_heldout is not None:
            header.append(f"# held-out insufficient-F1 {result.base_heldout['insufficient_f1']:.4f} -> "
                          f"{result.best_heldout['insufficient_f1']:.4f} on {len(heldout_traces)} traces")
        lines = best.text.splitlines()
        first = next(k for k, line in enumerate(lines) if re.match(r"^\[(system|user|assistant)\]\s*$", line))
        body = "\n".join(lines[first:])  # the old provenance comments go; the new header replaces them
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as f:  # "x": a version is never overwritten
            f.write("\n".join(header) + "\n" + body.strip("\n") + "\n")
        result.written = path
    return result
