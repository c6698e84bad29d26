"""Inference baselines on our generation engine: one pipeline module, each system a `PipelineConfig`.

    records = run_pipeline(SYSTEMS["rag"], model, params, tokenizer, retriever, prompts, system="rag",
                           batch_size=8)

Every system returns one predictions record per question, in order, in the format of
`searchjax.eval.benchmarks` (id, data_source, question, golds, answer, em, f1, trajectory, searches, doc_ids,
flags, response_tokens, generated_tokens) plus "system", so `benchmarks.summary_rows`, the judge
(`searchjax.eval.grading`) and launch/report.py read them all alike. Decoding is greedy (searchjax.generation,
seeded per batch for exact ties only). Prompt wording: searchjax/eval/pipeline_prompts.py (FlashRAG and
Search-o1, quoted with their sources). Kinds:

* agent      the policy as a Search-R1 search agent (searchjax.agent.rollout with the run's RolloutConfig);
             `search=False` is the closed-book prompt: the same Search-R1 prompt, one turn, no tool.
* direct     FlashRAG's zero-shot prompt (system: answer from your own knowledge, only the answer; user:
             "Question: q"); answer = the first non-empty line of the output (FlashRAG's basic_pred_parse).
* cot        Search-o1's direct-reasoning prompt (think step by step, \\boxed{answer}); answer = the last
             \\boxed{...} (`boxed_answer`: Search-o1's extract_answer, qa mode); none -> no answer.
* rag        FlashRAG's Standard RAG: one retrieval of `topk` passages for the question, the documents in the
             system prompt, answer as in direct.
* ircot      FlashRAG's IRCoT (Trivedi et al. 2023): retrieve for the question, then up to `max_iterations`
             times generate one thought (plain text, no chat template, as FlashRAG does for local models;
             the thought ends at ". " or a newline) after "Thought:"; a thought containing "So the answer
             is:" ends the row, otherwise the thought is the next query and its passages join the
             document set (a passage seen twice keeps its best score; documents best first). The answer is
             the text after the first "So the answer is:" of the joined thoughts (one trailing "." dropped),
             else, as in FlashRAG, the joined thoughts themselves. Ours, unlike FlashRAG: thoughts keep their
             full stop (vLLM drops the stop string), a decimal point ("3.5") or a newline-free sentence does
             not end a thought, documents are listed best first (FlashRAG sorts by ascending score), and no
             retrieval follows the last iteration (its passages could not be read).
* search_o1  Search-o1 (Li et al. 2025): the search instruction (single-hop for NQ / TriviaQA / PopQA, else
             multi-hop) and the CoT task in one user turn, decoded on one KV cache across turns. A turn ending
             in <|end_search_query|> with a query new to the row (and fewer than `max_searches` done)
             retrieves `topk` passages; the Reason-in-Documents step (a separate greedy call,
             `reason_max_new_tokens`) reads the previous reasoning steps, the query and the pages, and its
             text after "**Final Information**" ("No helpful information found." when absent) is appended
             in <|begin_search_result|> ... <|end_search_result|> (cut to `max_info_tokens` tokens), and
             decoding resumes. A repeated query or one past the limit gets Search-o1's message instead. A row
             ends at EOS, at a turn without a query, or after `max_turns` turns (forced; a query in the last
             turn is not executed). Answer: the last \\boxed{...}.

Retrieval: each kind makes one `retriever.search(queries, topk)` call per step for all the batch's queries (hits
with .id, .title, .text, .score); a failing call gives those rows no passages and counts a retrieval error,
it never stops the run. Passages are cut to `max_doc_chars` characters in prompts (0 = whole).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import Optional, Sequence

from searchjax import generation
from searchjax.agent.rollout import Prompt, RolloutConfig
from searchjax.eval import pipeline_prompts as P
from searchjax.eval.metrics import count_duplicate_queries, count_searches, is_valid_answer
from searchjax.rewards.qa import exact_match, f1_score

log = logging.getLogger(__name__)

KINDS = ("agent", "direct", "cot", "rag", "ircot", "search_o1")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """One system (module docstring for what each field means to each kind)."""

    kind: str
    search: bool = True               # agent: False = the closed-book prompt (no tool)
    max_new_tokens: int = 32          # per generation call (a thought, a turn); agent: RolloutConfig's budget
    topk: int = 5                     # passages per retrieval (FlashRAG's setting)
    max_doc_chars: int = 0            # passage text cut to this many characters in prompts (0 = whole)
    max_iterations: int = 2           # ircot: thoughts per question (FlashRAG's max_iter)
    max_searches: int = 5             # search_o1: searches per question (its MAX_SEARCH_LIMIT)
    max_turns: int = 6                # search_o1: decode turns per question
    reason_max_new_tokens: int = 256  # search_o1: the Reason-in-Documents call's budget
    max_info_tokens: int = 256        # search_o1: tokens of one appended search-result block

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"PipelineConfig.kind {self.kind!r} is not one of {KINDS}")
        for name in ("max_new_tokens", "topk", "max_iterations", "max_searches", "max_turns",
                     "reason_max_new_tokens", "max_info_tokens"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"PipelineConfig.{name}={getattr(self, name)!r} must be >= 1")
        if self.max_doc_chars < 0:
            raise ValueError(f"PipelineConfig.max_doc_chars={self.max_doc_chars} must be >= 0")


# The systems launch/evaluate.py knows by name (configs/evaluate.py overrides their fields).
SYSTEMS = {
    "policy": PipelineConfig("agent"),
    "closed_book": PipelineConfig("agent", search=False),
    "direct": PipelineConfig("direct", max_new_tokens=32),
    "cot": PipelineConfig("cot", max_new_tokens=256),
    "rag": PipelineConfig("rag", max_new_tokens=32),
    "ircot": PipelineConfig("ircot", max_new_tokens=64),
    "search_o1": PipelineConfig("search_o1", max_new_tokens=256),
}


def needs_retriever(cfg: PipelineConfig) -> bool:
    return cfg.kind in ("rag", "ircot", "search_o1") or (cfg.kind == "agent" and cfg.search)


# --------------------------------------------------------------------------------------------- answers

def _braced(text: str, command: str) -> list[str]:
    """Contents of every `command{...}` in text, braces balanced (an unclosed one is skipped)."""
    out, start = [], text.find(command + "{")
    while start >= 0:
        depth, i = 0, start + len(command)
        for i in range(start + len(command), len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                out.append(text[start + len(command) + 1:i])
                break
        start = text.find(command + "{", i if depth == 0 else start + 1)
    return out


def boxed_answer(text: str) -> Optional[str]:
    """The last \\boxed{...} of the text, its last \\text{...} if any, "()" and spaces stripped (Search-o1's qa
    extraction, with braces matched instead of its greedy regex, which reads two boxes on a line as one)."""
    boxes = _braced(text, "\\boxed")
    if not boxes:
        return None
    inner = _braced(boxes[-1], "\\text")
    answer = (inner[-1] if inner else boxes[-1]).strip("()").strip()
    return answer or None


def first_line(text: str) -> Optional[str]:
    for line in text.split("\n"):
        if line.strip():
            return line.strip()
    return None


def ircot_answer(thoughts: Sequence[str]) -> Optional[str]:
    text = " ".join(thoughts).strip()
    if P.IRCOT_ANSWER_MARKER in text:
        text = text.split(P.IRCOT_ANSWER_MARKER)[1].strip()
        text = text[:-1].strip() if text.endswith(".") else text
    return text or None


def cut_thought(text: str) -> str:
    """A thought ends at the first ". " (the full stop kept) or newline."""
    ends = [k + 1 for k in (text.find(". "),) if k >= 0] + [k for k in (text.find("\n"),) if k >= 0]
    return (text[:min(ends)] if ends else text).strip()


def reasoning_steps(output: str) -> str:
    """Search-o1's "Previous Reasoning Steps": each line a numbered step; beyond 5 steps only the first, the
    last 4 and those holding a search query or result are kept, gaps shown as "..."."""
    lines = output.replace("\n\n", "\n").split("\n")
    steps = "".join(f"Step {i + 1}: {line}\n\n" for i, line in enumerate(lines)).split("\n\n")
    if len(steps) <= 5:
        return "\n\n".join(steps).strip("\n")
    kept = ""
    for i, step in enumerate(steps):
        if i == 0 or i >= len(steps) - 4 or P.BEGIN_SEARCH_QUERY in step or P.BEGIN_SEARCH_RESULT in step:
            kept += step + "\n\n"
        elif not kept.endswith("\n\n...\n\n"):
            kept += "...\n\n"
    return kept.strip("\n")


def final_information(reply: str) -> str:
    """The Reason-in-Documents reply's text after "**Final Information**", on one line; else the no-info text."""
    if P.FINAL_INFORMATION not in reply:
        return P.NO_INFORMATION
    return reply.split(P.FINAL_INFORMATION)[-1].replace("\n", "").strip("`").strip()


def last_query(text: str) -> Optional[str]:
    """The last <|begin_search_query|> ... <|end_search_query|> content, stripped (None if none / empty)."""
    found = re.findall(re.escape(P.BEGIN_SEARCH_QUERY) + r"(.*?)" + re.escape(P.END_SEARCH_QUERY), text, re.DOTALL)
    return found[-1].strip() or None if found else None


# ------------------------------------------------------------------------------------------- engine

@dataclasses.dataclass
class Generator:
    """The policy and what every pipeline needs to call it (logits_fn: a scripted stand-in, for tests)."""

    model: object
    params: object
    tokenizer: object
    logits_fn: object = None
    seed: int = 0

    def chat_ids(self, messages: Sequence[dict]) -> list[int]:
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True))

    def generate(self, prompt_ids: Sequence[list[int]], max_new_tokens: int, stop: Sequence[str] = ()):
        return generation.generate(self.model, self.params, list(prompt_ids), max_new_tokens=max_new_tokens,
                                   temperature=0.0, stop=tuple(stop), tokenizer=self.tokenizer, seed=self.seed,
                                   logits_fn=self.logits_fn)

    def text(self, ids, *, special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=not special)


def _search(retriever, queries: list[str], topk: int) -> Optional[list[list]]:
    """One hit list per query, or None when the call fails (logged; the rows count a retrieval error)."""
    try:
        results = [list(hits) for hits in retriever.search(list(queries), topk)]
        if len(results) != len(queries):
            raise ValueError(f"returned {len(results)} hit lists for {len(queries)} queries")
        return results
    except Exception as error:  # noqa: BLE001  (a retriever failure never stops an evaluation)
        log.warning("retrieval failed for %d queries: %s: %s", len(queries), type(error).__name__, error)
        return None


def _doc_text(hit, max_chars: int) -> str:
    return hit.text[:max_chars] if max_chars else hit.text


def record(prompt: Prompt, system: str, *, answer: Optional[str], text: str, queries=(), doc_ids=(),
           generated_tokens: int, response_tokens: int, num_turns: int, end_reason: str, forced: bool = False,
           retrieval_errors: int = 0, truncated: int = 0) -> dict:
    """A predictions-file record (searchjax.eval.benchmarks' format) for a baseline's answer."""
    golds = list(prompt.golden_answers)
    return {"system": system, "id": prompt.uid, "data_source": prompt.data_source, "question": prompt.question,
            "golds": golds, "answer": answer, "em": exact_match(answer, golds), "f1": f1_score(answer, golds),
            "trajectory": text, "searches": list(queries), "doc_ids": [list(d) for d in doc_ids],
            "flags": {"valid_answer": is_valid_answer(answer), "forced_termination": forced,
                      "end_reason": end_reason, "num_searches": count_searches(queries),
                      "duplicate_queries": count_duplicate_queries(queries), "num_turns": num_turns,
                      "invalid_actions": 0, "retrieval_errors": retrieval_errors,
                      "truncated_observations": truncated},
            "response_tokens": response_tokens, "generated_tokens": generated_tokens}


def _end(answer, stop_reason: str) -> str:
    return "answer" if answer is not None else ("eos" if stop_reason == "eos" else "turns")


# ------------------------------------------------------------------------------------------- kinds

def _single_call(cfg, engine, retriever, batch, system):
    """direct, cot and rag: one generation per question (rag after one retrieval for the batch)."""
    hits, errors = [[] for _ in batch], 0
    if cfg.kind == "rag":
        found = _search(retriever, [p.question for p in batch], cfg.topk)
        hits, errors = (found, 0) if found is not None else ([[] for _ in batch], 1)
    prompts = []
    for p, h in zip(batch, hits):
        if cfg.kind == "direct":
            messages = [{"role": "system", "content": P.DIRECT_SYSTEM},
                        {"role": "user", "content": P.QUESTION_USER.format(question=p.question)}]
        elif cfg.kind == "rag":
            reference = "".join(P.RAG_DOC.format(number=i + 1, title=x.title, text=_doc_text(x, cfg.max_doc_chars))
                                for i, x in enumerate(h))
            messages = [{"role": "system", "content": P.RAG_SYSTEM.format(reference=reference)},
                        {"role": "user", "content": P.QUESTION_USER.format(question=p.question)}]
        else:
            messages = [{"role": "user", "content": P.COT_USER.format(question=p.question)}]
        prompts.append(engine.chat_ids(messages))
    out = []
    for p, h, result in zip(batch, hits, engine.generate(prompts, cfg.max_new_tokens)):
        text = engine.text(result.token_ids)
        answer = boxed_answer(text) if cfg.kind == "cot" else first_line(text)
        searched = cfg.kind == "rag"
        out.append(record(p, system, answer=answer, text=engine.text(result.token_ids, special=True),
                          queries=[p.question] if searched else [], doc_ids=[[x.id for x in h]] if searched else [],
                          generated_tokens=len(result.token_ids), response_tokens=len(result.token_ids),
                          num_turns=1, end_reason=_end(answer, result.stop_reason), retrieval_errors=errors))
    return out


def _ircot(cfg, engine, retriever, batch, system):
    head = f"{P.IRCOT_INSTRUCTION}\n\n{P.IRCOT_EXAMPLE}\n\n"
    found = _search(retriever, [p.question for p in batch], cfg.topk)
    rows = [{"docs": {}, "thoughts": [], "queries": [p.question], "doc_ids": [], "errors": int(found is None),
             "generated": 0, "turns": 0, "stop": "eos", "done": False} for p in batch]

    def merge(row, hits):
        row["doc_ids"].append([h.id for h in hits])
        for h in hits:  # a passage seen again keeps its best score
            if h.id not in row["docs"] or h.score > row["docs"][h.id].score:
                row["docs"][h.id] = h

    for row, hits in zip(rows, found or [[] for _ in batch]):
        merge(row, hits)
    for iteration in range(cfg.max_iterations):
        active = [b for b, row in enumerate(rows) if not row["done"]]
        if not active:
            break
        prompts = []
        for b in active:
            docs = sorted(rows[b]["docs"].values(), key=lambda h: -h.score)
            reference = "".join(P.IRCOT_DOC.format(title=h.title, text=_doc_text(h, cfg.max_doc_chars)) for h in docs)
            text = head + P.IRCOT_USER.format(reference=reference, question=batch[b].question)
            if rows[b]["thoughts"]:
                text += " " + " ".join(rows[b]["thoughts"])
            prompts.append(engine.tokenizer.encode(text))
        results = engine.generate(prompts, cfg.max_new_tokens, stop=(". ", "\n"))
        queries = []
        for b, result in zip(active, results):
            row = rows[b]
            thought = cut_thought(engine.text(result.token_ids))
            row["thoughts"].append(thought)
            row["generated"] += len(result.token_ids)
            row["turns"] += 1
            row["stop"] = result.stop_reason
            if P.IRCOT_ANSWER_MARKER in thought or iteration == cfg.max_iterations - 1:
                row["done"] = True
            else:
                queries.append(b)
        if queries:
            found = _search(retriever, [rows[b]["thoughts"][-1] for b in queries], cfg.topk)
            for j, b in enumerate(queries):
                rows[b]["queries"].append(rows[b]["thoughts"][-1])
                if found is None:
                    rows[b]["errors"] += 1
                    rows[b]["doc_ids"].append([])
                else:
                    merge(rows[b], found[j])
    out = []
    for p, row in zip(batch, rows):
        answer = ircot_answer(row["thoughts"])
        marker = any(P.IRCOT_ANSWER_MARKER in t for t in row["thoughts"])
        out.append(record(p, system, answer=answer, text=" ".join(row["thoughts"]), queries=row["queries"],
                          doc_ids=row["doc_ids"], generated_tokens=row["generated"],
                          response_tokens=row["generated"], num_turns=row["turns"],
                          end_reason="answer" if marker else ("eos" if row["stop"] == "eos" else "turns"),
                          forced=not marker and row["turns"] == cfg.max_iterations, retrieval_errors=row["errors"]))
    return out


def _search_o1(cfg, engine, retriever, batch, system):
    prompt_ids = []
    for p in batch:
        head = P.SEARCH_O1_SINGLE_HOP if p.data_source in P.SEARCH_O1_SINGLE_HOP_SOURCES else P.SEARCH_O1_MULTI_HOP
        instruction = head.replace("{limit}", str(cfg.max_searches))
        prompt_ids.append(engine.chat_ids([{"role": "user", "content": instruction + P.COT_USER.format(
            question=p.question)}]))
    cache = (generation.prompt_bucket(prompt_ids) + cfg.max_turns * cfg.max_new_tokens
             + (cfg.max_turns - 1) * generation.append_bucket(cfg.max_info_tokens))
    session = generation.start(engine.model, engine.params, prompt_ids, max_cache_len=cache, tokenizer=engine.tokenizer,
                               seed=engine.seed, logits_fn=engine.logits_fn)
    rows = [{"ids": [], "generated": 0, "text": "", "queries": [], "doc_ids": [], "executed": set(), "turns": 0,
             "errors": 0, "truncated": 0, "end": None} for _ in batch]
    for turn in range(cfg.max_turns):
        active = [b for b, row in enumerate(rows) if row["end"] is None]
        if not active:
            break
        session, outs = generation.decode(session, cfg.max_new_tokens, temperature=0.0, stop=(P.END_SEARCH_QUERY,))
        appends: dict[int, str] = {}
        searching = []
        for b in active:
            row, out = rows[b], outs[b]
            row["ids"] += out.token_ids
            row["generated"] += len(out.token_ids)
            row["turns"] += 1
            turn_text = engine.text(out.token_ids)
            row["text"] += turn_text
            query = last_query(turn_text) if out.stop_reason == "stop" else None
            if query is None:
                row["end"] = "eos" if out.stop_reason == "eos" else "no_query"
            elif turn == cfg.max_turns - 1:
                row["end"] = "turns"  # the last turn's query is not executed
            elif len(row["executed"]) >= cfg.max_searches:
                appends[b] = P.SEARCH_LIMIT_MESSAGE
            elif query in row["executed"]:
                appends[b] = P.REPEATED_QUERY_MESSAGE
            else:
                row["executed"].add(query)
                searching.append((b, query))
        if searching:
            found = _search(retriever, [q for _, q in searching], cfg.topk)
            requests = []
            for j, (b, query) in enumerate(searching):
                hits = [] if found is None else found[j]
                rows[b]["queries"].append(query)
                rows[b]["doc_ids"].append([h.id for h in hits])
                rows[b]["errors"] += found is None
                pages = "".join(P.WEB_PAGE.format(number=i + 1, page=json.dumps(
                    {"title": h.title, "text": _doc_text(h, cfg.max_doc_chars)}, ensure_ascii=False, indent=2))
                    for i, h in enumerate(hits))
                requests.append(engine.chat_ids([{"role": "user", "content": P.REASON_IN_DOCUMENTS.format(
                    prev_reasoning=reasoning_steps(rows[b]["text"]), search_query=query, document=pages)}]))
            for (b, _), reply in zip(searching, engine.generate(requests, cfg.reason_max_new_tokens)):
                appends[b] = P.SEARCH_RESULT.format(info=final_information(engine.text(reply.token_ids)))
        blocks = [[] for _ in batch]
        for b, text in appends.items():
            ids = engine.tokenizer.encode(text)
            if len(ids) > cfg.max_info_tokens:
                ids, rows[b]["truncated"] = ids[:cfg.max_info_tokens], rows[b]["truncated"] + 1
            blocks[b] = ids
            rows[b]["ids"] += ids
            rows[b]["text"] += engine.text(ids)
        if appends and turn < cfg.max_turns - 1:
            session = generation.append(session, blocks)
    out = []
    for p, row in zip(batch, rows):
        answer = boxed_answer(row["text"])
        end = row["end"] or "turns"
        out.append(record(p, system, answer=answer, text=engine.text(row["ids"], special=True), queries=row["queries"],
                          doc_ids=row["doc_ids"], generated_tokens=row["generated"], response_tokens=len(row["ids"]),
                          num_turns=row["turns"], end_reason="answer" if answer is not None else
                          ("eos" if end == "eos" else "turns"), forced=end == "turns",
                          retrieval_errors=row["errors"], truncated=row["truncated"]))
    return out


def _agent(cfg, engine, retriever, batch, system, rollout_cfg: RolloutConfig):
    from searchjax.agent.rollout import rollout
    from searchjax.eval.benchmarks import prediction_record
    rollout_cfg = dataclasses.replace(rollout_cfg, group_size=1, search=cfg.search)
    trajectories = rollout(engine.model, engine.params, engine.tokenizer, retriever, batch, rollout_cfg,
                           seed=engine.seed, logits_fn=engine.logits_fn)
    return [{"system": system, **prediction_record(t)} for t in trajectories]


_KIND_FNS = {"direct": _single_call, "cot": _single_call, "rag": _single_call, "ircot": _ircot,
             "search_o1": _search_o1}


def run_pipeline(cfg: PipelineConfig, model, params, tokenizer, retriever, prompts: Sequence[Prompt], *,
                 system: str, batch_size: int, seed: int = 0, first_batch: int = 0,
                 rollout_cfg: Optional[RolloutConfig] = None, logits_fn=None, progress: bool = False) -> list[dict]:
    """Predictions records of `system` (kind cfg.kind) on `prompts`, in order, `batch_size` questions per batch.
    Batch k (counted from `first_batch`, so a process's shard keeps its global numbering) decodes with seed
    `seed + k`. The agent kind needs `rollout_cfg` (its group size and sampling are set to 1 / greedy by the
    caller; `search` comes from cfg)."""
    if batch_size < 1:
        raise ValueError(f"run_pipeline: batch_size={batch_size} must be >= 1")
    if cfg.kind == "agent" and rollout_cfg is None:
        raise ValueError(f"run_pipeline: system {system!r} is the agent; it needs rollout_cfg")
    if needs_retriever(cfg) and retriever is None:
        raise ValueError(f"run_pipeline: system {system!r} ({cfg.kind}) retrieves, but no retriever was given")
    from tqdm import tqdm
    prompts = list(prompts)
    records: list[dict] = []
    with tqdm(total=len(prompts), desc=system, unit="question", disable=not progress) as bar:
        for k, start in enumerate(range(0, len(prompts), batch_size)):
            batch = prompts[start:start + batch_size]
            engine = Generator(model, params, tokenizer, logits_fn, seed + first_batch + k)
            if cfg.kind == "agent":
                records += _agent(cfg, engine, retriever, batch, system, rollout_cfg)
            else:
                records += _KIND_FNS[cfg.kind](cfg, engine, retriever, batch, system)
            bar.update(len(batch))
    return records
