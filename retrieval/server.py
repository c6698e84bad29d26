"""A Search-R1-compatible retrieval server: FastAPI, POST /retrieve, concurrent requests batched.

The request and its answer are Search-R1's (retrieval/server_requests.py: the body, the limits, 422 / 413 for
a request that breaks them). Search-R1's client (`search_r1/llm_agent/generation.py`, `_batch_search`) posts
a whole turn at once: 512 prompts x 5 samples = 2,560 queries, and 512 x 8 = 4,096 for EviBack. The query
limit (`max_queries`, default 8,192) therefore admits those batches; it guards memory (the response holds
topk passages per query), not the protocol. A bad request never stops the server.

Batching: a request is cut into pieces of at most `max_batch_queries` queries and every piece is put on an
asyncio queue; one batcher task takes what is waiting (after at most `batch_window_ms` for stragglers, up to
`max_batch_queries` queries), runs a single `index.search(all_queries, max topk)` in the worker thread, and
hands each piece its slice trimmed to its own topk. So 32 concurrent clients cost a few encoder calls, not
32; a 4,096-query request is searched in bounded pieces; and the event loop keeps accepting requests while
a batch runs. (With exact Flat search a slice of a top-K list equals the top-k; approximate indexes searched
with a larger K can only return better candidates.)

Faults:
* The index's answer is checked (one hit list per query, at most topk Hits each, finite scores). A search
  that raises or answers wrongly fails only its own batch; a batch of several requests is then searched
  request by request, so the request that broke it gets a 500 naming the error and the others their
  results. The batcher keeps serving.
* If the worker itself dies (a BaseException such as SystemExit out of the index, or a bug in the batcher),
  /health answers 503 with `"worker": "dead: <reason>"`, and every waiting and later /retrieve gets a 503
  at once instead of hanging.
* A request whose client disconnects while it waits is dropped: its queued pieces are never searched.
* Shutdown (`RunningServer.stop`, SIGINT/SIGTERM under `run_server`) waits at most `shutdown_timeout_s`
  for requests in flight, then cancels them; a search stuck in the index cannot hold the process
  (the worker is a daemon thread).

    python -m launch.serve_retriever --index=bm25 --port=8000     # or --index=dense, or an index directory
"""


import asyncio
import dataclasses
import math
import queue
import threading
import time

from retrieval.corpus import Hit
# ServerLimits is imported from here by the launcher and the tests, as before the request part moved out.
from retrieval.server_requests import (BodyLimit, RequestRejected, RetrieveRequest, ServerLimits, check_request,
                                       response_content)


class SearchFailed(Exception):
    """The index raised or answered wrongly for this request's batch (HTTP 500)."""


class WorkerDead(Exception):
    """The search worker died or the server is shutting down (HTTP 503)."""


@dataclasses.dataclass
class _Piece:
    queries: list[str]
    topk: int
    future: asyncio.Future


class _Worker:
    """One daemon thread that runs index calls in order (the encoder runs one batch at a time). Daemon, so a
    search stuck in the index never blocks interpreter exit. A BaseException that is not an Exception out of
    a call ends the thread: the worker is then dead, as that exception asks."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="retrieve-worker", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, loop, future = job
            try:
                result, error = fn(*args), None
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                result, error = None, e
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:      # the event loop is closed: nobody is waiting any more
                return
            if error is not None and not isinstance(error, Exception):
                return

    def run(self, fn, *args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self.thread.is_alive():
            future.set_exception(WorkerDead("the search worker thread has exited"))
        else:
            self._jobs.put((fn, args, loop, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    elif isinstance(error, (KeyboardInterrupt, SystemExit)):   # asyncio re-raises these out of the loop
        future.set_exception(WorkerDead(f"{type(error).__name__}: {error}"))
    else:
        future.set_exception(error)


def check_results(results, queries: list[str], topk: int) -> None:
    """Raise SearchFailed unless `results` is one list of at most topk Hits with finite scores per query."""
    if not isinstance(results, (list, tuple)) or len(results) != len(queries):
        got = len(results) if isinstance(results, (list, tuple)) else type(results).__name__
        raise SearchFailed(f"the index returned {got} result lists for {len(queries)} queries")
    for i, row in enumerate(results):
        if not isinstance(row, (list, tuple)) or len(row) > topk:
            raise SearchFailed(f"the index returned {len(row) if isinstance(row, (list, tuple)) else type(row).__name__}"
                               f" results for query {i} ({queries[i][:60]!r}); topk is {topk}")
        for hit in row:
            if not isinstance(hit, Hit) or not math.isfinite(hit.score):
                raise SearchFailed(f"the index returned {hit!r:.120} for query {i} ({queries[i][:60]!r}): "
                                   "not a Hit with a finite score")


class MicroBatcher:
    """Collects pieces of concurrent requests into single index.search calls (see the module docstring)."""

    def __init__(self, index, limits: ServerLimits):
        self.index, self.limits = index, limits
        self.queue: asyncio.Queue[_Piece] | None = None
        self.worker = _Worker()
        self.stats = {"requests": 0, "queries": 0, "batches": 0, "max_batch_requests": 0, "failed_batches": 0,
                      "abandoned_requests": 0, "skipped_queries": 0}
        self.dead: str | None = None          # why the worker died, once it has
        self._task: asyncio.Task | None = None
        self._carry: _Piece | None = None     # a piece that did not fit the previous batch

    def start(self) -> None:
        self.queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._on_exit)

    def _on_exit(self, task: asyncio.Task) -> None:
        if self.dead is None:
            error = None if task.cancelled() else task.exception()
            self.dead = "stopped" if error is None else f"{type(error).__name__}: {error}"
        self._fail_waiting(WorkerDead(f"the search worker is dead ({self.dead})"))

    def _fail_waiting(self, error: Exception) -> None:
        pieces = [self._carry] if self._carry is not None else []
        self._carry = None
        while self.queue is not None and not self.queue.empty():
            pieces.append(self.queue.get_nowait())
        for piece in pieces:
            if not piece.future.done():
                piece.future.set_exception(error)

    @property
    def alive(self) -> bool:
        return self.dead is None and self._task is not None and not self._task.done() and self.worker.thread.is_alive()

    async def stop(self) -> None:
        self.dead = self.dead or "server shutting down"
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: BLE001 - cancelled or already dead: either way it is stopped
                pass
        self._fail_waiting(WorkerDead("the server is shutting down"))
        self.worker.close()

    async def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Hits for `queries`; cancelling this (the client left) drops the pieces not yet searched."""
        if not self.alive:
            raise WorkerDead(f"the search worker is dead ({self.dead or 'not started'})")
        loop = asyncio.get_running_loop()
        step = self.limits.max_batch_queries
        pieces = [_Piece(queries[i:i + step], topk, loop.create_future()) for i in range(0, len(queries), step)]
        for piece in pieces:
            self.queue.put_nowait(piece)
        try:
            parts = await asyncio.gather(*(p.future for p in pieces))
        except BaseException:
            for piece in pieces:          # a failed sibling or a gone client: the rest need not be searched
                piece.future.cancel()
            raise
        self.stats["requests"] += 1
        self.stats["queries"] += len(queries)
        return [hits for part in parts for hits in part]

    async def _next_piece(self, timeout: float | None) -> _Piece | None:
        """The next piece whose request still waits (pieces of gone clients are skipped and counted)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._carry is not None:
                piece, self._carry = self._carry, None
            elif deadline is None:
                piece = await self.queue.get()
            else:
                try:
                    piece = self.queue.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        return None
                    try:
                        piece = await asyncio.wait_for(self.queue.get(), remaining)
                    except asyncio.TimeoutError:
                        return None
            if not piece.future.done():
                return piece
            self.stats["skipped_queries"] += len(piece.queries)

    async def _collect(self) -> list[_Piece]:
        batch = [await self._next_piece(None)]
        size = len(batch[0].queries)
        window = self.limits.batch_window_ms / 1000.0
        start = asyncio.get_running_loop().time()
        while size < self.limits.max_batch_queries:
            piece = await self._next_piece(max(0.0, start + window - asyncio.get_running_loop().time()))
            if piece is None:
                break
            if size + len(piece.queries) > self.limits.max_batch_queries:
                self._carry = piece       # keeps every index call within max_batch_queries
                break
            batch.append(piece)
            size += len(piece.queries)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            try:
                await self._search_batch(batch)
            except WorkerDead as e:
                self.dead = str(e)
                for piece in batch:
                    if not piece.future.done():
                        piece.future.set_exception(WorkerDead(f"the search worker died: {e}"))
                return
            except Exception as e:  # noqa: BLE001 - a bug here must fail this batch, not the server
                self.stats["failed_batches"] += 1
                for piece in batch:
                    if not piece.future.done():
                        piece.future.set_exception(SearchFailed(f"{type(e).__name__}: {e}"))

    async def _search_batch(self, batch: list[_Piece]) -> None:
        live = [p for p in batch if not p.future.done()]   # a client may have left during the window
        self.stats["skipped_queries"] += sum(len(p.queries) for p in batch if p.future.done())
        if not live:
            return
        try:
            results = await self._search(live)
        except SearchFailed as e:
            self.stats["failed_batches"] += 1
            if len(live) == 1:
                live[0].future.set_exception(e)
                return
            for piece in live:                # isolate the request that broke the batch
                if piece.future.done():
                    continue
                try:
                    part = await self._search([piece])
                except SearchFailed as e:
                    self.stats["failed_batches"] += 1
                    piece.future.set_exception(e)
                else:
                    self._deliver([piece], part)
            return
        self._deliver(live, results)

    async def _search(self, pieces: list[_Piece]) -> list[list[Hit]]:
        queries = [q for p in pieces for q in p.queries]
        topk = max(p.topk for p in pieces)
        try:
            results = await self.worker.run(self.index.search, queries, topk)
        except (WorkerDead, asyncio.CancelledError):
            raise
        except Exception as e:  # noqa: BLE001 - the index's own failure: this batch gets a 500
            raise SearchFailed(f"{type(e).__name__}: {e}") from e
        except BaseException as e:  # noqa: BLE001 - it ended the worker thread
            raise WorkerDead(f"{type(e).__name__}: {e}") from e
        check_results(results, queries, topk)
        self.stats["batches"] += 1
        self.stats["max_batch_requests"] = max(self.stats["max_batch_requests"], len(pieces))
        return results

    @staticmethod
    def _deliver(pieces: list[_Piece], results: list[list[Hit]]) -> None:
        start = 0
        for piece in pieces:
            part = results[start:start + len(piece.queries)]
            start += len(piece.queries)
            if not piece.future.done():
                piece.future.set_result([list(hits[:piece.topk]) for hits in part])


async def _client_gone(request) -> None:
    """Return once the client has disconnected (the request body has already been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(index, limits: ServerLimits = ServerLimits(), *, warmup: bool = True):
    """The FastAPI app serving `index` (anything with .search(queries, topk) -> list[list[Hit]]).
    With warmup, `index.warmup()` (when it has one) runs at startup, before requests are accepted."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    batcher = MicroBatcher(index, limits)

    async def lifespan(app):
        if warmup and hasattr(index, "warmup"):   # compile query shapes before the first request arrives
            await batcher.worker.run(index.warmup)
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="searchjax retriever", lifespan=lifespan)
    app.state.batcher = batcher
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)

    @app.post("/retrieve")
    async def retrieve(body: RetrieveRequest, request: Request):
        try:
            topk = check_request(body, limits)
        except RequestRejected as e:
            return JSONResponse(e.content, status_code=e.status)
        if not body.queries:
            return JSONResponse({"result": []})
        search = asyncio.ensure_future(batcher.search(list(body.queries), topk))
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({search, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:    # uvicorn's shutdown deadline passed: answer instead of dying silently
            return JSONResponse({"detail": "the server is shutting down"}, status_code=503)
        finally:
            for task in (search, gone):   # also when this handler is cancelled (shutdown timeout)
                if not task.done():
                    task.cancel()
        if not search.done() or search.cancelled():
            batcher.stats["abandoned_requests"] += 1
            return Response(status_code=499)          # nobody is left to read it
        error = search.exception()
        if isinstance(error, SearchFailed):
            return JSONResponse({"detail": f"search failed: {error}"}, status_code=500)
        if isinstance(error, WorkerDead):
            return JSONResponse({"detail": str(error)}, status_code=503)
        if error is not None:
            raise error
        return JSONResponse(response_content(search.result(), body.return_scores))

    @app.get("/health")
    async def health():
        alive = batcher.alive
        body = {"status": "ok" if alive else "dead", "worker": "alive" if alive else f"dead: {batcher.dead}",
                "passages": getattr(index, "size", None), "max_queries": limits.max_queries,
                "max_topk": limits.max_topk, "max_batch_queries": limits.max_batch_queries, **batcher.stats}
        return JSONResponse(body, status_code=200 if alive else 503)

    return app


def _uvicorn_config(app, host: str, port: int, limits: ServerLimits, log_level: str):
    import uvicorn
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", timeout_keep_alive=30,
                          timeout_graceful_shutdown=limits.shutdown_timeout_s)


@dataclasses.dataclass
class RunningServer:
    """A uvicorn server running in a background thread (tests, notebooks, the rollout's local retriever)."""

    server: object                    # uvicorn.Server
    thread: threading.Thread
    url: str                          # http://host:port
    app: object                       # the FastAPI app; app.state.batcher.stats counts requests and batches

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving; raises TimeoutError if the server thread is still running after `timeout_s`."""
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(1.0)
            raise TimeoutError(f"retrieval server {self.url} did not stop within {timeout_s}s")


def serve_in_thread(index, *, host: str = "127.0.0.1", port: int = 0, limits: ServerLimits = ServerLimits(),
                    warmup: bool = True, startup_timeout_s: float = 600.0) -> RunningServer:
    """Start the app on host:port (port 0 = an ephemeral port) in a daemon thread; returns once it accepts."""
    import uvicorn
    app = create_app(index, limits, warmup=warmup)
    server = uvicorn.Server(_uvicorn_config(app, host, port, limits, "warning"))
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
    uvicorn.Server(_uvicorn_config(create_app(index, limits, warmup=warmup), host, port, limits, "info")).run()
