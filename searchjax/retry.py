"""One retry policy for every call the host makes to a server: the retrieval client and the judges' endpoint.

Before attempt k + 2 (k = 0, 1, ..., after k + 1 failures) the caller waits

    delay_k = min(backoff_max_s, backoff_initial_s * 2^k) * (1 + U(0, jitter))

unless the server said how long to wait: a 429 (Too Many Requests) or 503 (Service Unavailable) carrying
`Retry-After` (RFC 9110 section 10.2.3: delta-seconds, or an HTTP-date) is waited exactly that long. A demand
longer than `max_retry_after_s` ends the retries at once: sleeping minutes inside a rollout step costs more
than one counted failure, and retrying sooner than the server asked only earns another 429.

What is retried: transport failures (connection refused or reset, timeouts) and HTTP 408, 429 and 5xx. Other
4xx answers are never retried: the same request would be refused again (a 400 is a bug in the request, a 401
a missing key, a 404 a wrong URL). Every attempt is bounded (`max_attempts` in all).

Two layers:
* `with_retries(call, policy, retryable=..., retry_after_s=...)`: the loop, for any callable and exception
  type (the judges wrap their SDK errors in JudgeError and retry through it).
* `request(client, method, url, policy)`: one httpx request with that loop; it returns the first response
  that is not retryable-failed and raises `HttpRejected` (a 4xx, not retried) or `HttpUnavailable` (every
  attempt failed), both naming the URL, the attempts and the last status.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")

RETRY_AFTER_STATUSES = frozenset({429, 503})


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """max_attempts tries in all; before retry k (k = 0, 1, ...) sleep min(max, initial * 2^k) * (1 + U(0, jitter)),
    or the server's Retry-After when it sent one (at most max_retry_after_s; a longer one ends the retries)."""

    max_attempts: int = 3
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    jitter: float = 0.1
    max_retry_after_s: float = 60.0

    def __post_init__(self):
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if min(self.backoff_initial_s, self.backoff_max_s, self.jitter, self.max_retry_after_s) < 0:
            raise ValueError(f"RetryPolicy delays must be >= 0, got {self}")

    def delay(self, retry_index: int, rng: random.Random | None = None) -> float:
        """The backoff before retry `retry_index` (0 for the first retry)."""
        base = min(self.backoff_max_s, self.backoff_initial_s * (2.0 ** retry_index))
        return base * (1.0 + (rng or random).uniform(0.0, self.jitter))


def is_retryable_status(status: int) -> bool:
    """408 Request Timeout, 429 Too Many Requests and every 5xx may succeed on another attempt; no other 4xx."""
    return status in (408, 429) or status >= 500


def parse_retry_after(value: str | None, now: datetime.datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header value: delta-seconds ("120") or an HTTP-date
    ("Wed, 21 Oct 2015 07:28:00 GMT", waited until then, 0 when past). None when absent or unparseable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:             # RFC 9110 dates are GMT; a naive one is read as UTC
            when = when.replace(tzinfo=datetime.timezone.utc)
        now = now or datetime.datetime.now(datetime.timezone.utc)
        return max(0.0, (when - now).total_seconds())
    return seconds if seconds >= 0 and seconds == seconds else None   # negative or NaN: ignore the header


def retry_after_s(status: int, headers) -> float | None:
    """The wait a 429 / 503 response asks for (None for other statuses or no usable header)."""
    if status not in RETRY_AFTER_STATUSES:
        return None
    return parse_retry_after(headers.get("retry-after"))


def with_retries(call: Callable[[], T], policy: RetryPolicy, *, retryable: Callable[[Exception], bool],
                 retry_after: Callable[[Exception], float | None] = lambda error: None,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[T, int]:
    """(call(), attempts used). An exception for which retryable(error) is true is retried after the backoff
    (or retry_after(error) seconds when that is not None); any other is raised at once. The raised exception
    gets the attributes `attempts` (tries made) and `retry_after_refused_s` (the wait a Retry-After over the
    cap asked for, when that ended the retries; else None)."""
    for attempt in range(policy.max_attempts):
        try:
            return call(), attempt + 1
        except Exception as error:  # noqa: BLE001 - classified by `retryable`, re-raised when not retried
            error.attempts, error.retry_after_refused_s = attempt + 1, None
            if not retryable(error) or attempt + 1 == policy.max_attempts:
                raise
            asked = retry_after(error)
            if asked is not None and asked > policy.max_retry_after_s:
                error.retry_after_refused_s = asked
                raise
            sleep(asked if asked is not None else policy.delay(attempt))
    raise AssertionError("unreachable")


# --- HTTP ---------------------------------------------------------------------------------------------------

class HttpError(Exception):
    """A request to `url` failed for good: `status` is the last HTTP status (None when no answer came),
    `attempts` the tries made, `detail` the last error or the start of the last response body."""

    def __init__(self, message: str, *, url: str, status: int | None, attempts: int, detail: str, response=None):
        super().__init__(message)
        self.url, self.status, self.attempts, self.detail = url, status, attempts, detail
        self.response = response      # the last httpx.Response (None when no answer came)


class HttpRejected(HttpError, ValueError):
    """The server refused the request with a 4xx that another attempt cannot change (not 408 / 429)."""


class HttpUnavailable(HttpError, ConnectionError):
    """Every attempt failed with a transport error, 408, 429 or 5xx (or a Retry-After over the cap)."""


class _Transient(Exception):
    """One failed attempt worth repeating (internal to `request`)."""

    def __init__(self, detail: str, response=None):
        super().__init__(detail)
        self.detail, self.response = detail, response
        self.status = None if response is None else response.status_code
        self.wait_s = None if response is None else retry_after_s(response.status_code, response.headers)


def _body_excerpt(response, limit: int = 300) -> str:
    try:
        text = response.text
    except Exception:  # noqa: BLE001 - an undecodable body is still a failed attempt, reported without text
        text = "<undecodable body>"
    return " ".join(text.split())[:limit]   # one line


def request(client, method: str, url: str, policy: RetryPolicy, *, what: str = "server",
            sleep: Callable[[float], None] = time.sleep, **kwargs):
    """`client.request(method, url, **kwargs)` (an httpx.Client) under `policy`; returns the httpx.Response.

    2xx and 3xx answers are returned. Transport errors, 408, 429 and 5xx are retried (Retry-After honoured on
    429 / 503); when attempts run out -> HttpUnavailable. Any other 4xx -> HttpRejected at once. Both
    messages are one line: f"{what} {url} ..." with the attempts and the last status or error.
    """
    import httpx

    def attempt():
        try:
            response = client.request(method, url, **kwargs)
        except httpx.TransportError as e:        # refused, reset, DNS, timeouts
            raise _Transient(f"{type(e).__name__}: {' '.join(str(e).split()) or 'no detail'}") from e
        if response.status_code < 400:
            return response
        detail = f"HTTP {response.status_code}: {_body_excerpt(response)}"
        if is_retryable_status(response.status_code):
            raise _Transient(detail, response)
        raise HttpRejected(f"{what} {url} rejected the request with {detail}", url=url,
                           status=response.status_code, attempts=1, detail=detail, response=response)

    try:
        response, _ = with_retries(attempt, policy, retryable=lambda e: isinstance(e, _Transient),
                                   retry_after=lambda e: e.wait_s, sleep=sleep)
    except _Transient as error:
        n, refused = error.attempts, error.retry_after_refused_s
        if refused is not None:
            reason = f"asked to retry after {refused:.0f}s (more than the {policy.max_retry_after_s:.0f}s allowed)"
        elif error.status is None:
            reason = f"unreachable after {n} attempt{'s' * (n > 1)}"
        else:
            reason = f"failed after {n} attempt{'s' * (n > 1)}"
        last = f"last status HTTP {error.status}" if error.status is not None else "no HTTP answer"
        raise HttpUnavailable(f"{what} {url} {reason} ({last}; {error.detail})", url=url, status=error.status,
                              attempts=n, detail=error.detail, response=error.response) from error
    return response
