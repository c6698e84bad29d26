"""The /retrieve server at the papers' batch size and under faults, over the default BM25 index on loopback.

Faults are injected by an index wrapper that can hold the worker on a gate (so requests pile up in the queue
and get batched together) and that answers wrongly for queries carrying a marker word."""

import concurrent.futures
import threading
import time

import httpx
import pytest

from retrieval.corpus import format_passages, parse_contents
from retrieval.server import ServerLimits, serve_in_thread


class _Fatal(BaseException):
    """Not an Exception: ends the worker thread, as a crashed index process would."""


class FaultyIndex:
    """Wraps an index; records every search call; holds calls while `gate` is clear; misbehaves on markers."""

    def __init__(self, index):
        self.index, self.size = index, index.size
        self.calls, self.lock = [], threading.Lock()
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()

    def search(self, queries, topk):
        with self.lock:
            self.calls.append(list(queries))
        self.entered.set()
        assert self.gate.wait(30), "test gate never opened"
        text = " ".join(queries)
        if "POISON" in text:
            raise ValueError("poisoned query")
        if "FATAL" in text:
            raise _Fatal("index process lost")
        if "SHORT" in text:
            return self.index.search(queries, topk)[:-1]
        if "EXTRA" in text:
            return self.index.search(queries, topk + 1)
        return self.index.search(queries, topk)


@pytest.fixture(scope="module")
def bm25_default():
    from retrieval import default_index
    return default_index("bm25")


def _wait_until(predicate, what, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _post(url, queries, topk=3, timeout=60.0):
    return httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": topk, "return_scores": True},
                      timeout=timeout)


def test_search_r1_request_of_4096_queries(bm25_default, corpus):
    """Exactly Search-R1's `_batch_search` body with a whole EviBack turn (512 x 8 = 4,096 queries), default
    limits: answered in one response, searched in pieces of at most max_batch_queries, equal to the index."""
    index = FaultyIndex(bm25_default)
    queries = [f"{corpus[(37 * i) % len(corpus)].title} history" for i in range(4096)]
    server = serve_in_thread(index)
    try:
        start = time.perf_counter()
        response = httpx.post(f"{server.url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": True},
                              timeout=120)
        elapsed = time.perf_counter() - start
        health = httpx.get(f"{server.url}/health").json()
    finally:
        server.stop()
    assert response.status_code == 200, response.text[:300]
    result = response.json()["result"]
    assert len(result) == 4096 and all(len(row) == 3 for row in result)
    # Every 4th row against the index searched directly (BM25 scores one query at a time, so batching cannot
    # change a row; a quarter keeps the reference's cost down on a shared machine), spread over all pieces.
    checked = list(range(0, 4096, 4))
    expected = bm25_default.search([queries[i] for i in checked], 3)
    assert [[item["document"]["id"] for item in result[i]] for i in checked] == [[h.id for h in e] for e in expected]
    assert all(abs(item["score"] - h.score) < 1e-4 for i, hits in zip(checked, expected)
               for item, h in zip(result[i], hits))
    # What Search-R1's client renders from the body (its _passages2string) is what the policy is trained on.
    row = result[124]
    rendered = "".join(f"Doc {i + 1}(Title: {d['document']['contents'].split(chr(10))[0]}) "
                       f"{chr(10).join(d['document']['contents'].split(chr(10))[1:])}\n" for i, d in enumerate(row))
    assert rendered == format_passages(expected[31])
    assert parse_contents(row[0]["document"]["contents"])[0] == expected[31][0].title
    limit = ServerLimits().max_batch_queries
    assert sum(len(c) for c in index.calls) == 4096 and max(len(c) for c in index.calls) <= limit
    assert len(index.calls) >= 4096 // limit
    assert health["max_queries"] >= 4096 and health["queries"] == 4096
    print(f"4,096-query Search-R1 request over BM25 ({len(corpus)} passages): {elapsed:.2f}s")


@pytest.fixture(scope="module")
def faulty_server(bm25_default):
    index = FaultyIndex(bm25_default)
    server = serve_in_thread(index, limits=ServerLimits(max_body_bytes=64 << 10, shutdown_timeout_s=2.0))
    yield server, index
    index.gate.set()
    server.stop()


def test_a_bad_batch_fails_only_its_own_request(faulty_server, bm25_default):
    server, index = faulty_server
    index.gate.clear()
    index.entered.clear()
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        first = pool.submit(_post, server.url, ["a river in europe"])
        _wait_until(index.entered.is_set, "the first search to start")
        # While the worker is held, four requests queue up and are collected into one batch.
        queued = {name: pool.submit(_post, server.url, [query]) for name, query in
                  [("good", "music of the baroque"), ("raises", "POISON pill"), ("short", "SHORT answer"),
                   ("extra", "EXTRA hits")]}
        batcher = server.app.state.batcher
        _wait_until(lambda: batcher.queue.qsize() == 4, "four queued requests")
        calls_before = len(index.calls)
        index.gate.set()
        responses = {name: f.result() for name, f in queued.items()}
        assert first.result().status_code == 200
    assert len(index.calls[calls_before]) == 4        # they were searched together first
    good = responses["good"]
    assert good.status_code == 200
    assert [d["document"]["id"] for d in good.json()["result"][0]] == \
        [h.id for h in bm25_default.search(["music of the baroque"], 3)[0]]
    assert responses["raises"].status_code == 500 and "ValueError: poisoned query" in responses["raises"].json()["detail"]
    assert responses["short"].status_code == 500
    assert "returned 0 result lists for 1 queries" in responses["short"].json()["detail"]
    assert responses["extra"].status_code == 500                    # the result count is checked server-side
    assert "returned 4 results for query 0" in responses["extra"].json()["detail"]
    # The batcher is still serving, and says so.
    after = _post(server.url, ["a city in asia"])
    assert after.status_code == 200 and len(after.json()["result"][0]) == 3
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 200 and health.json()["worker"] == "alive"
    assert health.json()["failed_batches"] >= 4


def test_body_limit_holds_for_chunked_bodies(faulty_server):
    server, _ = faulty_server

    def chunks(queries):       # a valid body of short queries: its size is the only limit it breaks
        yield b'{"queries": ['
        for _ in range(queries):
            yield b'"' + b"river " * 16 + b'",'
        yield b'"end"], "topk": 1}'
    big = httpx.post(f"{server.url}/retrieve", content=chunks(800), headers={"content-type": "application/json"})
    assert "content-length" not in big.request.headers and big.request.headers["transfer-encoding"] == "chunked"
    assert big.status_code == 413 and "exceeds 65536" in big.json()["detail"]
    declared = httpx.post(f"{server.url}/retrieve", content=b"x" * (65 << 10), headers={"content-type": "application/json"})
    assert declared.status_code == 413
    # A chunked body under the limit is read whole and served.
    small = httpx.post(f"{server.url}/retrieve", content=iter([b'{"queries": ["a river', b' in europe"], "topk": 2}']),
                       headers={"content-type": "application/json"})
    assert small.status_code == 200 and len(small.json()["result"][0]) == 2


def test_requests_whose_client_left_are_not_searched(faulty_server):
    server, index = faulty_server
    batcher = server.app.state.batcher
    index.gate.clear()
    index.entered.clear()
    abandoned = batcher.stats["abandoned_requests"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(_post, server.url, ["mountains of the alps"])
        _wait_until(index.entered.is_set, "the first search to start")
        with pytest.raises(httpx.ReadTimeout):          # this client gives up and closes its connection
            _post(server.url, ["LEFT before searching"], timeout=0.5)
        _wait_until(lambda: batcher.stats["abandoned_requests"] == abandoned + 1, "the server to see the client go")
        index.gate.set()
        assert first.result().status_code == 200
    assert _post(server.url, ["a famous painter"]).status_code == 200    # searched after the left one was dropped
    assert not any("LEFT before searching" in q for call in index.calls for q in call)
    assert batcher.stats["skipped_queries"] >= 1


def test_dead_worker_is_reported_and_requests_fail_fast(bm25_default):
    index = FaultyIndex(bm25_default)
    server = serve_in_thread(index, limits=ServerLimits(shutdown_timeout_s=2.0))
    try:
        index.gate.clear()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            fatal = pool.submit(_post, server.url, ["FATAL query"])
            _wait_until(index.entered.is_set, "the fatal search to start")
            waiting = pool.submit(_post, server.url, ["an innocent query"])
            _wait_until(lambda: server.app.state.batcher.queue.qsize() == 1, "a queued request")
            index.gate.set()
            assert fatal.result().status_code == 503
            assert waiting.result().status_code == 503           # failed, not left hanging
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "dead"
        assert "_Fatal: index process lost" in health.json()["worker"]
        start = time.monotonic()
        later = _post(server.url, ["anything"], timeout=10)
        assert later.status_code == 503 and time.monotonic() - start < 2.0
    finally:
        index.gate.set()
        server.stop()


def test_shutdown_finishes_within_its_timeout(bm25_default):
    index = FaultyIndex(bm25_default)
    server = serve_in_thread(index, limits=ServerLimits(shutdown_timeout_s=1.0))
    index.gate.clear()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(_post, server.url, ["a search that never ends"], timeout=30)
            _wait_until(index.entered.is_set, "the stuck search to start")
            start = time.monotonic()
            server.stop(timeout_s=10)
            elapsed = time.monotonic() - start
            assert not server.thread.is_alive() and elapsed < 4.0, elapsed
            try:                                  # the stuck client gets an error answer or a closed connection
                assert stuck.result().status_code >= 500
            except httpx.TransportError:
                pass
    finally:
        index.gate.set()
