"""One retriever interface for the rollout loop: an index in this process, or a /retrieve server.

    retriever = InProcessRetriever(default_index("bm25"))        # or HttpRetriever("http://127.0.0.1:8000")
    hits = retriever.search(["capital of france", "who wrote hamlet"], topk=3)   # all queries of a turn at once

Both return list[list[Hit]] (one list per query, best first). HttpRetriever speaks Search-R1's
protocol (POST /retrieve {"queries", "topk", "return_scores": true}), so it also works against
Search-R1's own retrieval_server.py.

Large turns: a turn of 512 prompts x 5 samples is 2,560 queries in one call. HttpRetriever splits a call
into requests of at most the server's query limit, sends them concurrently (at most `max_concurrency`
in flight) and joins the answers in query order. The limit is `max_queries_per_request` when set, else
learned from the server: its /health `max_queries` (our server), or the `max_queries` a 413 answer names
(the over-long request is then re-split and sent again). A server that states no limit (Search-R1's)
gets the whole call in one request, as Search-R1's own client sends it.

Failures go through `searchjax.retry` (the loop the judges use too): connection failures, timeouts, 408,
429 and 5xx are retried with exponential backoff, honouring Retry-After on 429 / 503; any other 4xx raises
RetrieverRequestError at once (retrying cannot fix the request); RetrieverUnavailableError, naming the URL
and the last status, when every attempt failed.

`probe(url)` checks a server once at start-up (training calls it before loading the model): a dead URL, a
401 or a wrong path ends in one RetrieverProbeError line that says which.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Protocol, Sequence, runtime_checkable

from retrieval.corpus import Hit, parse_contents
from searchjax import retry


@runtime_checkable
class Retriever(Protocol):
    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """One hit list per query, best first, at most topk each."""
        ...


class RetrieverUnavailableError(ConnectionError):
    """The retrieval server could not be reached (or kept failing) after every retry."""


class RetrieverRequestError(ValueError):
    """The retrieval server rejected the request (HTTP 4xx other than 408 / 429)."""


class RetrieverProbeError(RuntimeError):
    """The start-up probe found no working /retrieve endpoint at the configured URL (one-line message)."""


def _check_queries(queries: Sequence[str], topk: int) -> list[str]:
    if isinstance(queries, str):
        raise TypeError("search takes a list of queries (all queries of a turn), got a single string")
    queries = list(queries)
    bad = [i for i, q in enumerate(queries) if not isinstance(q, str)]
    if bad:
        raise TypeError(f"queries must be strings; items {bad[:5]} are not")
    if not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be a positive int, got {topk!r}")
    return queries


@dataclasses.dataclass
class InProcessRetriever:
    """Wraps a BM25Index / DenseIndex; calls are serialised by a lock (the encoder runs one batch at a time)."""

    index: object

    def __post_init__(self):
        self._lock = threading.Lock()

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        queries = _check_queries(queries, topk)
        if not queries:
            return []
        with self._lock:
            return self.index.search(queries, topk)


def endpoints(url: str) -> tuple[str, str]:
    """(the /retrieve URL, the /health URL) for a server root or a full .../retrieve URL."""
    root = url.rstrip("/")
    if root.endswith("/retrieve"):
        root = root[:-len("/retrieve")]
    return root + "/retrieve", root + "/health"


class _TooManyQueries(Exception):
    """A 413 that names the server's query limit (internal: `HttpRetriever.search` re-splits the call)."""

    def __init__(self, limit: int):
        super().__init__(f"the server takes at most {limit} queries per request")
        self.limit = limit


def _stated_limit(response) -> int | None:
    """The `max_queries` a server states in a JSON body (/health, or a 413 answer), else None."""
    try:
        value = response.json().get("max_queries")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclasses.dataclass
class HttpRetriever:
    """Client of a Search-R1-compatible /retrieve endpoint (see the module docstring)."""

    url: str                          # server root ("http://127.0.0.1:8000") or the full .../retrieve URL
    timeout_s: float = 30.0           # per attempt
    retries: int = 3                  # attempts after the first
    backoff_s: float = 0.5            # backoff before retry k: min(backoff_max_s, backoff_s * 2**k) * (1 + U(0, 0.1))
    backoff_max_s: float = 8.0
    max_retry_after_s: float = 60.0   # a longer Retry-After fails the call instead of stalling the rollout
    max_queries_per_request: int = 0  # 0 = the server's limit (its /health or a 413), none stated = one request
    max_concurrency: int = 4          # requests in flight at once when a call is split

    def __post_init__(self):
        import httpx
        if self.max_queries_per_request < 0 or self.max_concurrency < 1:
            raise ValueError(f"HttpRetriever: max_queries_per_request must be >= 0 and max_concurrency >= 1, got "
                             f"{self.max_queries_per_request} and {self.max_concurrency}")
        self.endpoint, self.health_endpoint = endpoints(self.url)
        self.policy = retry.RetryPolicy(max_attempts=self.retries + 1, backoff_initial_s=self.backoff_s,
                                        backoff_max_s=self.backoff_max_s, max_retry_after_s=self.max_retry_after_s)
        self._client = httpx.Client(timeout=self.timeout_s,
                                    limits=httpx.Limits(max_connections=max(self.max_concurrency, 10)))
        self._pool = concurrent.futures.ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="retrieve")
        self._limit = self.max_queries_per_request or None
        self._limit_known = bool(self.max_queries_per_request)
        self._limit_lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def query_limit(self) -> int | None:
        """Queries per request: configured, or learned from the server (None: it states no limit)."""
        with self._limit_lock:
            if not self._limit_known:   # one GET, no retries: a server without /health just means "no limit"
                try:
                    response = self._client.get(self.health_endpoint, timeout=min(self.timeout_s, 10.0))
                    self._limit = _stated_limit(response) if response.status_code == 200 else None
                except Exception:  # noqa: BLE001 - the POSTs that follow report a dead server properly
                    self._limit = None
                self._limit_known = True
            return self._limit

    def _lower_limit(self, limit: int) -> None:
        with self._limit_lock:
            self._limit = limit if self._limit is None else min(self._limit, limit)
            self._limit_known = True

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        queries = _check_queries(queries, topk)
        if not queries:
            return []
        while True:     # bounded: each pass either returns, raises, or strictly lowers the limit
            limit = self.query_limit or len(queries)
            chunks = [queries[i:i + limit] for i in range(0, len(queries), limit)]
            try:
                if len(chunks) == 1:
                    return self._post(chunks[0], topk)
                # pool.map keeps query order; the first failing chunk's error is raised (the others are dropped)
                return [hits for part in self._pool.map(lambda c: self._post(c, topk), chunks) for hits in part]
            except _TooManyQueries as e:     # learned the limit from a 413: split again and resend
                self._lower_limit(e.limit)

    def _post(self, queries: list[str], topk: int) -> list[list[Hit]]:
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        try:
            response = retry.request(self._client, "POST", self.endpoint, self.policy, what="retrieval server",
                                     json=payload)
        except retry.HttpRejected as e:
            limit = _stated_limit(e.response) if e.status == 413 else None
            if limit is not None and limit < len(queries):
                raise _TooManyQueries(limit) from e
            raise RetrieverRequestError(str(e)) from e
        except retry.HttpUnavailable as e:
            hint = "; is it running? start one with `python -m launch.serve_retriever`" if e.status is None else ""
            raise RetrieverUnavailableError(f"{e}{hint}") from e
        return parse_response(response.json(), len(queries), self.endpoint, topk=topk)


def parse_response(body: dict, num_queries: int, where: str = "response", *, topk: int | None = None
                   ) -> list[list[Hit]]:
    """Search-R1 response {"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]} -> hits.
    Bare document lists (return_scores false) are accepted too, with score nan. With topk, a row of
    more than topk hits is refused (the server ignored the request's topk)."""
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise ValueError(f"{where}: response has no 'result' list")
    if len(body["result"]) != num_queries:
        raise ValueError(f"{where}: {len(body['result'])} result lists for {num_queries} queries")
    out = []
    for row_index, row in enumerate(body["result"]):
        if not isinstance(row, list) or (topk is not None and len(row) > topk):
            raise ValueError(f"{where}: result {row_index} is not a list of at most topk={topk} documents")
        hits = []
        for item in row:
            doc, score = (item["document"], item.get("score", float("nan"))) if "document" in item else (item, float("nan"))
            title, text = parse_contents(doc["contents"])
            hits.append(Hit(id=str(doc.get("id", "")), title=title, text=text, score=float(score)))
        out.append(hits)
    return out


# --- the start-up probe ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ProbeResult:
    endpoint: str                     # the /retrieve URL that answered
    max_queries: int | None           # the server's per-request query limit (None: it states none)
    passages: int | None              # corpus size from /health (None: no /health, e.g. Search-R1's server)
    latency_s: float                  # wall time of the probe query


def probe(url: str, *, timeout_s: float = 10.0, attempts: int = 3, backoff_s: float = 0.5) -> ProbeResult:
    """Send one real query to `url` (server root or .../retrieve) and check the answer has Search-R1's shape.

    Raises RetrieverProbeError with a one-line message: unreachable (nothing listening, after `attempts`
    tries: a server still starting gets a few seconds), 401 / 403 (an auth proxy wants a key), 404 / 405 (no
    /retrieve endpoint at that path), another status, or a 200 that is not a /retrieve answer.
    """
    import httpx
    endpoint, health = endpoints(url)
    policy = retry.RetryPolicy(max_attempts=attempts, backoff_initial_s=backoff_s, backoff_max_s=4 * backoff_s)
    payload = {"queries": ["probe"], "topk": 1, "return_scores": True}
    with httpx.Client(timeout=timeout_s) as client:
        start = time.perf_counter()
        try:
            response = retry.request(client, "POST", endpoint, policy, what="retrieval server", json=payload)
        except retry.HttpRejected as e:
            advice = {401: "unauthorised: the server (or a proxy in front of it) wants credentials",
                      403: "forbidden: the server (or a proxy in front of it) refuses this client",
                      404: "no /retrieve endpoint at that path: the URL should be the server root, e.g. "
                           "http://127.0.0.1:8000",
                      405: "that path does not take POST: the URL should be the server root, e.g. "
                           "http://127.0.0.1:8000"}.get(e.status, "the server refused a one-query request")
            raise RetrieverProbeError(f"retrieval probe: {endpoint} answered HTTP {e.status} ({advice})") from None
        except retry.HttpUnavailable as e:
            raise RetrieverProbeError(f"retrieval probe: {e}; is the server running? start one with "
                                      "`python -m launch.serve_retriever`") from None
        latency = time.perf_counter() - start
        try:
            parse_response(response.json(), 1, endpoint, topk=1)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            text = " ".join(str(e).split())[:200]
            raise RetrieverProbeError(f"retrieval probe: {endpoint} answered HTTP {response.status_code} but not "
                                      f"with a Search-R1 /retrieve response ({type(e).__name__}: {text})") from None
        limit = passages = None
        try:
            status = client.get(health, timeout=timeout_s)
            if status.status_code == 200:
                limit, passages = _stated_limit(status), status.json().get("passages")
        except (httpx.HTTPError, ValueError, AttributeError):
            pass                      # /health is ours, not Search-R1's: its absence is fine
    return ProbeResult(endpoint, limit, passages if isinstance(passages, int) else None, latency)
