"""The scale rehearsal: an experiment config's host path at its real batch on a CPU host, without the model.

A paper configuration rolls out `prompts_per_step x rollout.group_size` rows per step (configs/search_r1.py:
512 x 5 = 2,560; configs/eviback.py: 512 x 8 = 4,096). This driver runs one step of everything the host does
at that size -- the rollout's tokenisation, its retrieval calls to a real /retrieve server, action parsing,
the reward (with the Teacher's HTTP calls for EviBack), advantages and the trainer's batching -- and times
each phase, so a run is shown to survive its own batch before anyone rents accelerators.

The policy is scripted (`scripted_logits_fn`): one jax-traceable function of (tokens [B, S], lengths [B]) that
decides every row's next token from the row's position alone, inside the jitted decode loop, so the
rehearsal times the host loop and not a Python callback per row and step. Every turn of every row is

    M  [filler ...]  <search> query </search>        (searching turns)
    M  [filler ...]  <answer> answer </answer>       (the final turn)
    M  filler ... (to the turn's budget)              (an invalid action: every `invalid_every`-th row's
                                                       second turn, when there are at least two)

where M is a marker token (an added special token that no prompt contains): the number of markers in the
row is the turn it is in, and the tokens since the last marker its position in that turn. A row whose
script is finished emits M again, which is exactly what happens right after an observation is appended.
With `fill_turns` the filler ("<think> ..." text) pads every turn to `max_new_tokens_per_turn` tokens (the
papers' full 500-token turns); without it turns are as short as their action. Queries: turn 0 searches the
question itself (as search agents mostly do first, so the G samples of a question send the same query),
later turns search the title of another passage of the corpus. Answers: the gold answer for samples g
with g even of prompts with an odd index, "unknown" otherwise, so half of the groups are all-zero groups
(EviBack's Teacher is called for them) and the expected exact-match mean is known in advance.

Prompts are synthetic and distinct: "What do we know about <title>, according to its encyclopedia
article?" for passages of the default corpus, gold answer the first words of the title.

Peak host memory is the process's `getrusage` maximum resident set; on a CPU host that includes the
"device" buffers of the decode loop ([B, V] logits per step), which on an accelerator would sit in HBM.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import resource
import sys
import time
from typing import Callable, Optional, Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np

SEARCH, ANSWER, INVALID = 0, 1, 2
# Host phases reported (wall "time/<phase>_s" and process CPU "cpu/<phase>_s"); "generate" is the scripted decode
# loop (the device's work on an accelerator host), "rollout" all of the rollout.
PHASES = ("tokenize", "retrieval", "parse", "reward", "batching", "generate", "rollout")
WRONG_ANSWER = "unknown"
FILLER_TEXT = ("<think> I should find the facts the question asks for before answering, so let me think about "
               "which words a search engine would match and what the passages so far have said. ")


def rehearsal_config() -> ml_collections.ConfigDict:
    """The rehearsal's own knobs (launch/rehearse.py: --rehearsal.<field>); the experiment config sets the rest."""
    c = ml_collections.ConfigDict()
    c.fill_turns = False  # True: every turn fills max_new_tokens_per_turn tokens (the papers' 500-token turns)
    c.invalid_every = 10  # every n-th row writes an invalid action in its second turn (0 = never)
    c.tokenizer = "smollm2"  # the scripted policy's tokenizer: an alias, HF directory or .gguf (the
    # config's own model is usually not on a CPU host; its vocabulary size only changes the device's work)
    c.retrieval_url = ""  # a running /retrieve server; "" = start one in this process over config.retrieval.index
    # ("bm25" | "dense" | an index directory; the papers' configs name a URL instead: then the default BM25)
    c.judge = "scripted"  # "scripted": a loopback OpenAI-compatible server with deterministic verdicts replaces
    # config.teacher's endpoint (reward_fn eviback); "config": use config.teacher as it is
    c.seed = 0  # rollout seed
    return c


# ----------------------------------------------------------------------------------------- prompts, script

def rehearsal_prompts(num_prompts: int, corpus: Sequence, tokenizer, answer_room: int) -> list:
    """`num_prompts` distinct prompts over passages 0, 19, 38, ... (mod the corpus size) of the corpus; gold answer:
    the longest prefix of at most three title words whose tokens fit in `answer_room`."""
    from searchjax.agent.rollout import Prompt
    if num_prompts > len(corpus):
        raise ValueError(f"rehearsal: {num_prompts} prompts but the corpus has {len(corpus)} passages")
    prompts = []
    for i in range(num_prompts):
        passage = corpus[(19 * i) % len(corpus)]  # 19 is coprime to the default corpus's 10,033
        words = passage.title.split()
        gold = words[0]
        for n in (3, 2):
            if len(tokenizer.encode(" " + " ".join(words[:n]))) <= answer_room:
                gold = " ".join(words[:n])
                break
        prompts.append(Prompt(uid=f"rehearsal/{i}", question=f"What do we know about {passage.title}, according to "
                              "its encyclopedia article?", golden_answers=(gold,), data_source="rehearsal"))
    return prompts


def pick_marker(tokenizer, prompt_texts: Sequence[str]) -> int:
    """The largest added-token id that is not EOS / pad and whose text appears in no prompt."""
    excluded = set(tokenizer.eos_token_ids) | {tokenizer.pad_token_id, 0}
    candidates = sorted((i for i, t in tokenizer.hf.added_tokens_decoder.items()
                         if i not in excluded and not any(t.content in p for p in prompt_texts)), reverse=True)
    if not candidates:
        raise ValueError(f"rehearsal: tokenizer {tokenizer.source} has no spare added token to mark turn starts")
    return int(candidates[0])


@dataclasses.dataclass(frozen=True)
class Script:
    """The tables the scripted policy indexes (numpy, host-built once): see `scripted_logits_fn`."""

    marker: int
    vocab_size: int
    group_size: int
    num_prompts: int
    max_turns: int
    budget: int  # max_new_tokens_per_turn
    fill: bool
    invalid_every: int
    filler: np.ndarray  # [>= budget] int32: "<think> ..." tokens
    piece_ids: np.ndarray  # [3, 2, W] int32: (kind, open / close) -> tokens
    piece_len: np.ndarray  # [3, 2] int32
    content_ids: np.ndarray  # [C, W] int32: questions (P), then titles (T), then golds (P), then the wrong answer
    content_len: np.ndarray  # [C] int32
    num_titles: int


def build_script(tokenizer, prompts: Sequence, corpus: Sequence, *, group_size: int, max_turns: int, budget: int,
                 fill: bool, invalid_every: int, marker: int) -> Script:
    """The scripted policy's tables for these prompts (rows prompt-major: row b = prompt b // G, sample b % G)."""
    def ids(text):
        return tokenizer.encode(text)
    pieces = {SEARCH: (ids("<search>"), ids(" </search>")), ANSWER: (ids("<answer>"), ids(" </answer>")),
              INVALID: ([], [])}
    room = budget - 1 - max(len(o) + len(c) for o, c in pieces.values())  # content tokens that always fit
    if room < 1:
        raise ValueError(f"rehearsal: max_new_tokens_per_turn={budget} cannot hold a search action")
    titles = list(dict.fromkeys(p.title for p in corpus))[:4096]

    def fitted(text):  # the longest word prefix of text whose tokens fit in `room`
        words, out = text.split(), []
        for n in range(len(words), 0, -1):
            out = ids(" " + " ".join(words[:n]))
            if len(out) <= room:
                return out
        return ids(" " + words[0])[:room]
    contents = ([fitted(p.question) for p in prompts] + [fitted(t) for t in titles]
                + [fitted(p.golden_answers[0]) for p in prompts] + [fitted(WRONG_ANSWER)])
    width = max(max(len(c) for c in contents), max(len(x) for pair in pieces.values() for x in pair), 1)
    content_ids = np.zeros((len(contents), width), np.int32)
    for i, c in enumerate(contents):
        content_ids[i, :len(c)] = c
    piece_ids = np.zeros((3, 2, width), np.int32)
    piece_len = np.zeros((3, 2), np.int32)
    for kind, pair in pieces.items():
        for side, toks in enumerate(pair):
            piece_ids[kind, side, :len(toks)] = toks
            piece_len[kind, side] = len(toks)
    filler = []
    while len(filler) < budget:
        filler += ids(FILLER_TEXT)
    bad = {marker, *tokenizer.eos_token_ids} & set(filler + [t for c in contents for t in c])
    if bad:
        raise ValueError(f"rehearsal: script text contains reserved token ids {sorted(bad)}")
    return Script(marker=marker, vocab_size=tokenizer.vocab_size, group_size=group_size, num_prompts=len(prompts),
                  max_turns=max_turns, budget=budget, fill=fill, invalid_every=invalid_every,
                  filler=np.asarray(filler[:budget], np.int32), piece_ids=piece_ids, piece_len=piece_len,
                  content_ids=content_ids, content_len=np.asarray([len(c) for c in contents], np.int32),
                  num_titles=len(titles))


def turn_kind(row, turn, script: Script):
    """SEARCH / ANSWER / INVALID of (row, turn) (numpy or jax integer arrays)."""
    invalid = ((script.invalid_every > 0) & (script.max_turns >= 2) & (turn == 1)
               & (row % max(script.invalid_every, 1) == max(script.invalid_every, 1) - 1))
    return jnp.where(turn >= script.max_turns, ANSWER, jnp.where(invalid, INVALID, SEARCH))


def content_index(row, turn, script: Script):
    """Row in `content_ids` of (row, turn): the question (turn 0), a title (later searching turns), the gold or the
    wrong answer (the final turn)."""
    p, t = script.num_prompts, script.num_titles
    prompt, sample = row // script.group_size, row % script.group_size
    title = p + (row * 31 + turn * 17) % t
    answer = jnp.where((prompt % 2 == 1) & (sample % 2 == 0), p + t + prompt, p + t + p)
    return jnp.where(turn >= script.max_turns, answer, jnp.where(turn == 0, prompt, title))


def scripted_logits_fn(script: Script) -> Callable:
    """logits_fn(tokens [B, S] int32, lengths [B] int32) -> [B, V] float32: 0 on each row's scripted next token,
    -1e9 elsewhere (greedy and sampled decoding both emit it). Jax-traceable; build it once per script (it is a
    static argument of the jitted decode loop)."""
    filler = jnp.asarray(script.filler)
    piece_ids, piece_len = jnp.asarray(script.piece_ids), jnp.asarray(script.piece_len)
    content_ids, content_len = jnp.asarray(script.content_ids), jnp.asarray(script.content_len)
    last_prompt = script.num_prompts * script.group_size - 1

    def logits_fn(tokens, lengths):
        batch, width = tokens.shape
        position = jnp.arange(width, dtype=jnp.int32)[None, :]
        is_marker = (tokens == script.marker) & (position < lengths[:, None])
        turn = jnp.sum(is_marker, axis=1, dtype=jnp.int32) - 1  # -1: before the first marker
        last = jnp.max(jnp.where(is_marker, position, -1), axis=1)
        j = lengths - last - 1  # tokens written since the marker
        row = jnp.minimum(jnp.arange(batch, dtype=jnp.int32), last_prompt)  # padding rows: any script
        kind = turn_kind(row, turn, script)
        content = jnp.where(kind == INVALID, 0, content_index(row, turn, script))
        c_len = jnp.where(kind == INVALID, 0, content_len[content])
        o_len, e_len = piece_len[kind, 0], piece_len[kind, 1]
        action = o_len + c_len + e_len
        f_len = jnp.where(kind == INVALID, script.budget - 1, (script.budget - 1 - action) if script.fill else 0)
        total = f_len + action

        def at(table_row, k):  # table_row[k] with k clipped into range (unused branches read any entry)
            return jnp.take_along_axis(table_row, jnp.clip(k, 0, table_row.shape[-1] - 1)[:, None], axis=1)[:, 0]
        k = j - f_len
        token = jnp.where(j < f_len, filler[jnp.clip(j, 0, filler.shape[0] - 1)],
                          jnp.where(k < o_len, at(piece_ids[kind, 0], k),
                                    jnp.where(k < o_len + c_len, at(content_ids[content], k - o_len),
                                              at(piece_ids[kind, 1], k - o_len - c_len))))
        target = jnp.where((turn >= 0) & (j < total), token, script.marker)
        vocab = jnp.arange(script.vocab_size, dtype=jnp.int32)[None, :]
        return jnp.where(vocab == target[:, None], 0.0, -1e9).astype(jnp.float32)

    return logits_fn


# ---------------------------------------------------------------------------------------------- the judge

def scripted_teacher_reply(body: dict) -> str:
    """A deterministic Teacher: Stage A verdicts and Stage B refined answers chosen by a hash of the request."""
    text = json.dumps(body.get("messages", []), sort_keys=True)
    h = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    if '{"verdict"' in text or '\\"verdict\\"' in text:
        return json.dumps({"verdict": ("Supported", "Ambiguous", "Insufficient")[h % 3]})
    if '"answer"' in text or '\\"answer\\"' in text:
        return json.dumps({"answer": "N/A" if h % 2 else "unknown"})
    return json.dumps({"judgement": ("Correct", "Partial", "Incorrect")[h % 3]})


# ------------------------------------------------------------------------------------------------ the run

def peak_rss_gib() -> float:
    """This process's peak resident set so far, GiB (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


@dataclasses.dataclass
class Rehearsal:
    """What `run` measured: `report` is the flat dict launch/rehearse.py prints; the rest is for tests."""

    report: dict
    trajectories: list
    rewards: np.ndarray
    advantages: np.ndarray
    batch: dict
    script: Script


def _retriever(config, rcfg, stack):
    """(HttpRetriever, its URL): rcfg.retrieval_url, or a server started here over the config's index."""
    from retrieval.client import HttpRetriever, probe
    url = rcfg.retrieval_url
    if not url:
        from retrieval import default_index, open_index
        from retrieval.server import serve_in_thread
        spec = config.retrieval.index if config.retrieval.index else "bm25"
        index = default_index(kind=spec) if spec in ("bm25", "dense") else open_index(spec)
        server = serve_in_thread(index)
        stack.callback(server.stop)
        url = server.url
    probe(url)  # a dead URL stops the rehearsal here, before the first turn
    retriever = HttpRetriever(url)
    stack.callback(retriever.close)
    return retriever, url


def run(config, rcfg, *, workdir: Optional[str] = None, log: Callable[[str], None] = print) -> Rehearsal:
    """One rehearsal step of `config` (an experiment config) with the rehearsal settings `rcfg`."""
    import contextlib
    import tempfile

    from retrieval.corpus import default_corpus
    from searchjax.agent import protocol
    from searchjax.agent.rollout import RolloutConfig, failure_metrics, rollout, timed
    from searchjax.data.assets import resolve_model_path
    from searchjax.experiment import loop, scoring
    from searchjax.experiment.setup import Components
    from searchjax.rl import batching
    from searchjax.experiment.validate import check_config
    from searchjax.tokenization import load_tokenizer
    check_config(config, device_count=1)  # batch arithmetic, length buckets, cache: as training checks them
    if rcfg.judge not in ("scripted", "config"):
        raise ValueError(f"rehearsal.judge={rcfg.judge!r}; valid: 'scripted', 'config'")
    rss_start = peak_rss_gib()
    times: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        workdir = workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="rehearsal-"))
        t0 = time.perf_counter()
        tokenizer = load_tokenizer(resolve_model_path(rcfg.tokenizer))
        corpus = default_corpus()
        r = config.rollout
        # Greedy: the script decides anyway. One session: the host loop is rehearsed at the step's whole batch
        # (its worst case; sessions only shrink it), and the script numbers the rows across that batch.
        rollout_cfg = RolloutConfig(**dict(r.to_dict(), temperature=0.0, session_rows=0))
        open_close = max(len(tokenizer.encode(a)) + len(tokenizer.encode(b))
                         for a, b in (("<search>", " </search>"), ("<answer>", " </answer>")))
        prompts = rehearsal_prompts(config.prompts_per_step, corpus, tokenizer, r.max_new_tokens_per_turn - 1 - open_close)
        marker = pick_marker(tokenizer, [protocol.build_prompt(p.question, tokenizer) for p in prompts])
        script = build_script(tokenizer, prompts, corpus, group_size=r.group_size, max_turns=r.max_turns,
                              budget=r.max_new_tokens_per_turn, fill=rcfg.fill_turns,
                              invalid_every=rcfg.invalid_every, marker=marker)
        retriever, url = _retriever(config, rcfg, stack)
        if config.reward_fn == "eviback" and rcfg.judge == "scripted":
            from searchjax.judges.testing_server import serve_scripted
            teacher = stack.enter_context(serve_scripted(scripted_teacher_reply))
            config = config.copy_and_resolve_references()
            with config.unlocked():
                config.teacher.base_url, config.teacher.api_key_env = teacher.base_url, ""
        components = Components(model=None, params=None, tokenizer=tokenizer, retriever=retriever,
                                train_prompts=prompts, eval_prompts=[])
        reward_fn = loop._lookup(loop.REWARD_FNS, config.reward_fn, "reward_fn")(config, components, workdir)
        advantage_fn = loop._lookup(loop.ADVANTAGE_FNS, config.advantage.estimator, "advantage.estimator")
        times["setup"] = time.perf_counter() - t0
        log(f"rehearsal: {len(prompts)} prompts x {r.group_size} = {len(prompts) * r.group_size} rows, "
            f"{r.max_turns} searching turns + 1, {r.max_new_tokens_per_turn} tokens per turn "
            f"({'filled' if rcfg.fill_turns else 'as short as the action'}), top-{r.topk}, retriever {url}")

        phases: dict[str, float] = {}
        with timed(phases, "rollout"):
            trajectories = rollout(None, None, tokenizer, retriever, prompts, rollout_cfg, seed=rcfg.seed,
                                   logits_fn=scripted_logits_fn(script), timings=phases)
        with timed(phases, "reward"):
            reward = reward_fn(trajectories)
        with timed(phases, "batching"):  # what the trainer does on the host before the first jitted call
            rewards = np.asarray(reward.rewards)
            advantages = scoring.step_advantages(advantage_fn, reward, trajectories, config.advantage)
            batch, tail = scoring.step_batch(trajectories, advantages, config, tokenizer.pad_token_id)
            micro = [batching.stack_micro_batches(mini, config.batch.micro_batch_size)
                     for mini in batching.split_rows(batch, config.batch.mini_batch_size)]

    failures = failure_metrics(trajectories)
    response_lengths = np.asarray([len(t.response_ids) for t in trajectories])
    report = {
        "rows": len(trajectories), "prompts": len(prompts), "max_turns": r.max_turns,
        "max_new_tokens_per_turn": r.max_new_tokens_per_turn, "fill_turns": bool(rcfg.fill_turns), "topk": r.topk,
        "tokenizer": rcfg.tokenizer, "vocab_size": tokenizer.vocab_size,
        **{f"{clock}/{phase}_s": phases.get(phase + suffix, 0.0) for clock, suffix in (("time", ""), ("cpu", "_cpu"))
           for phase in PHASES},
        "time/setup_s": times["setup"],
        "memory/peak_rss_gib": peak_rss_gib(), "memory/peak_rss_before_gib": rss_start,
        "retrieval_errors": int(failures["rollout/retrieval_errors"]),
        "searches_sent": int(failures["rollout/searches_sent"]),
        "invalid_actions": int(failures["rollout/invalid_actions"]),
        "truncated_observations": int(failures["rollout/truncated_observations"]),
        "response_tokens/mean": float(response_lengths.mean()), "response_tokens/max": int(response_lengths.max()),
        "batch/shape": list(batch["input_ids"].shape), "batch/loss_columns": int(tail),
        "batch/micro_batches": int(sum(len(m["input_ids"]) for m in micro)),
        "reward/mean": float(rewards.mean()),
        **{f"reward/{k}": float(v) for k, v in reward.metrics.items()
           if k.startswith("eviback/") and k.split("/", 1)[1] in ("all_zero_groups", "stage_a_requests",
                                                                    "stage_b_requests", "teacher_failures")}}
    return Rehearsal(report=report, trajectories=trajectories, rewards=rewards, advantages=np.asarray(advantages),
                     batch=batch, script=script)
