"""The /retrieve request of the retrieval server (retrieval/server.py): its body, its limits, the checks that
turn a bad request into a 4xx answer, and the answer's layout.

Request (Search-R1's retrieval_server.py):  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
Response with scores:                       {"result": [[{"document": {"id": ..., "contents": ...}, "score": s}, ...], ...]}
Response without scores:                    {"result": [[{"id": ..., "contents": ...}, ...], ...]}

`topk` defaults to `ServerLimits.default_topk`, `return_scores` to false, as in Search-R1. A body that is not
that shape gets 422 (`RetrieveRequest`, strict types); more queries than `max_queries` gets 413 with
{"detail", "max_queries"} (our client splits its calls by it); a query longer than `max_query_chars` gets
413; topk outside [1, max_topk] gets 422 (`check_request`); a body over `max_body_bytes` gets 413, counted
as the body arrives, so a chunked body without Content-Length is held to the same limit (`BodyLimit`).
"""


import dataclasses
import json

from pydantic import BaseModel, StrictBool, StrictInt, StrictStr

from retrieval.corpus import Hit


class RetrieveRequest(BaseModel):
    """Search-R1's request body; strict types, so "3" is not a topk and 7 is not a query."""

    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: StrictBool = False


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """Request limits (violations get 4xx), batching knobs and the shutdown deadline."""

    max_queries: int = 8192           # queries per request: >= the papers' whole-turn batches (2,560; 4,096)
    max_topk: int = 100
    max_query_chars: int = 4096
    max_body_bytes: int = 16 << 20    # 8,192 queries of ~2,000 characters
    default_topk: int = 3             # when the request omits topk (Search-R1's config.retrieval_topk)
    max_batch_queries: int = 1024     # queries per index.search call; larger requests are searched in pieces
    batch_window_ms: float = 2.0      # how long the batcher waits for more requests after the first
    shutdown_timeout_s: float = 5.0   # requests still running after this long at shutdown are cancelled

    def __post_init__(self):
        for name in ("max_queries", "max_topk", "max_query_chars", "max_body_bytes", "default_topk",
                     "max_batch_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError(f"ServerLimits.default_topk={self.default_topk} is outside [1, max_topk={self.max_topk}]")


class RequestRejected(Exception):
    """A request the limits refuse: the HTTP status and the JSON body to answer with."""

    def __init__(self, status: int, content: dict):
        super().__init__(content["detail"])
        self.status, self.content = status, content


def check_request(body: RetrieveRequest, limits: ServerLimits) -> int:
    """The request's topk (the default when it names none); RequestRejected when it breaks a limit."""
    topk = limits.default_topk if body.topk is None else body.topk
    if not 1 <= topk <= limits.max_topk:
        raise RequestRejected(422, {"detail": f"topk must be in [1, {limits.max_topk}], got {topk}"})
    if len(body.queries) > limits.max_queries:
        raise RequestRejected(413, {"detail": f"{len(body.queries)} queries exceed the limit of {limits.max_queries}",
                                    "max_queries": limits.max_queries})
    too_long = [i for i, q in enumerate(body.queries) if len(q) > limits.max_query_chars]
    if too_long:
        raise RequestRejected(413, {"detail": f"queries {too_long[:5]} exceed {limits.max_query_chars} characters"})
    return topk


class BodyLimit:
    """ASGI middleware: 413 for a body over `max_bytes`, whether announced by Content-Length or counted as it
    streams in (chunked transfer encoding has no Content-Length). The body is read here and replayed to the app,
    so the app never holds more than the limit; later receive() calls pass through (disconnect detection)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def _reject(self, send, size: str) -> None:
        body = json.dumps({"detail": f"body of {size} bytes exceeds {self.max_bytes}"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._reject(send, length.decode())
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return                    # the client left before sending its body: nothing to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._reject(send, f"more than {size}")
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def _document(hit: Hit) -> dict:
    return {"id": hit.id, "contents": hit.contents}


def response_content(results: list[list[Hit]], return_scores: bool) -> dict:
    """The answer's JSON body (module docstring): documents with or without their scores."""
    if return_scores:
        return {"result": [[{"document": _document(h), "score": h.score} for h in hits] for hits in results]}
    return {"result": [[_document(h) for h in hits] for hits in results]}
