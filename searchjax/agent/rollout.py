"""The search agent's rollout: a bounded host loop over prompts x G samples, one KV cache across turns.

    trajectories = rollout(model, params, tokenizer, retriever, prompts, RolloutConfig(group_size=5), seed=0)

The loop (Search-R1, Jin et al. 2025, `search_r1/llm_agent/generation.py::run_llm_loop`; docs/architecture.md, "The host loop"):

    session = generation.start(prompt of each row)                  # rows = prompts x group_size, prompt-major
    for turn in range(max_turns + 1):                               # max_turns searching turns + 1 final turn
        session, outs = generation.decode(session, max_new_tokens_per_turn, stop=("</search>", "</answer>"))
        parse each active row's turn text (protocol.parse_action: the first closed block wins)
        answer -> the row is done;  EOS -> done;  final turn -> done (a search there is not executed)
        search -> its query joins this turn's batch;  anything else -> the invalid-action observation
        hits = retriever.search(all of this turn's queries, topk)   # ONE call per turn
        session = generation.append(session, observation tokens)    # loss mask 0; decoding resumes from the cache

Decisions (each one is what the code does; tests/rollout checks them):

* Tokens are never re-tokenised. A row's response is exactly the ids the model was conditioned on: every
  generated token as sampled (stop text, EOS and any bytes after the stop inside the same token kept) and
  every observation as the ids appended to the cache. `response_text` is `tokenizer.decode(response_ids)`.
  `loss_mask` is 1 on generated tokens and 0 on observation tokens; `sampler_logprobs` is log softmax(logits /
  T) of each generated token (searchjax.sampling) and 0.0 on observation tokens.
* Turns. A turn ends at `</search>`, `</answer>`, an EOS id or `max_new_tokens_per_turn` tokens. With
  `search=True` there are at most `max_turns` searching turns (a turn with an invalid action uses one too,
  as in Search-R1), then one final turn for rows still running. Nothing is added to the prompt to announce
  the final turn (Search-R1 adds nothing either); a `<search>` written in it is not executed and not
  counted, and the trajectory ends without an answer. With `search=False` there is one turn that stops only
  at `</answer>` or EOS (no tool: Dr.Free's proposer), and the answer is its first closed `<answer>` block
  whatever precedes it.
* A trajectory ends at an answer action, at EOS (an instruct model's end-of-turn token means it has
  finished; text appended after it would be trained on as if the sequence continued), or after its last
  turn. `answer` is the content of the answer action that ended it (the first closed `<answer>` block of
  its last turn, stripped; = qa.extract_answer of that turn's text), else None.
* `forced_termination` (docs/architecture.md, "Metric definitions"): the trajectory used every searching turn without answering, i.e. it was
  still running when the final turn began (False with `search=False`). `end_reason` says how it ended:
  "answer", "eos", or "turns" (its last turn ended without an answer).
* Observations: a search's hits become `protocol.search_observation(hits)`; an invalid action gets
  `protocol.INVALID_ACTION_OBSERVATION`. An observation longer than `max_obs_tokens` tokens (wrapper
  included, as Search-R1's max_obs_length) keeps its `\\n\\n<information>` head and
  `</information>\\n\\n` tail, cut inside the passages text at a token boundary that ends a whole UTF-8
  character, with `TRUNCATION_MARKER` before the tail so the model can see that text is missing.
* Searches: every searching row's query of a turn goes to the retriever in one `retriever.search(queries,
  topk)` call, in row order (duplicates across rows included). `queries`, `doc_ids` and `retrieved` list
  the executed searches in order; `num_searches` / `duplicate_queries` follow searchjax.eval.metrics.
* A failing retriever never stops the loop: if the call raises (any Exception) or returns something that is
  not one list of hits per query, every search of that turn gets `RETRIEVAL_ERROR_OBSERVATION` (an
  information block saying the search failed), no hits, and +1 on the row's `retrieval_errors`; the search
  still counts as a search (the policy issued it). A warning with the error is logged. Retrying is the
  client's business (retrieval.client).
* Group ids must be unique within a batch (`Prompt.uid`, e.g. f"{data_source}/{question_id}": Search-R1
  reused per-source indices, so groups of different datasets collided); duplicates raise.
* Capacity: the cache holds the padded prompt, every turn's full token budget and every append block
  (`generation.append_bucket(max_obs_tokens)`: the next power of two >= 16); `required_cache_len` computes it
  and `rollout` raises before decoding anything when `max_cache_len` is smaller. `session_rows` > 0 rolls the
  rows out in consecutive sessions of whole groups (`sessions`), each with its own cache, so that one
  session's cache must fit, not the step's (the papers' 2,560-4,096 rows x 6,144 slots do not fit a pod slice
  at once: docs/compile_check.md); a row keeps its sampling key (`first_row`), so the trajectories are those
  of one session.
* Failures as metrics: every trajectory counts its `retrieval_errors`, `invalid_actions` and
  `truncated_observations`; `failure_metrics(trajectories)` sums them into a step's metrics (with the rates
  the trainer checks against `config.max_failure_rate`) and `trajectory_counters(t)` is what a trajectory dump
  records of them.
* Multi-host: every process rolls out its own prompts with the step's seed; with more than one process the
  seed is first folded with the process index (`process_seed`), so two processes never draw the same
  sampling noise for their row r. When the policy's parameters are sharded over every process's devices,
  the processes' rows decode as one global batch (searchjax.generation, "Several processes"): a process whose
  rows have all finished keeps joining each turn's decode and append until no process has a running row.

Host cost at the papers' batches (2,560 / 4,096 rows, docs/scale_rehearsal.md): the per-row Python work is
O(1) per turn; the tokenizer is called once per turn for all rows (`encode_many` / `decode_many`: the Rust
tokenizer's batch calls, which run outside the GIL on all cores), identical observation texts of a turn
(e.g. the G samples of a question issuing the same query) are encoded once, and the retriever gets one call
per turn. `timings` (a dict) accumulates the seconds spent per phase: "tokenize", "generate" (the jitted
prefill / decode / append and their host-side packing), "parse" and "retrieval" (wall time, and CPU time
under "<phase>_cpu": see `timed`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Optional, Sequence

import numpy as np

from searchjax import distributed, generation, sharding
from searchjax.agent import protocol
from searchjax.agent.observations import TRUNCATION_MARKER, ObservationCodec, decode_many, encode_many  # noqa: F401
from searchjax.eval.metrics import count_duplicate_queries, count_searches, is_valid_answer
from searchjax.rewards.qa import ANSWER_CLOSE, extract_answer

log = logging.getLogger(__name__)

# The observation every search of a turn gets when the retriever call fails.
RETRIEVAL_ERROR_OBSERVATION = protocol.information_block("The search engine failed; no documents were retrieved.")

END_ANSWER, END_EOS, END_TURNS = "answer", "eos", "turns"


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One question; flows prompts -> rollout -> reward -> advantages. `uid` is the GRPO group id."""

    uid: str  # globally unique group id, e.g. f"{data_source}/{question_id}"
    question: str
    golden_answers: tuple[str, ...]
    data_source: str = "default"
    hops: int = 0  # Dr.Free hop label (HRPO groups by it); 0 = unknown
    metadata: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Rollout knobs (defaults: Search-R1's train_grpo.sh). configs/*.py `config.rollout` maps field for field."""

    group_size: int = 5  # samples per prompt (GRPO group size G)
    max_turns: int = 4  # searching turns; rows still running then get one final turn without search
    max_new_tokens_per_turn: int = 500  # generated-token budget of each turn
    max_obs_tokens: int = 500  # tokens of one observation, wrapper included (longer ones are truncated)
    topk: int = 3  # passages per search
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling (1 = off)
    top_k: int = 0  # top-k sampling (0 = off)
    max_cache_len: int = 6144  # KV-cache slots per row: prompt + every turn + every observation
    search: bool = True  # False: a single turn, no tool
    # Rows per generation session, summed over processes (0 = every row of the call in one session): a step's
    # rows are rolled out in consecutive sessions of at most this many rows (whole groups, at least one), so
    # one session's KV cache, not the step's, must fit (docs/compile_check.md). Row r samples as in one session.
    session_rows: int = 0


@dataclasses.dataclass
class Trajectory:
    """One sample: the response is everything after the prompt (generated and observation tokens, in order)."""

    prompt: Prompt
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]  # len(response_ids); 1 exactly on policy-generated tokens
    sampler_logprobs: list[float]  # len(response_ids); 0.0 on observation tokens
    response_text: str  # tokenizer.decode(response_ids)
    queries: list[str]  # executed searches, in order
    doc_ids: list[list[str]]  # per search: retrieved passage ids, best first
    retrieved: list[list]  # per search: the retriever's hits (.id, .title, .text, .contents, .score)
    answer: Optional[str]
    num_searches: int
    duplicate_queries: int
    forced_termination: bool
    valid_answer: bool
    end_reason: str = END_TURNS  # "answer" | "eos" | "turns"
    num_turns: int = 0  # decode turns the trajectory took part in
    invalid_actions: int = 0  # turns that got the invalid-action observation
    retrieval_errors: int = 0  # searches whose retriever call failed
    truncated_observations: int = 0  # observations cut to max_obs_tokens

    @property
    def forced(self) -> bool:
        """`forced_termination`, under the name searchjax.eval.metrics reads."""
        return self.forced_termination


# ------------------------------------------------------------------------------------------ checks / sizes

def required_cache_len(prompt_ids: Sequence[Sequence[int]], cfg: RolloutConfig) -> int:
    """KV-cache slots a rollout of these prompts may use: padded prompt + every turn + every append block."""
    turns = cfg.max_turns if cfg.search else 0
    return (generation.prompt_bucket(prompt_ids) + (turns + 1) * cfg.max_new_tokens_per_turn
            + turns * generation.append_bucket(cfg.max_obs_tokens))


def check_rollout_config(cfg: RolloutConfig) -> None:
    if not isinstance(cfg, RolloutConfig):
        raise TypeError(f"rollout: cfg must be a RolloutConfig, got {type(cfg).__name__}")
    for name in ("group_size", "max_new_tokens_per_turn", "max_obs_tokens", "topk", "max_cache_len"):
        if int(getattr(cfg, name)) < 1:
            raise ValueError(f"RolloutConfig.{name}={getattr(cfg, name)!r} must be >= 1")
    if cfg.max_turns < 0 or cfg.session_rows < 0:
        raise ValueError(f"RolloutConfig: max_turns={cfg.max_turns!r} and session_rows={cfg.session_rows!r} must be "
                         ">= 0")
    if cfg.temperature < 0 or not 0 < cfg.top_p <= 1 or cfg.top_k < 0:
        raise ValueError(f"RolloutConfig: temperature={cfg.temperature} must be >= 0, top_p={cfg.top_p} in (0, 1], "
                         f"top_k={cfg.top_k} >= 0")


def check_prompts(prompts: Sequence[Prompt]) -> None:
    if not prompts:
        raise ValueError("rollout: prompts is empty")
    seen: dict[str, int] = {}
    for i, p in enumerate(prompts):
        if not isinstance(p, Prompt):
            raise TypeError(f"rollout: prompts[{i}] is {type(p).__name__}, expected searchjax.agent.rollout.Prompt")
        if p.uid in seen:
            raise ValueError(f"rollout: prompts[{seen[p.uid]}] and prompts[{i}] share uid {p.uid!r}; group ids must "
                             "be unique (use f'{data_source}/{question_id}')")
        seen[p.uid] = i


# ------------------------------------------------------------------------------------- host-side helpers

def process_seed(seed: int) -> int:
    """The seed this process samples with: `seed` itself on one process, else a draw from fold_in(key(seed),
    process index). Rows are keyed by their index in the process's own batch, so without this row r of every
    process would get the same sampling noise."""
    import jax
    if jax.process_count() == 1:
        return int(seed)
    key = jax.random.fold_in(jax.random.key(int(seed)), jax.process_index())
    return int(jax.random.randint(key, (), 0, 2**31 - 1))


@contextlib.contextmanager
def timed(timings: Optional[dict], phase: str):
    """Add the block's wall time to timings[phase] and the CPU time of this process (every thread) to
    timings[phase + "_cpu"]; a no-op when timings is None. On a shared host the CPU figure is the one that
    does not depend on what else runs."""
    if timings is None:
        yield
        return
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - wall
        timings[phase + "_cpu"] = timings.get(phase + "_cpu", 0.0) + time.process_time() - cpu


def trajectory_counters(t) -> dict:
    """What a trajectory dump records of how the trajectory went (searchjax.experiment.loop.dump_trajectories)."""
    return {"end_reason": t.end_reason, "num_turns": t.num_turns, "invalid_actions": t.invalid_actions,
            "retrieval_errors": t.retrieval_errors, "truncated_observations": t.truncated_observations}


def failure_metrics(trajectories: Sequence) -> dict[str, float]:
    """A step's failure counters, summed over its trajectories, and their rates.

    rollout/searches_sent: searches handed to the retriever (every executed query, duplicates included);
    rollout/retrieval_errors: those whose retriever call failed; rollout/retrieval_error_rate = errors / sent
    (0 without searches). rollout/invalid_actions over rollout/turns (decode turns) and
    rollout/truncated_observations over rollout/observations (observations appended: searches + invalid
    actions) likewise. The sums let a multi-process run add its processes' counts before taking a rate.
    """
    sums = {"searches_sent": float(sum(len(t.queries) for t in trajectories)),
            "retrieval_errors": float(sum(t.retrieval_errors for t in trajectories)),
            "turns": float(sum(t.num_turns for t in trajectories)),
            "invalid_actions": float(sum(t.invalid_actions for t in trajectories)),
            "truncated_observations": float(sum(t.truncated_observations for t in trajectories))}
    sums["observations"] = sums["searches_sent"] + sums["invalid_actions"]
    out = {f"rollout/{k}": v for k, v in sums.items()}
    for rate, (num, den) in {"retrieval_error_rate": ("retrieval_errors", "searches_sent"),
                             "invalid_action_rate": ("invalid_actions", "turns"),
                             "truncated_observation_rate": ("truncated_observations", "observations")}.items():
        out[f"rollout/{rate}"] = sums[num] / sums[den] if sums[den] else 0.0
    return out


def search_turn(retriever, queries: list[str], topk: int) -> tuple[Optional[list], Optional[str]]:
    """(one hit list per query, None) or (None, error description); never raises an Exception."""
    try:
        results = retriever.search(list(queries), topk)
        results = list(results)
        if len(results) != len(queries):
            raise ValueError(f"returned {len(results)} hit lists for {len(queries)} queries")
        results = [list(hits) for hits in results]
        for hits in results:
            for hit in hits:
                if not isinstance(hit.contents, str) or not hasattr(hit, "id"):
                    raise TypeError(f"hit {hit!r} lacks .id or a str .contents")
        return results, None
    except Exception as error:  # noqa: BLE001  (documented: a retriever failure never crashes the loop)
        return None, f"{type(error).__name__}: {error}"


# ------------------------------------------------------------------------------------------------ the loop

@dataclasses.dataclass
class RowState:
    """Host-side accumulator of one trajectory."""

    response_ids: list = dataclasses.field(default_factory=list)
    loss_mask: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    queries: list = dataclasses.field(default_factory=list)
    retrieved: list = dataclasses.field(default_factory=list)
    answer: Optional[str] = None
    end_reason: Optional[str] = None  # None while running
    forced: bool = False
    num_turns: int = 0
    invalid_actions: int = 0
    retrieval_errors: int = 0
    truncated_observations: int = 0

    def add(self, ids, mask: int, logprobs=None) -> None:
        """Append a block: `ids` a list of ints (generation results and encodings already are), logprobs an array."""
        self.response_ids.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend(logprobs.tolist() if logprobs is not None else [0.0] * len(ids))


def rollout(model, params, tokenizer, retriever, prompts: Sequence[Prompt], cfg: RolloutConfig, *, seed: int,
            logits_fn: Optional[generation.LogitsFn] = None, timings: Optional[dict] = None,
            logits_processor: Optional[generation.LogitsProcessor] = None) -> list[Trajectory]:
    """Roll out cfg.group_size samples of each prompt; returns len(prompts) * group_size trajectories, prompt-major.

    model/params: the policy (model may be None when logits_fn is given: no KV cache). tokenizer: a
    searchjax.tokenization.Tokenizer. retriever: anything with `.search(queries: list[str], topk) ->
    list[list[hit]]` (unused with cfg.search=False). seed: sampling seed (row r samples with
    fold_in(key(process_seed(seed)), r)). logits_fn: optional stand-in for the model's next-token logits (see
    searchjax.generation), for scripted tests and the scale rehearsal. logits_processor: optional map of the
    model's logits (searchjax.generation, "Logits processors"; the rollout benchmark's scripted policy).
    timings: a dict that gets the seconds of each phase added (module docstring). cfg.session_rows > 0 splits the rows into sessions (`sessions`).
    """
    import jax
    check_rollout_config(cfg)
    check_prompts(prompts)
    prompts, spans = list(prompts), sharding.spans_processes(sharding.mesh_of(params))
    per_session = sessions(len(prompts), cfg, jax.process_count() if spans else 1)
    count = -(-len(prompts) // per_session)
    if spans and len(set(distributed.allgather(np.asarray([count])).reshape(-1).tolist())) > 1:
        raise ValueError(f"rollout: RolloutConfig.session_rows={cfg.session_rows} splits the processes' prompts into "
                         "different numbers of sessions; give every process the same number of prompts")
    trajectories = []
    for first in range(0, len(prompts), per_session):
        trajectories += _rollout_session(model, params, tokenizer, retriever, prompts[first:first + per_session], cfg,
                                         seed=seed, first_row=first * cfg.group_size, logits_fn=logits_fn,
                                         timings=timings, logits_processor=logits_processor)
    return trajectories


def sessions(num_prompts: int, cfg: RolloutConfig, processes: int = 1) -> int:
    """Prompts per generation session on one process: all of them, or with cfg.session_rows > 0 as many whole
    groups as fit in session_rows / processes rows (at least one group)."""
    if not cfg.session_rows:
        return max(1, num_prompts)
    return max(1, cfg.session_rows // processes // cfg.group_size)


def _rollout_session(model, params, tokenizer, retriever, prompts: list, cfg: RolloutConfig, *, seed: int,
                     first_row: int, logits_fn, timings, logits_processor=None) -> list[Trajectory]:
    """One generation session: the loop of the module docstring over these prompts' rows."""
    with timed(timings, "tokenize"):
        prompt_ids = encode_many(tokenizer, [protocol.build_prompt(p.question, tokenizer) for p in prompts])
    rows = [(i, g) for i in range(len(prompts)) for g in range(cfg.group_size)]
    row_prompts = [prompt_ids[i] for i, _ in rows]
    needed, bucket = required_cache_len(row_prompts, cfg), generation.prompt_bucket(row_prompts)
    if sharding.spans_processes(sharding.mesh_of(params)):
        # every process must stop together: one that raised alone would leave the others in a collective
        needed, bucket = (int(v) for v in np.max(distributed.allgather(np.asarray([[needed, bucket]])), axis=0))
    if needed > cfg.max_cache_len:
        raise ValueError(f"RolloutConfig.max_cache_len={cfg.max_cache_len} is too small: the padded prompt "
                         f"({bucket}) + {cfg.max_turns if cfg.search else 0} searching "
                         f"turns and a final one of max_new_tokens_per_turn={cfg.max_new_tokens_per_turn} + the "
                         f"observation blocks (max_obs_tokens={cfg.max_obs_tokens} -> "
                         f"{generation.append_bucket(cfg.max_obs_tokens)} slots each) need {needed}; "
                         f"set max_cache_len >= {needed}")
    codec = ObservationCodec.build(tokenizer, cfg.max_obs_tokens) if cfg.search else None
    searching_turns = cfg.max_turns if cfg.search else 0
    stop = protocol.STOP_STRINGS if cfg.search else (ANSWER_CLOSE,)

    with timed(timings, "generate"):
        session = generation.start(model, params, row_prompts, max_cache_len=cfg.max_cache_len, tokenizer=tokenizer,
                                   seed=process_seed(seed), logits_fn=logits_fn, first_row=first_row,
                                   logits_processor=logits_processor)
    state = [RowState() for _ in rows]
    for turn in range(searching_turns + 1):
        final = turn == searching_turns
        running = [b for b, row in enumerate(state) if row.end_reason is None]
        if not running and not session.any_running:  # on a mesh spanning processes, decode while any process runs
            break
        if final and cfg.search:
            for b in running:
                state[b].forced = True
        with timed(timings, "generate"):
            session, outputs = generation.decode(session, cfg.max_new_tokens_per_turn, temperature=cfg.temperature,
                                                 top_p=cfg.top_p, top_k=cfg.top_k, stop=stop)
        with timed(timings, "tokenize"):
            texts = decode_many(tokenizer, [outputs[b].token_ids for b in running])
        searching, invalid = [], []
        with timed(timings, "parse"):
            for b, text in zip(running, texts):
                row, out = state[b], outputs[b]
                row.add(out.token_ids, 1, out.logprobs)
                row.num_turns += 1
                action = protocol.parse_action(text)
                if not cfg.search:  # no tool: the turn stops at its first </answer>, whatever came before it
                    answer = extract_answer(text)
                    action = protocol.INVALID if answer is None else protocol.Action("answer", answer)
                if action.kind == "answer":
                    row.answer, row.end_reason = action.content, END_ANSWER
                elif out.stop_reason == "eos":
                    row.end_reason = END_EOS
                elif final:
                    row.end_reason = END_TURNS
                elif action.kind == "search":
                    searching.append((b, action.content))
                else:
                    row.invalid_actions += 1
                    invalid.append(b)
        observations = {}
        if invalid:
            with timed(timings, "tokenize"):
                encoded = codec.encode_many([protocol.INVALID_ACTION_OBSERVATION] * len(invalid), information=False)
            observations.update(zip(invalid, encoded))
        if searching:
            with timed(timings, "retrieval"):
                results, error = search_turn(retriever, [q for _, q in searching], cfg.topk)
            if error is not None:
                log.warning("rollout turn %d: the retriever failed on %d queries (%s); they get the error observation",
                            turn, len(searching), error)
            with timed(timings, "parse"):
                for j, (b, query) in enumerate(searching):
                    row = state[b]
                    row.queries.append(query)
                    row.retrieved.append([] if results is None else results[j])
                    row.retrieval_errors += results is None
                texts = [RETRIEVAL_ERROR_OBSERVATION if results is None else protocol.search_observation(results[j])
                         for j in range(len(searching))]
            with timed(timings, "tokenize"):
                encoded = codec.encode_many(texts, information=True)
            observations.update(zip([b for b, _ in searching], encoded))
        if observations:
            with timed(timings, "parse"):
                for b, (ids, truncated) in observations.items():
                    state[b].add(ids, 0)
                    state[b].truncated_observations += truncated
        if observations or session.spans_processes:  # there every process appends together (generation.append)
            with timed(timings, "generate"):
                session = generation.append(session, [observations[b][0] if b in observations else []
                                                      for b in range(len(rows))])

    with timed(timings, "tokenize"):
        response_texts = decode_many(tokenizer, [row.response_ids for row in state])
    trajectories = []
    with timed(timings, "parse"):
        for (i, g), row, text in zip(rows, state, response_texts):
            queries = row.queries
            trajectories.append(Trajectory(
                prompt=prompts[i], sample_index=g, prompt_ids=list(prompt_ids[i]), response_ids=row.response_ids,
                loss_mask=row.loss_mask, sampler_logprobs=row.logprobs, response_text=text,
                queries=queries, doc_ids=[[h.id for h in hits] for hits in row.retrieved], retrieved=row.retrieved,
                answer=row.answer, num_searches=count_searches(queries),
                duplicate_queries=count_duplicate_queries(queries), forced_termination=row.forced,
                valid_answer=is_valid_answer(row.answer), end_reason=row.end_reason or END_TURNS,
                num_turns=row.num_turns, invalid_actions=row.invalid_actions, retrieval_errors=row.retrieval_errors,
                truncated_observations=row.truncated_observations))
    return trajectories
