"""The /retrieve server on an ephemeral loopback port, and the in-process / HTTP clients."""

import concurrent.futures
import socket
import threading

import httpx
import numpy as np
import pytest

from retrieval.client import (HttpRetriever, InProcessRetriever, Retriever, RetrieverRequestError,
                              RetrieverUnavailableError)
from retrieval.server import ServerLimits, serve_in_thread


class CountingIndex:
    """Wraps an index and records the size of every search call (to see requests being batched)."""

    def __init__(self, index):
        self.index, self.calls, self.lock = index, [], threading.Lock()
        self.size, self.warmed = index.size, False

    def warmup(self):
        self.index.warmup()
        self.warmed = True

    def search(self, queries, topk):
        with self.lock:
            self.calls.append(len(queries))
        return self.index.search(queries, topk)


@pytest.fixture(scope="module")
def server_index(dense_sample, minilm):
    """A flat dense index over the first 256 passages of the dense sample: these tests check what the server does
    with requests (shapes, batching, agreement with the in-process search), which needs a real encoder and
    index but not the recall tests' 2,066 passages (their session index is encoded in whichever pytest worker
    runs tests/retrieval/test_retrieval_dense.py, often not this one)."""
    from retrieval.index import DenseIndex, DenseIndexConfig
    return DenseIndex.build(dense_sample[:256], minilm, DenseIndexConfig(kind="flat"))


@pytest.fixture(scope="module")
def dense_server(server_index):
    counting = CountingIndex(server_index)
    server = serve_in_thread(counting, limits=ServerLimits(max_queries=8, max_topk=20, max_query_chars=200,
                                                           max_body_bytes=64 << 10))
    yield server, counting
    server.stop()
    assert not server.thread.is_alive()


def test_search_r1_request_and_response_shapes(dense_server, server_index):
    server, counting = dense_server
    assert server.url.startswith("http://127.0.0.1:") and counting.warmed   # warmed up before serving
    queries = ["What is the capital of China?", "Who founded Microsoft?"]
    body = httpx.post(f"{server.url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}).json()
    expected = server_index.search(queries, 3)
    assert list(body) == ["result"] and len(body["result"]) == 2
    for row, hits in zip(body["result"], expected):
        assert [set(item) for item in row] == [{"document", "score"}] * 3
        assert [item["document"] for item in row] == [{"id": h.id, "contents": h.contents} for h in hits]
        assert [item["score"] for item in row] == pytest.approx([h.score for h in hits], abs=1e-5)
    # Search-R1 defaults: return_scores false -> bare documents; topk omitted -> the server's default (3).
    bare = httpx.post(f"{server.url}/retrieve", json={"queries": queries[:1]}).json()
    assert bare == {"result": [[{"id": h.id, "contents": h.contents} for h in expected[0]]]}


@pytest.mark.parametrize("body,status", [
    (b"not json at all", 422),
    (b'{"queries": "a single string"}', 422),
    (b'{"topk": 3}', 422),
    (b'{"queries": [1, 2]}', 422),
    (b'{"queries": ["q"], "topk": 0}', 422),
    (b'{"queries": ["q"], "topk": 1000}', 422),
    (b'{"queries": ["q"], "topk": "3"}', 422),
    (b'{"queries": ["q", "q", "q", "q", "q", "q", "q", "q", "q"]}', 413),
    (b'{"queries": ["' + b"x" * 201 + b'"]}', 413),
    (b'{"queries": ["' + b"x" * (70 << 10) + b'"]}', 413),
    (b"[]", 422),
])
def test_malformed_bodies_get_4xx_and_server_keeps_serving(dense_server, body, status):
    server, _ = dense_server
    response = httpx.post(f"{server.url}/retrieve", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    ok = httpx.post(f"{server.url}/retrieve", json={"queries": ["river"], "topk": 1})
    assert ok.status_code == 200 and len(ok.json()["result"][0]) == 1


def test_32_concurrent_clients_are_batched(dense_server, server_index):
    server, counting = dense_server
    words = ["capital", "river", "painter", "war", "mountain", "physicist", "composer", "empire"]
    expected = {w: [h.id for h in hits] for w, hits in zip(words, server_index.search(words, 2))}
    calls_before = len(counting.calls)

    def client(c):
        with httpx.Client(timeout=60) as http:
            out = []
            for r in range(20):
                word = words[(c + r) % len(words)]
                response = http.post(f"{server.url}/retrieve", json={"queries": [word], "topk": 2})
                response.raise_for_status()
                out.append((word, [d["id"] for d in response.json()["result"][0]]))
            return out

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = [r for rs in pool.map(client, range(32)) for r in rs]
    assert len(results) == 640
    assert all(ids == expected[word] for word, ids in results)
    calls = counting.calls[calls_before:]
    assert sum(calls) == 640
    assert len(calls) < 640 and max(calls) > 1, calls    # several requests shared one encoder call


def test_http_and_in_process_retrievers_agree(dense_server, server_index):
    server, _ = dense_server
    queries = ["first president of the united states", "largest planet"]
    with HttpRetriever(server.url, timeout_s=30) as remote:
        local = InProcessRetriever(server_index)
        assert isinstance(remote, Retriever) and isinstance(local, Retriever)
        got, want = remote.search(queries, 3), local.search(queries, 3)
        assert [[(h.id, h.title, h.text) for h in r] for r in got] == [[(h.id, h.title, h.text) for h in r] for r in want]
        np.testing.assert_allclose([[h.score for h in r] for r in got], [[h.score for h in r] for r in want],
                                   atol=1e-5)
        # 9 queries exceed this server's limit of 8: the client learns the limit from /health and splits.
        requests_before = server.app.state.batcher.stats["requests"]
        many = ["river", "painter", "war", "mountain", "physicist", "composer", "empire", "capital", "ocean"]
        assert [[h.id for h in r] for r in remote.search(many, 2)] == \
            [[h.id for h in r] for r in local.search(many, 2)]
        assert server.app.state.batcher.stats["requests"] - requests_before == 2
        with pytest.raises(RetrieverRequestError, match="HTTP 413"):     # a query over 200 characters
            remote.search(["q" * 201], 3)
        with pytest.raises(TypeError, match="list of queries"):
            remote.search("a single string", 3)


def test_unreachable_server_raises_clear_error():
    with socket.socket() as s:            # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with HttpRetriever(f"http://127.0.0.1:{port}", timeout_s=2, retries=2, backoff_s=0.01) as client:
        with pytest.raises(RetrieverUnavailableError,
                           match=rf"127\.0\.0\.1:{port}/retrieve unreachable after 3 attempts"):
            client.search(["anything"], 3)


def test_serve_retriever_entry_point(tmp_path, corpus):
    """launch/serve_retriever.py end to end on an index directory (a subprocess on a free loopback port)."""
    import pathlib
    import subprocess
    import sys
    import time
    from retrieval.bm25 import BM25Index
    from retrieval.index import save_index
    index = BM25Index.build(corpus[:200])
    directory = save_index(index, tmp_path / "bm25")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "launch.serve_retriever", f"--index={directory}", f"--port={port}"],
                              cwd=pathlib.Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["passages"] == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve_retriever did not start within 120 s"
            time.sleep(0.2)
        queries = ["music of the baroque", "a river in europe"]
        with HttpRetriever(f"http://127.0.0.1:{port}") as client:
            assert client.search(queries, 3) == index.search(queries, 3)
    finally:
        server.terminate()
        server.wait(30)
