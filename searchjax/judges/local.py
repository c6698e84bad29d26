"""Our JAX model as a judge: closed-choice questions by option log-likelihood, free text by greedy decoding.

Closed choice (`request.choices` non-empty). The chat is rendered with the tokenizer's chat template (with
the assistant header appended), and each allowed reply c_k is scored as the assistant's continuation:

    score(c_k) = sum_{i=1}^{|c_k|} log p(c_k,i | chat, c_k,<i)          choice_score="sum"
    score(c_k) = score_sum(c_k) / |c_k|                                 choice_score="mean"

with teacher-forced log-probabilities from `searchjax.scoring.token_logprobs`. With `calibrate` and a
request carrying `null_messages` (the same prompt with its informative part blanked), each score is
taken relative to the content-free chat, score(c_k | chat) - score(c_k | null chat) (contextual
calibration, Zhao et al. 2021): a small model's prior preference for one option cancels, and what is
left is how much the actual content moves it. The reply is the argmax option, verbatim (ties: the first
listed), and `JudgeReply.choice_scores` carries every (calibrated) score. Identical (prompt, options)
pairs in a batch, such as a shared null chat, are scored once. "sum" is the
log-probability that the model writes exactly that reply, the quantity a sampling judge would act on; it
favours short options, which "mean" removes. The prompt's and every option's tokens are encoded
separately and concatenated, so an option's tokens never depend on the prompt. A small model thereby
always gives a parseable answer, and the ranking of the options under its own distribution is
meaningful even when it could not follow a JSON instruction by generating.

Free generation (no choices): greedy decoding with `searchjax.generation.generate`, at most
`request.max_tokens` new tokens, stopping at EOS or at any of `request.stop`; as in the OpenAI API, the
stop string itself is cut from the returned text (generation keeps it in the tokens). Requests are
grouped by (max_tokens, stop) so one batched decode serves each group.

Usage accounting: prompt_tokens = tokens fed to the model (all option rows for closed choice),
completion_tokens = generated tokens (0 for closed choice); cost 0.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from searchjax.judges.base import Judge, JudgeError, JudgeReply, JudgeRequest, JudgeUsage, RetryPolicy


@dataclasses.dataclass(frozen=True)
class LocalJudgeConfig:
    choice_score: str = "sum"           # "sum" | "mean" over an option's tokens (module docstring)
    max_prompt_tokens: int = 2048       # longer chats are a JudgeError("backend") (callers cap evidence first)
    batch_rows: int = 8                 # rows per scoring call / prompts per generation call
    calibrate: bool = False             # closed choice: subtract option scores under request.null_messages
    chat_template_kwargs: Mapping[str, object] = dataclasses.field(default_factory=dict)  # Qwen3: enable_thinking

    def __post_init__(self):
        if self.choice_score not in ("sum", "mean"):
            raise ValueError(f"LocalJudgeConfig.choice_score must be 'sum' or 'mean', got {self.choice_score!r}")
        if self.batch_rows < 1 or self.max_prompt_tokens < 1:
            raise ValueError(f"LocalJudgeConfig: batch_rows and max_prompt_tokens must be >= 1, got {self}")


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """text up to the earliest occurrence of any stop string (the whole text if none occurs)."""
    cut = len(text)
    for s in stops:
        k = text.find(s)
        if 0 <= k < cut:
            cut = k
    return text[:cut]


class LocalJudge(Judge):
    """A judge running `model`/`params` (a frozen copy: pass the weights the judge should keep)."""

    def __init__(self, model, params, tokenizer, cfg: LocalJudgeConfig = LocalJudgeConfig(), *, name: str = ""):
        # One device, one batched call at a time: concurrency 1, no retries (failures are deterministic).
        super().__init__(max_concurrency=1, retry=RetryPolicy(max_attempts=1), usage=JudgeUsage())
        self.model, self.params, self.tokenizer, self.cfg = model, params, tokenizer, cfg
        self.name = name or getattr(tokenizer, "source", "") or "local"

    def describe(self) -> dict:
        arch = getattr(getattr(self.model, "config", None), "architecture", "")
        return {"backend": "local", "model": self.name, "architecture": arch, "choice_score": self.cfg.choice_score}

    # --- the interface -------------------------------------------------------------------------------------

    def _complete(self, request: JudgeRequest) -> JudgeReply:
        result = self._run([request])[0]
        if isinstance(result, JudgeError):
            raise result
        return result

    def complete_many(self, requests: Sequence[JudgeRequest]) -> list[JudgeReply | JudgeError]:
        """All requests in as few batched device calls as possible (overrides the thread pool)."""
        with self._slots:
            try:
                results = self._run(list(requests))
            except Exception as e:  # a failure of the batched call fails every request in it, never training
                error = JudgeError("backend", f"{type(e).__name__}: {str(e)[:300]}")
                results = [error] * len(requests)
        for result in results:
            if isinstance(result, JudgeError):
                self.usage.record_failure(result, 1)
            else:
                self.usage.record_success(result)
        return results

    # --- implementation ------------------------------------------------------------------------------------

    def _prompt_ids(self, messages) -> list[int]:
        text = self.tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True,
                                                  **dict(self.cfg.chat_template_kwargs))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > self.cfg.max_prompt_tokens:
            raise JudgeError("backend", f"chat has {len(ids)} tokens > LocalJudgeConfig.max_prompt_tokens="
                                        f"{self.cfg.max_prompt_tokens}")
        return ids

    def _run(self, requests: list[JudgeRequest]) -> list[JudgeReply | JudgeError]:
        results: list[JudgeReply | JudgeError | None] = [None] * len(requests)
        prompts: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            try:
                prompts[i] = self._prompt_ids(request.messages)
            except JudgeError as error:
                results[i] = error
        choice = [i for i in prompts if requests[i].choices]
        free = [i for i in prompts if not requests[i].choices]
        if choice:
            for i, reply in zip(choice, self._choose([prompts[i] for i in choice], [requests[i] for i in choice])):
                results[i] = reply
        groups: dict[tuple, list[int]] = {}
        for i in free:
            groups.setdefault((requests[i].max_tokens, tuple(requests[i].stop)), []).append(i)
        for (max_tokens, stop), members in groups.items():
            for i, reply in zip(members, self._generate([prompts[i] for i in members], max_tokens, stop)):
                results[i] = reply
        return results

    def _choose(self, prompts: list[list[int]], requests: list[JudgeRequest]) -> list[JudgeReply]:
        """Score every option of every request (and, with calibration, under each distinct null chat)."""
        jobs: dict[tuple, int] = {}  # (prompt ids, options) -> job index; identical jobs are scored once
        job_list: list[tuple[list[int], tuple[str, ...]]] = []

        def job(prompt_ids, options):
            key = (tuple(prompt_ids), options)
            if key not in jobs:
                jobs[key] = len(job_list)
                job_list.append((prompt_ids, options))
            return jobs[key]
        main = [job(p, r.choices) for p, r in zip(prompts, requests)]
        null = [job(self._prompt_ids(r.null_messages), r.choices)
                if self.cfg.calibrate and r.null_messages else None for r in requests]
        scores, fed = self._score_choices([p for p, _ in job_list], [o for _, o in job_list])
        replies = []
        for r, m, n in zip(requests, main, null):
            s = np.asarray(scores[m]) - (np.asarray(scores[n]) if n is not None else 0.0)
            best = int(np.argmax(s))
            replies.append(JudgeReply(text=r.choices[best], prompt_tokens=fed[m] + (fed[n] if n is not None else 0),
                                      completion_tokens=0, choice_scores=tuple(float(x) for x in s)))
        return replies

    def _score_choices(self, prompts: list[list[int]],
                       choices: list[tuple[str, ...]]) -> tuple[list[list[float]], list[int]]:
        """(per prompt: each option's score, per prompt: tokens fed) by batched teacher-forced scoring."""
        from searchjax.scoring import token_logprobs
        rows, owners = [], []
        for r, (prompt, options) in enumerate(zip(prompts, choices)):
            for k, option in enumerate(options):
                option_ids = self.tokenizer.encode(option, add_special_tokens=False)
                if not option_ids:
                    raise JudgeError("backend", f"choice {option!r} encodes to no tokens")
                rows.append((prompt + option_ids, len(option_ids)))
                owners.append((r, k))
        sums = np.zeros(len(rows), np.float64)
        order = sorted(range(len(rows)), key=lambda j: len(rows[j][0]))  # similar lengths share a call
        for start in range(0, len(order), self.cfg.batch_rows):
            members = order[start:start + self.cfg.batch_rows]
            width = max(len(rows[j][0]) for j in members)
            ids = np.zeros((len(members), width), np.int32)
            mask = np.zeros((len(members), width), bool)
            for b, j in enumerate(members):  # left padding: every option ends at the right edge
                ids[b, width - len(rows[j][0]):] = rows[j][0]
                mask[b, width - len(rows[j][0]):] = True
            logp = np.asarray(token_logprobs(self.model, self.params, ids, mask), np.float64)  # [B, width-1]
            for b, j in enumerate(members):
                sums[j] = logp[b, width - 1 - rows[j][1]:].sum()
        scores: list[list[float]] = [[0.0] * len(c) for c in choices]
        fed = [0] * len(choices)
        for j, (r, k) in enumerate(owners):
            scores[r][k] = sums[j] / (rows[j][1] if self.cfg.choice_score == "mean" else 1)
            fed[r] += len(rows[j][0])
        return scores, fed

    def _generate(self, prompts: list[list[int]], max_tokens: int, stop: tuple[str, ...]) -> list[JudgeReply]:
        from searchjax.generation import generate
        replies = []
        for start in range(0, len(prompts), self.cfg.batch_rows):
            chunk = prompts[start:start + self.cfg.batch_rows]
            results = generate(self.model, self.params, chunk, max_new_tokens=max_tokens, temperature=0.0,
                               stop=stop, tokenizer=self.tokenizer if stop else None)
            for prompt, result in zip(chunk, results):
                text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
                replies.append(JudgeReply(text=cut_at_stop(text, stop), prompt_tokens=len(prompt),
                                          completion_tokens=len(result.token_ids)))
        return replies
