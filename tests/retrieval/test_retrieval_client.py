"""HttpRetriever splits a turn at the server's query limit and sends the pieces concurrently, in order; the
start-up probe fails with one clear line. Against the real server over the default BM25 index, and a
scripted loopback server for what ours never does (no /health, 401, a 413 that names the limit)."""

import socket
import time

import httpx
import pytest

from retrieval.client import HttpRetriever, RetrieverProbeError, RetrieverRequestError, probe
from retrieval.server import ServerLimits, serve_in_thread
from scripted_http import Reply, serve_script


class _WaitForCompanyIndex:
    """Wraps an index; its first search waits (at most 10 s) until another request is queued behind it, which
    happens only if the client has several requests in flight at once (each batch holds one request here)."""

    def __init__(self, index):
        self.index, self.size = index, index.size
        self.batcher, self.saw_company = None, None

    def search(self, queries, topk):
        if self.saw_company is None:
            deadline = time.monotonic() + 10
            while self.batcher.queue.qsize() < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            self.saw_company = self.batcher.queue.qsize() >= 1
        return self.index.search(queries, topk)


@pytest.fixture(scope="module")
def bm25_default():
    from retrieval import default_index
    return default_index("bm25")


@pytest.fixture(scope="module")
def small_limit_server(bm25_default):
    index = _WaitForCompanyIndex(bm25_default)
    server = serve_in_thread(index, limits=ServerLimits(max_queries=100, max_batch_queries=100))
    index.batcher = server.app.state.batcher
    yield server, index
    server.stop()


def test_client_splits_at_the_servers_limit_in_order(small_limit_server, bm25_default, corpus):
    server, index = small_limit_server
    queries = [f"{corpus[(11 * i) % len(corpus)].title}" for i in range(730)]
    stats = server.app.state.batcher.stats
    before = dict(stats)
    with HttpRetriever(server.url, max_concurrency=4) as client:
        assert client.query_limit == 100                            # learned from /health
        got = client.search(queries, 3)
    assert [[h.id for h in hits] for hits in got] == [[h.id for h in hits] for hits in bm25_default.search(queries, 3)]
    assert stats["requests"] - before["requests"] == 8              # ceil(730 / 100) requests
    assert stats["queries"] - before["queries"] == 730
    assert index.saw_company                                        # requests were in flight concurrently


def test_client_learns_the_limit_from_a_413_and_keeps_order():
    """A server without /health whose 413 names its limit (2): the 5-query call is re-sent as 2 + 2 + 1."""
    def answer(body):
        queries = body["queries"]
        if len(queries) > 2:
            return Reply(413, body={"detail": "too many", "max_queries": 2})
        return Reply(200, body={"result": [[{"document": {"id": q, "contents": f'"{q}"\ntext of {q}'}, "score": 1.0}]
                                           for q in queries]})
    with serve_script({"/retrieve": [answer] * 4}) as srv, HttpRetriever(srv.url, max_concurrency=3) as client:
        hits = client.search(["a", "b", "c", "d", "e"], 1)
        sizes = sorted(len(body["queries"]) for _, _, body in srv.seen("/retrieve"))
        assert client.query_limit == 2
    assert [h[0].id for h in hits] == ["a", "b", "c", "d", "e"] and hits[2][0].text == "text of c"
    assert sizes == [1, 2, 2, 5]


def test_a_413_without_a_limit_is_a_request_error():
    with serve_script({"/retrieve": [Reply(413, body={"detail": "query too long"})]}) as srv, \
            HttpRetriever(srv.url) as client:
        with pytest.raises(RetrieverRequestError, match="HTTP 413: .*query too long"):
            client.search(["x" * 10], 3)


def test_probe_reports_the_server(small_limit_server):
    server, _ = small_limit_server
    result = probe(server.url)
    assert result.endpoint == f"{server.url}/retrieve" and result.max_queries == 100 and result.passages == 10033
    assert probe(f"{server.url}/retrieve/").endpoint == f"{server.url}/retrieve"


def test_probe_fails_with_one_clear_line(small_limit_server):
    server, _ = small_limit_server
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    cases = [(dead, "unreachable after 2 attempts"),
             (f"{server.url}/v1", "answered HTTP 404 (no /retrieve endpoint at that path")]
    for url, expected in cases:
        with pytest.raises(RetrieverProbeError) as info:
            probe(url, attempts=2, backoff_s=0.01, timeout_s=5)
        assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)
    with serve_script({"/retrieve": [Reply(401, body={"detail": "missing key"})]}) as srv:
        with pytest.raises(RetrieverProbeError, match=r"answered HTTP 401 \(unauthorised"):
            probe(srv.url, attempts=2, backoff_s=0.01)
        assert len(srv.seen("/retrieve")) == 1                     # a 401 is not retried
    with serve_script({"/retrieve": [Reply(200, body={"results": []})]}) as srv:   # some other service
        with pytest.raises(RetrieverProbeError, match="not with a Search-R1 /retrieve response"):
            probe(srv.url)
    # Search-R1's own server has no /health: the probe passes and reports no limit.
    doc = {"document": {"id": "0", "contents": '"T"\nx'}, "score": 0.5}
    with serve_script({"/retrieve": [Reply(200, body={"result": [[doc]]})]}) as srv:
        result = probe(srv.url)
    assert result.max_queries is None and result.passages is None


def test_health_endpoint_states_limits(small_limit_server):
    server, _ = small_limit_server
    health = httpx.get(f"{server.url}/health").json()
    assert health["max_queries"] == 100 and health["max_batch_queries"] == 100 and health["worker"] == "alive"
