"""One retriever interface for the rollout loop: an index in this process, or a /retrieve server.

    retriever = InProcessRetriever(default_index("bm25"))        # or HttpRetriever("http://127.0.0.1:8000")
    hits = retriever.search(["capital of france", "who wrote hamlet"], topk=3)   # all queries of a turn at once

Both return list[list[Hit]] (one list per query, best first). HttpRetriever speaks Search-R1's
protocol (POST /retrieve {"queries", "topk", "return_scores": true}), so it also works against
Search-R1's own retrieval_server.py; it retries connection failures, timeouts and 5xx answers with
exponential backoff, raises RetrieverRequestError at once on a 4xx (retrying cannot fix the request),
and RetrieverUnavailableError, naming the URL, when every attempt failed.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Protocol, Sequence, runtime_checkable

from retrieval.corpus import Hit, parse_contents


@runtime_checkable
class Retriever(Protocol):
    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """One hit list per query, best first, at most topk each."""
        ...


class RetrieverUnavailableError(ConnectionError):
    """The retrieval server could not be reached (or kept failing) after every retry."""


class RetrieverRequestError(ValueError):
    """The retrieval server rejected the request (HTTP 4xx)."""


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


@dataclasses.dataclass
class HttpRetriever:
    """Client of a Search-R1-compatible /retrieve endpoint."""

    url: str                          # server root ("http://127.0.0.1:8000") or the full .../retrieve URL
    timeout_s: float = 30.0           # per attempt
    retries: int = 3                  # attempts after the first
    backoff_s: float = 0.5            # wait backoff_s * 2**attempt between attempts

    def __post_init__(self):
        import httpx
        self.endpoint = self.url.rstrip("/")
        if not self.endpoint.endswith("/retrieve"):
            self.endpoint += "/retrieve"
        self._client = httpx.Client(timeout=self.timeout_s)

    def close(self) -> None:
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import httpx
        queries = _check_queries(queries, topk)
        if not queries:
            return []
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        last_error = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._client.post(self.endpoint, json=payload)
            except httpx.TransportError as e:    # connection refused, timeouts, broken connections
                last_error = f"{type(e).__name__}: {e}"
                continue
            if 400 <= response.status_code < 500:
                raise RetrieverRequestError(f"{self.endpoint} rejected the request with HTTP "
                                            f"{response.status_code}: {response.text[:500]}")
            if response.status_code >= 500:
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            return parse_response(response.json(), len(queries), self.endpoint)
        raise RetrieverUnavailableError(
            f"retrieval server {self.endpoint} unreachable after {self.retries + 1} attempts ({last_error}); "
            "is it running? start one with `python -m launch.serve_retriever`")


def parse_response(body: dict, num_queries: int, where: str = "response") -> list[list[Hit]]:
    """Search-R1 response {"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]} -> hits.
    Bare document lists (return_scores false) are accepted too, with score nan."""
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise ValueError(f"{where}: response has no 'result' list")
    if len(body["result"]) != num_queries:
        raise ValueError(f"{where}: {len(body['result'])} result lists for {num_queries} queries")
    out = []
    for row in body["result"]:
        hits = []
        for item in row:
            doc, score = (item["document"], item.get("score", float("nan"))) if "document" in item else (item, float("nan"))
            title, text = parse_contents(doc["contents"])
            hits.append(Hit(id=str(doc.get("id", "")), title=title, text=text, score=float(score)))
        out.append(hits)
    return out
