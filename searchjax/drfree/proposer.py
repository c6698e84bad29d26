"""Dr.Free proposer: the prompt that turns a knowledge-graph chain into one question, its output parser,
and the grounding check.

The proposer sees a relational chain e0 -r1-> e1 ... -rh-> eh (h = 1..3 hops) with one passage per entity
and writes, without searching, one question whose answer is A = eh. The prompt (in our words, after the
paper's Table 17) asks it to name only e0, keep the bridge entities e1..e(h-1) hidden behind their
relations, write a single self-contained question within a hop-dependent word limit, give a short
canonical answer, and reply as <think>...</think><question>...</question><answer>...</answer>.

`parse_proposer_output` reads that reply; `format_score` (searchjax.rewards.information_gain, Dr.Free
eqs. 10-11) scores it; `is_grounded` is the separate grounding gate of eq. 12.

Chain records (`searchjax.drfree.chains.read_chain_pool`) become training prompts with `chain_prompt`: a
`searchjax.agent.rollout.Prompt` whose `question` is the proposer's user message, whose `hops` is the
chain's hop count (HRPO groups by it) and whose `metadata["chain"]` is the record itself, so the reward
sees the chain's passages and target next to the proposer's reply (`chain_of(trajectory)`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from retrieval.corpus import Passage
from searchjax.rewards.qa import normalize_answer

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
QUESTION_OPEN, QUESTION_CLOSE = "<question>", "</question>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# Upper bounds on the question's length in words, by hop count: a 3-hop question has to describe two
# hidden bridges and needs more room than a 1-hop one. Our numbers; longer chains use the 3-hop limit.
QUESTION_WORD_LIMITS = {1: 25, 2: 35, 3: 45}

_TASK = """\
You write quiz questions from chains of facts. Below is a chain that starts at "{start}" and, following \
{hops} relation{plural}, ends at "{target}", with a passage about each entity of the chain.

Chain:
{chain}

Passages:
{passages}

Write exactly one question whose answer is "{target}".
Rules:
- Mention "{start}" by name and no other entity of the chain.{bridge_rule}
- The question must stand on its own: never refer to "the chain", "the passage" or "the text".
- Use at most {limit} words.
- The answer is a short canonical name for "{target}" (a few words, not a sentence) and does not appear \
in the question.
- Do not search; rely only on the chain and the passages above.

Think first inside <think> and </think>, then write the question inside <question> and </question> and the \
answer inside <answer> and </answer>."""

_BRIDGE_RULE = (
    "\n- Keep {bridges} hidden: describe {them} only through {their} relations, so that answering the "
    "question requires following every step of the chain."
)


def question_word_limit(hops: int) -> int:
    """The word limit of a question about an h-hop chain."""
    if hops < 1:
        raise ValueError(f"hops must be >= 1, got {hops}")
    return QUESTION_WORD_LIMITS[min(hops, max(QUESTION_WORD_LIMITS))]


def build_proposer_prompt(entities: Sequence[str], relations: Sequence[str], passages: Sequence[str]) -> str:
    """The proposer's user message for the chain entities[0] -relations[0]-> entities[1] ... -> entities[h].

    entities: h + 1 names; relations: h relation labels; passages: h + 1 passage texts, passages[k] about
    entities[k] (passages[0] is the seed/source passage).
    """
    hops = len(relations)
    if hops < 1:
        raise ValueError("build_proposer_prompt: a chain needs at least one relation")
    if len(entities) != hops + 1:
        raise ValueError(f"build_proposer_prompt: {hops} relations need {hops + 1} entities, got {len(entities)}")
    if len(passages) != hops + 1:
        raise ValueError(f"build_proposer_prompt: {hops + 1} entities need {hops + 1} passages, got {len(passages)}")
    chain = "".join(
        [f"[0] {entities[0]}"] + [f" --{relations[k]}--> [{k + 1}] {entities[k + 1]}" for k in range(hops)])
    passage_lines = "\n".join(f"[{k}] {entities[k]}: {' '.join(str(p).split())}" for k, p in enumerate(passages))
    bridges = list(entities[1:-1])
    bridge_rule = ""
    if bridges:
        names = ", ".join(f'"{b}"' for b in bridges)
        bridge_rule = _BRIDGE_RULE.format(bridges=names, them="it" if len(bridges) == 1 else "them",
                                          their="its" if len(bridges) == 1 else "their")
    return _TASK.format(start=entities[0], target=entities[-1], hops=hops, plural="" if hops == 1 else "s",
                        chain=chain, passages=passage_lines, bridge_rule=bridge_rule,
                        limit=question_word_limit(hops))


def build_proposer_messages(entities: Sequence[str], relations: Sequence[str], passages: Sequence[str]) -> list[dict]:
    """Chat messages for the proposer: one user turn with `build_proposer_prompt`."""
    return [{"role": "user", "content": build_proposer_prompt(entities, relations, passages)}]


@dataclasses.dataclass(frozen=True)
class ProposerOutput:
    """The parsed proposer reply: block contents, stripped; None where the closed block is absent."""

    think: str | None
    question: str | None
    answer: str | None


def _first_block(text: str, open_tag: str, close_tag: str, start: int = 0) -> tuple[str, int] | None:
    """(stripped content, end index) of the first closed block at or after `start`; linear time."""
    i = text.find(open_tag, start)
    if i < 0:
        return None
    j = text.find(close_tag, i + len(open_tag))
    if j < 0:
        return None
    return text[i + len(open_tag):j].strip(), j + len(close_tag)


def parse_proposer_output(text: str) -> ProposerOutput:
    """Parse `<think>..</think><question>..</question><answer>..</answer>`; never raises on a str.

    The first closed block of each tag is taken. When a closed think block exists, question and answer are
    read only after it: drafts inside the reasoning do not count.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_proposer_output: expected str, got {type(text).__name__}")
    think = _first_block(text, THINK_OPEN, THINK_CLOSE)
    after = think[1] if think else 0
    question = _first_block(text, QUESTION_OPEN, QUESTION_CLOSE, after)
    answer = _first_block(text, ANSWER_OPEN, ANSWER_CLOSE, after)
    return ProposerOutput(think=think[0] if think else None,
                          question=question[0] if question else None,
                          answer=answer[0] if answer else None)


def mentions(text: str, phrase: str) -> bool:
    """Whether normalize_answer(phrase) occurs in normalize_answer(text) on token boundaries (non-empty phrase)."""
    p = normalize_answer(phrase)
    return bool(p) and f" {p} " in f" {normalize_answer(text)} "


def is_grounded(answer: str | None, passages: Sequence[str]) -> bool:
    """Grounding gate of Dr.Free eq. 12: is the proposed answer supported by the chain's own passages?

    `passages[k]` is the passage of chain entity e_k (passages[0] the seed/source passage), so the chain
    has h = len(passages) - 1 hops. Single hop: the answer occurs in the source or the evidence passage.
    Multi-hop: it occurs in a non-seed chain passage (occurring only in the seed passage is not enough: the
    question could then be answered from the seed alone). Occurrence = `mentions` (SQuAD-normalised,
    token boundaries, so "1990" is not found in "19901").
    """
    if len(passages) < 2:
        raise ValueError(f"is_grounded: a chain of h >= 1 hops has h + 1 >= 2 passages, got {len(passages)}")
    if answer is None or not normalize_answer(answer):
        return False
    candidates = passages if len(passages) == 2 else passages[1:]
    return any(mentions(p, answer) for p in candidates)


# ---------------------------------------------------------------------------------------------------
# Chain records -> proposer prompts
# ---------------------------------------------------------------------------------------------------
CHAIN_FIELDS = ("id", "hops", "entities", "relations", "answer", "passages")
CHAIN_METADATA_KEY = "chain"  # Prompt.metadata key holding the chain record


def check_chain_record(record: Any, where: str = "chain record") -> None:
    """Raise a ValueError naming `where` and the field if `record` is not a usable chain record.

    A record (chains.chain_record) has h = record["hops"] >= 1, h + 1 entities and passages (each a dict
    with "title" and "text"; passages[0] the seed/source passage), h relations (each with "label"), and
    the answer = the final entity's label.
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a dict, got {type(record).__name__}")
    missing = [k for k in CHAIN_FIELDS if k not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    hops = record["hops"]
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
        raise ValueError(f"{where}: field 'hops' must be an integer >= 1, got {hops!r}")
    for field, size in (("entities", hops + 1), ("relations", hops), ("passages", hops + 1)):
        value = record[field]
        if not isinstance(value, list) or len(value) != size:
            raise ValueError(f"{where}: field {field!r} must be a list of {size} items for a {hops}-hop chain, "
                             f"got {value!r:.200}")
    for k, entity in enumerate(record["entities"]):
        if not isinstance(entity, dict) or not str(entity.get("label", "")).strip():
            raise ValueError(f"{where}: entities[{k}] needs a non-empty 'label'")
    for k, relation in enumerate(record["relations"]):
        if not isinstance(relation, dict) or not str(relation.get("label", "")).strip():
            raise ValueError(f"{where}: relations[{k}] needs a non-empty 'label'")
    for k, passage in enumerate(record["passages"]):
        if not isinstance(passage, dict) or not isinstance(passage.get("text"), str) or "title" not in passage:
            raise ValueError(f"{where}: passages[{k}] needs 'title' and a str 'text'")
    if not isinstance(record["answer"], str) or not normalize_answer(record["answer"]):
        raise ValueError(f"{where}: field 'answer' must be a non-empty string, got {record['answer']!r}")


def chain_passages(record: dict) -> list[Passage]:
    """The chain's passages as retrieval Passages, passages[k] about e_k (passages[0] = the source passage)."""
    return [Passage(id=str(p.get("id", f"{record['id']}/{k}")), title=str(p["title"]), text=p["text"])
            for k, p in enumerate(record["passages"])]


def chain_user_message(record: dict) -> str:
    """`build_proposer_prompt` for a chain record: entity labels, relation labels, passage texts."""
    return build_proposer_prompt([e["label"] for e in record["entities"]], [r["label"] for r in record["relations"]],
                                 [p["text"] for p in record["passages"]])


def chain_prompt(record: dict, data_source: str = "chains"):
    """A rollout Prompt for the proposer: uid f"{data_source}/{record['id']}", question = the proposer's user
    message, golden_answers = (the chain's answer,), hops = h, metadata = {"chain": record}."""
    from searchjax.agent.rollout import Prompt  # here, not at the top: rollout pulls in jax and generation
    check_chain_record(record, f"chain record {record.get('id', '?') if isinstance(record, dict) else '?'}")
    return Prompt(uid=f"{data_source}/{record['id']}", question=chain_user_message(record),
                  golden_answers=(record["answer"],), data_source=data_source, hops=int(record["hops"]),
                  metadata={CHAIN_METADATA_KEY: record})


def proposer_prompt_text(prompt, tokenizer) -> str:
    """The proposer's full prompt: its user message through the tokenizer's chat template (generation prompt on)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt.question}], add_generation_prompt=True)


def chain_prompts(records: Sequence[dict], *, tokenizer=None, max_prompt_tokens: int | None = None,
                  data_source: str = "chains") -> tuple[list, int]:
    """(prompts, number dropped): `chain_prompt` of every record, minus those whose full prompt
    (`proposer_prompt_text`, tokenised) is longer than max_prompt_tokens (the paper's prompt length, 2560;
    like verl's filter_overlong_prompts). max_prompt_tokens needs the tokenizer."""
    if max_prompt_tokens is not None and tokenizer is None:
        raise ValueError("chain_prompts: max_prompt_tokens needs a tokenizer")
    prompts, dropped = [], 0
    for record in records:
        prompt = chain_prompt(record, data_source)
        too_long = max_prompt_tokens is not None and \
            len(tokenizer.encode(proposer_prompt_text(prompt, tokenizer))) > max_prompt_tokens
        if too_long:
            dropped += 1
            continue
        prompts.append(prompt)
    return prompts, dropped


def chain_of(trajectory) -> dict:
    """The chain record a proposer trajectory was prompted with (its prompt's metadata["chain"])."""
    record = getattr(trajectory.prompt, "metadata", {}).get(CHAIN_METADATA_KEY)
    if record is None:
        raise ValueError(f"trajectory of prompt {trajectory.prompt.uid!r} has no metadata[{CHAIN_METADATA_KEY!r}]: "
                         "proposer rewards need prompts built by searchjax.drfree.proposer.chain_prompt")
    return record
