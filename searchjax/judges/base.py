"""The judge interface: chat messages in, text out; plus JSON-constrained parsing, retries and accounting.

A *judge* is any LLM that reads a chat (a list of {"role", "content"} messages) and writes text: the
EviBack Teacher, the CCS reconstructor, a DR.Free grader. Backends:

* `searchjax.judges.openai_compat.OpenAICompatJudge`: any OpenAI-compatible HTTP endpoint (vLLM, SGLang,
  GLM, Azure OpenAI, Gemini) through the `openai` SDK;
* `searchjax.judges.local.LocalJudge`: our JAX policy model, by option log-likelihoods (closed choice) or
  greedy generation (free text).

What every backend shares lives here:

* `JudgeRequest` / `JudgeReply`: the request (messages, token limit, stop strings, and for closed-choice
  questions the exact reply texts allowed) and the reply (text, token counts, latency, attempts).
* `JudgeError(kind, ...)`: the one error type. kind is one of `ERROR_KINDS`; `retryable` says whether
  another attempt may succeed (timeouts, connection errors, HTTP 408/429/5xx). Rewards catch it and turn
  the affected group into a zero-advantage group plus a counter; training never crashes on a judge.
* `with_retries`: the shared retry loop of `searchjax.retry` (exponential backoff with jitter, a server's
  Retry-After honoured on 429 / 503) applied to retryable JudgeErrors only.
* A concurrency limit: `Judge.complete_many` fans requests out over a thread pool of `max_concurrency`
  workers, and every `complete` holds a semaphore of the same size, so concurrent callers together never
  exceed it.
* `JudgeUsage`: thread-safe counts of calls, failures, retries, prompt/completion tokens, and cost
  (tokens x price per million, from the config).
* JSON-constrained replies: `parse_json_reply(text, spec)` extracts a JSON object from a reply, repairs
  common damage (code fences, prose around the object, single quotes, trailing commas, bare keys, Python
  literals, missing closing braces, a reply that is just one allowed value) and validates it against a
  small spec (field -> allowed strings, or `float` in [lo, hi], or `str`). `ask_json_many` asks, parses,
  and re-asks once with a correction message for replies that cannot be repaired (`ask_many`: the same
  loop for any parser).
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import hashlib
import json
import re
import threading
import time
from typing import Callable, Mapping, Sequence, TypeVar

from searchjax import retry
from searchjax.retry import RetryPolicy  # noqa: F401  (re-exported: judges build their policy from here)

ERROR_KINDS = ("timeout", "connection", "http", "malformed", "config", "backend")
ROLES = ("system", "user", "assistant")

T = TypeVar("T")


class JudgeError(Exception):
    """A judge call failed. `kind` in ERROR_KINDS; `retryable` True when another attempt may succeed."""

    def __init__(self, kind: str, message: str, *, retryable: bool = False, status: int | None = None,
                 retry_after_s: float | None = None):
        if kind not in ERROR_KINDS:
            raise ValueError(f"JudgeError kind {kind!r} is not one of {ERROR_KINDS}")
        super().__init__(f"[{kind}] {message}")
        self.kind = kind
        self.retryable = retryable
        self.status = status
        self.retry_after_s = retry_after_s   # the server's Retry-After (429 / 503), waited instead of the backoff


# --- requests and replies -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JudgeRequest:
    """One judge question.

    messages: chat messages, each {"role": "system"|"user"|"assistant", "content": str}, in order.
    max_tokens: completion token limit. stop: strings that end the completion (not included in the text).
    choices: for closed-choice questions, the complete reply texts allowed (e.g. the three JSON verdicts).
      The local backend then scores each by log-likelihood and replies with the best one verbatim; HTTP
      backends may pass them to the server's guided decoding (vLLM/SGLang `guided_choice`) when enabled.
    null_messages: optional content-free version of the chat (the same prompt with the informative part
      blanked) for contextual calibration of closed-choice scores (Zhao et al. 2021, "Calibrate Before
      Use"): a backend that scores options may subtract each option's score under it. HTTP backends
      ignore it (they never send it).
    """

    messages: tuple[Mapping[str, str], ...]
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    null_messages: tuple[Mapping[str, str], ...] = ()

    def __post_init__(self):
        if not self.messages:
            raise ValueError("JudgeRequest.messages is empty")
        for name in ("messages", "null_messages"):
            for i, m in enumerate(getattr(self, name)):
                if set(m) != {"role", "content"} or m["role"] not in ROLES or not isinstance(m["content"], str):
                    raise ValueError(f"JudgeRequest.{name}[{i}] must be {{'role': one of {ROLES}, 'content': str}}, "
                                     f"got {dict(m)!r:.200}")
        if self.null_messages and not self.choices:
            raise ValueError("JudgeRequest.null_messages calibrates closed-choice scores: it needs choices")
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"JudgeRequest.max_tokens must be a positive int, got {self.max_tokens!r}")
        if len(set(self.choices)) != len(self.choices) or any(not c for c in self.choices):
            raise ValueError(f"JudgeRequest.choices must be distinct non-empty strings, got {self.choices!r}")

    def canonical_bytes(self) -> bytes:
        """A canonical serialisation of everything the judge sees (for hashing and gold-blindness checks)."""
        return json.dumps({"messages": [dict(m) for m in self.messages], "max_tokens": self.max_tokens,
                           "stop": list(self.stop), "choices": list(self.choices),
                           "null_messages": [dict(m) for m in self.null_messages]},
                          ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()


@dataclasses.dataclass(frozen=True)
class JudgeReply:
    """A judge's answer: text, token counts, wall time, attempts used; option scores for closed choice."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    attempts: int = 1
    choice_scores: tuple[float, ...] | None = None


class JudgeUsage:
    """Thread-safe token and cost accounting for one judge. cost = in*price_in/1e6 + out*price_out/1e6."""

    def __init__(self, price_per_million_input: float = 0.0, price_per_million_output: float = 0.0):
        self._lock = threading.Lock()
        self.price_in = float(price_per_million_input)
        self.price_out = float(price_per_million_output)
        self.calls = self.failures = self.retries = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.failures_by_kind: dict[str, int] = {}

    def record_success(self, reply: JudgeReply) -> None:
        with self._lock:
            self.calls += 1
            self.retries += reply.attempts - 1
            self.prompt_tokens += reply.prompt_tokens
            self.completion_tokens += reply.completion_tokens

    def record_failure(self, error: JudgeError, attempts: int) -> None:
        with self._lock:
            self.calls += 1
            self.failures += 1
            self.retries += max(attempts - 1, 0)
            self.failures_by_kind[error.kind] = self.failures_by_kind.get(error.kind, 0) + 1

    @property
    def cost_usd(self) -> float:
        return self.prompt_tokens * self.price_in / 1e6 + self.completion_tokens * self.price_out / 1e6

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = {"calls": self.calls, "failures": self.failures, "retries": self.retries,
                   "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                   "cost_usd": self.cost_usd}
            out.update({f"failures/{k}": v for k, v in sorted(self.failures_by_kind.items())})
        return out


# --- retries ------------------------------------------------------------------------------------------------

def with_retries(call: Callable[[], T], policy: RetryPolicy, *,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[T, int]:
    """(call(), attempts used), retrying retryable JudgeErrors through `searchjax.retry.with_retries` (backoff,
    or the server's Retry-After when the error carries one); raises the last error. The raised error has
    the attribute `attempts` (how many tries were made) for accounting."""
    return retry.with_retries(call, policy, retryable=lambda e: isinstance(e, JudgeError) and e.retryable,
                              retry_after=lambda e: e.retry_after_s if isinstance(e, JudgeError) else None,
                              sleep=sleep)


# --- the interface ------------------------------------------------------------------------------------------

class Judge(abc.ABC):
    """Chat messages in, text out. Subclasses implement `_complete`; `complete` adds the concurrency limit,
    retries and accounting; `complete_many` runs a batch and returns a JudgeReply or a JudgeError per request
    (it never raises JudgeError)."""

    def __init__(self, *, max_concurrency: int = 8, retry: RetryPolicy = RetryPolicy(),
                 usage: JudgeUsage | None = None):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self.retry = retry
        self.usage = usage or JudgeUsage()
        self._slots = threading.BoundedSemaphore(max_concurrency)

    @abc.abstractmethod
    def _complete(self, request: JudgeRequest) -> JudgeReply:
        """One attempt; raise JudgeError on failure (retryable where appropriate)."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """What to write in audit records: backend, model, endpoint. Never a credential."""

    def complete(self, request: JudgeRequest) -> JudgeReply:
        start = time.perf_counter()

        def attempt():
            with self._slots:
                try:
                    return self._complete(request)
                except JudgeError:
                    raise
                except Exception as e:  # a backend bug must not take training down; it is counted instead
                    raise JudgeError("backend", f"{type(e).__name__}: {str(e)[:300]}") from e
        try:
            reply, attempts = with_retries(attempt, self.retry)
        except JudgeError as error:
            self.usage.record_failure(error, getattr(error, "attempts", 1))
            raise
        reply = dataclasses.replace(reply, attempts=attempts, latency_s=time.perf_counter() - start)
        self.usage.record_success(reply)
        return reply

    def complete_many(self, requests: Sequence[JudgeRequest]) -> list[JudgeReply | JudgeError]:
        def one(request):
            try:
                return self.complete(request)
            except JudgeError as error:
                return error
        if len(requests) <= 1:
            return [one(r) for r in requests]
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(one, requests))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


# --- JSON-constrained replies -------------------------------------------------------------------------------

FieldSpec = "tuple[str, ...] | type | tuple[type, float, float]"
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_BARE_KEY = re.compile(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)(\s*:)")
_PY_LITERALS = {r"\bTrue\b": "true", r"\bFalse\b": "false", r"\bNone\b": "null"}


def _json_candidates(text: str) -> list[str]:
    """Substrings of a reply that may hold the JSON object, most likely first."""
    out = [m.group(1) for m in _FENCE.finditer(text)]
    start = text.find("{")
    if start >= 0:
        end = text.rfind("}")
        out.append(text[start:end + 1] if end > start else text[start:])
    out.append(text)
    return out


def _repairs(candidate: str) -> list[str]:
    """The candidate, then progressively more aggressive repairs of it."""
    s = candidate.strip()
    out = [s]
    s = s.replace("\u201c", '"').replace("\u201d", '"').replace("\u2018", "'").replace("\u2019", "'")
    if '"' not in s:
        s = s.replace("'", '"')
    s = _TRAILING_COMMA.sub(r"\1", s)
    s = _BARE_KEY.sub(r'\1"\2"\3', s)
    for pattern, repl in _PY_LITERALS.items():
        s = re.sub(pattern, repl, s)
    out.append(s)
    if s.startswith("{"):
        closed = s
        if closed.count('"') % 2 == 1:
            closed += '"'
        closed += "}" * max(closed.count("{") - closed.count("}"), 0)
        out.append(closed)
    return out


def _validate(obj: dict, spec: Mapping[str, object], text: str) -> dict:
    out = {}
    for name, kind in spec.items():
        if name not in obj:
            raise JudgeError("malformed", f"reply JSON lacks field {name!r}: {text[:200]!r}")
        value = obj[name]
        if isinstance(kind, tuple) and kind and all(isinstance(k, str) for k in kind):
            matches = [k for k in kind if isinstance(value, str) and value.strip().lower() == k.lower()]
            if not matches:
                raise JudgeError("malformed", f"field {name!r} = {value!r} is not one of {kind}")
            out[name] = matches[0]
        elif kind is str:
            if not isinstance(value, str):
                raise JudgeError("malformed", f"field {name!r} = {value!r} is not a string")
            out[name] = value
        else:
            lo, hi = (kind[1], kind[2]) if isinstance(kind, tuple) else (float("-inf"), float("inf"))
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise JudgeError("malformed", f"field {name!r} = {value!r} is not a number") from None
            if not lo <= number <= hi:
                raise JudgeError("malformed", f"field {name!r} = {number} is outside [{lo}, {hi}]")
            out[name] = number
    return out


_THINK_OPEN = re.compile(r"^\s*<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)


def strip_reasoning(text: str) -> str:
    """The reply after a reasoning Teacher's think block (Qwen3, GLM-4.x, DeepSeek-R1 write
    "<think>...</think>" before the answer; a chat template that opens the block itself leaves only the
    closing tag in the reply). A reply that opens a block and never closes it was cut inside its reasoning
    by the token limit: JudgeError("malformed") saying so (the JSON after it was never written)."""
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        return text[closes[-1].end():]
    if _THINK_OPEN.match(text):
        raise JudgeError("malformed", "reply ends inside its <think> block: the reasoning did not finish within "
                                      "the reply limit (raise max_reply_tokens for a reasoning Teacher)")
    return text


def parse_json_reply(text: str, spec: Mapping[str, object]) -> dict:
    """The fields of `spec` parsed from a judge reply, or JudgeError("malformed").

    spec maps a field name to: a tuple of allowed strings (matched case-insensitively, returned in the
    spec's spelling), `str`, `float`, or `(float, lo, hi)`. Extra fields in the reply are ignored. When the
    spec has exactly one enum field, a reply that is nothing but one allowed value (quotes and final
    punctuation aside) is accepted as that value. A reasoning model's think block before the JSON is
    skipped first (`strip_reasoning`), so braces inside the reasoning are never taken for the object.
    """
    if not isinstance(text, str):
        raise JudgeError("malformed", f"reply is {type(text).__name__}, not text")
    text = strip_reasoning(text)
    last_error: JudgeError | None = None
    for candidate in _json_candidates(text):
        for repaired in _repairs(candidate):
            try:
                obj = json.loads(repaired)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(obj, dict):
                try:
                    return _validate(obj, spec, text)
                except JudgeError as error:
                    last_error = error
    enums = [(n, k) for n, k in spec.items() if isinstance(k, tuple) and k and all(isinstance(x, str) for x in k)]
    if len(spec) == 1 and len(enums) == 1:
        name, allowed = enums[0]
        bare = text.strip().strip("\"'`*").rstrip(".!").strip().lower()
        for value in allowed:
            if bare == value.lower():
                return {name: value}
    raise last_error or JudgeError("malformed", f"no JSON object with fields {list(spec)} in reply {text[:200]!r}")


@dataclasses.dataclass
class JsonOutcome:
    """The result of one JSON-constrained question: parsed fields or the error, and every reply received."""

    request: JudgeRequest
    parsed: dict | None = None
    error: JudgeError | None = None
    replies: list[JudgeReply] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.parsed is not None


CORRECTION = ("Your previous reply could not be used: {error}. Reply again with only a JSON object with the "
              "fields {fields}, and nothing else.")


def ask_many(judge: Judge, requests: Sequence[JudgeRequest], parse: Callable[[str], dict],
             correction: Callable[[JudgeError], str], *, correction_rounds: int = 1) -> list[JsonOutcome]:
    """Ask every request (through `judge.complete_many`) and `parse` each reply's text; a reply `parse` refuses
    (JudgeError) is asked again up to `correction_rounds` times, with the bad reply and `correction(error)` as a
    user message appended to the chat. Transport failures (timeouts, HTTP errors) are not re-asked here: the
    backend has already retried them. Never raises JudgeError: failures are in `JsonOutcome.error`. The one
    ask-parse-correct loop behind `ask_json_many` and the Teacher bundles' `ask_parsed_many`."""
    outcomes = [JsonOutcome(request=r) for r in requests]
    pending = list(range(len(requests)))
    current = list(requests)
    for round_index in range(correction_rounds + 1):
        results = judge.complete_many([current[i] for i in pending])
        retry = []
        for i, result in zip(pending, results):
            if isinstance(result, JudgeError):
                outcomes[i].error = result
                continue
            outcomes[i].replies.append(result)
            try:
                outcomes[i].parsed = parse(result.text)
                outcomes[i].error = None
            except JudgeError as error:
                outcomes[i].error = error
                if round_index < correction_rounds:
                    current[i] = dataclasses.replace(current[i], messages=current[i].messages + (
                        {"role": "assistant", "content": result.text}, {"role": "user", "content": correction(error)}))
                    retry.append(i)
        pending = retry
        if not pending:
            break
    return outcomes


def ask_json_many(judge: Judge, requests: Sequence[JudgeRequest], spec: Mapping[str, object], *,
                  correction_rounds: int = 1) -> list[JsonOutcome]:
    """`ask_many` with replies parsed against `spec` (`parse_json_reply`) and the JSON correction message."""
    fields = ", ".join(spec)
    return ask_many(judge, requests, lambda text: parse_json_reply(text, spec),
                    lambda error: CORRECTION.format(error=str(error), fields=fields),
                    correction_rounds=correction_rounds)
