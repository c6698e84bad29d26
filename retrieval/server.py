"""A Search-R1-compatible retrieval server: FastAPI, POST /retrieve, concurrent requests batched.

Request (Search-R1's retrieval_server.py):  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
Response with scores:                       {"result": [[{"document": {"id": ..., "contents": ...}, "score": s}, ...], ...]}
Response without scores:                    {"result": [[{"id": ..., "contents": ...}, ...], ...]}

`topk` defaults to `ServerLimits.default_topk`, `return_scores` to false, as in Search-R1. Requests
are validated: a body that is not that shape gets 422; more queries than `max_queries`, a query
longer than `max_query_chars` or a body over `max_body_bytes` gets 413; topk outside
[1, max_topk] gets 422. A bad request never stops the server.

Batching: every request is put on an asyncio queue; one batcher task takes everything waiting
(after at most `batch_window_ms` for stragglers, up to `max_batch_queries` queries), runs a single
`index.search(all_queries, max topk)` in a worker thread, and hands each request its slice trimmed
to its own topk. So 32 concurrent clients cost a few encoder calls, not 32, and the event loop keeps
accepting requests while a batch runs. (With exact Flat search a slice of a top-K list equals the
top-k; approximate indexes searched with a larger K can only return better candidates.)

    python -m launch.serve_retriever --index=bm25 --port=8000     # or --index=dense, or an index directory
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time

from pydantic import BaseModel, StrictBool, StrictInt, StrictStr

from retrieval.corpus import Hit


class RetrieveRequest(BaseModel):
    """Search-R1's request body; strict types, so "3" is not a topk and 7 is not a query."""

    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: StrictBool = False


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """Request limits (violations get 4xx) and batching knobs."""

    max_queries: int = 512            # queries per request
    max_topk: int = 100
    max_query_chars: int = 4096
    max_body_bytes: int = 4 << 20
    default_topk: int = 3             # when the request omits topk (Search-R1's config.retrieval_topk)
    max_batch_queries: int = 1024     # queries per index.search call
    batch_window_ms: float = 2.0      # how long the batcher waits for more requests after the first


@dataclasses.dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future


class MicroBatcher:
    """Collects concurrent search requests into single index.search calls (run in one worker thread)."""

    def __init__(self, index, limits: ServerLimits):
        self.index, self.limits = index, limits
        self.queue: asyncio.Queue[_Pending] | None = None
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="retrieve")
        self.stats = {"requests": 0, "queries": 0, "batches": 0, "max_batch_requests": 0}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self.queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.executor.shutdown(wait=False)

    async def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Pending(queries, topk, future))
        return await future

    async def _collect(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        batch = [await self.queue.get()]
        size = len(batch[0].queries)
        deadline = loop.time() + self.limits.batch_window_ms / 1000.0
        while size < self.limits.max_batch_queries:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            batch.append(item)
            size += len(item.queries)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            queries = [q for item in batch for q in item.queries]
            topk = max(item.topk for item in batch)
            try:
                results = await loop.run_in_executor(self.executor, self.index.search, queries, topk)
            except Exception as e:  # noqa: BLE001 - every waiting request gets the error as a 500
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(e)
                continue
            self.stats["requests"] += len(batch)
            self.stats["queries"] += len(queries)
            self.stats["batches"] += 1
            self.stats["max_batch_requests"] = max(self.stats["max_batch_requests"], len(batch))
            start = 0
            for item in batch:
                part = results[start:start + len(item.queries)]
                start += len(item.queries)
                if not item.future.done():
                    item.future.set_result([hits[:item.topk] for hits in part])


def _document(hit: Hit) -> dict:
    return {"id": hit.id, "contents": hit.contents}


def create_app(index, limits: ServerLimits = ServerLimits(), *, warmup: bool = True):
    """The FastAPI app serving `index` (anything with .search(queries, topk) -> list[list[Hit]]).
    With warmup, `index.warmup()` (when it has one) runs at startup, before requests are accepted."""
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse

    batcher = MicroBatcher(index, limits)

    async def lifespan(app):
        if warmup and hasattr(index, "warmup"):   # compile query shapes before the first request arrives
            await asyncio.get_running_loop().run_in_executor(batcher.executor, index.warmup)
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="searchjax retriever", lifespan=lifespan)
    app.state.batcher = batcher

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            return JSONResponse({"detail": f"body of {length} bytes exceeds {limits.max_body_bytes}"}, status_code=413)
        return await call_next(request)

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest):
        topk = limits.default_topk if request.topk is None else request.topk
        if not 1 <= topk <= limits.max_topk:
            raise HTTPException(422, f"topk must be in [1, {limits.max_topk}], got {topk}")
        if len(request.queries) > limits.max_queries:
            raise HTTPException(413, f"{len(request.queries)} queries exceed the limit of {limits.max_queries}")
        too_long = [i for i, q in enumerate(request.queries) if len(q) > limits.max_query_chars]
        if too_long:
            raise HTTPException(413, f"queries {too_long[:5]} exceed {limits.max_query_chars} characters")
        if not request.queries:
            return {"result": []}
        results = await batcher.search(list(request.queries), topk)
        if request.return_scores:
            return {"result": [[{"document": _document(h), "score": h.score} for h in hits] for hits in results]}
        return {"result": [[_document(h) for h in hits] for hits in results]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "passages": getattr(index, "size", None), **batcher.stats}

    return app


@dataclasses.dataclass
class RunningServer:
    """A uvicorn server running in a background thread (tests, notebooks, the rollout's local retriever)."""

    server: object                    # uvicorn.Server
    thread: threading.Thread
    url: str                          # http://host:port
    app: object                       # the FastAPI app; app.state.batcher.stats counts requests and batches

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def serve_in_thread(index, *, host: str = "127.0.0.1", port: int = 0, limits: ServerLimits = ServerLimits(),
                    warmup: bool = True, startup_timeout_s: float = 600.0) -> RunningServer:
    """Start the app on host:port (port 0 = an ephemeral port) in a daemon thread; returns once it accepts."""
    import uvicorn
    app = create_app(index, limits, warmup=warmup)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", timeout_keep_alive=30)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="retrieval-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"retrieval server did not start on {host}:{port}")
        time.sleep(0.01)
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(server, thread, f"http://{host}:{bound_port}", app)


def run_server(index, *, host: str = "127.0.0.1", port: int = 8000, limits: ServerLimits = ServerLimits(),
               warmup: bool = True) -> None:
    """Serve in the foreground until interrupted (launch/serve_retriever.py)."""
    import uvicorn
    uvicorn.run(create_app(index, limits, warmup=warmup), host=host, port=port, log_level="info")

