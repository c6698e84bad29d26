"""A scripted OpenAI-compatible chat server on loopback, for tests of the real HTTP judge path.

`serve_scripted(responder)` starts FastAPI + uvicorn on an ephemeral 127.0.0.1 port in a background
thread and returns a handle with `.base_url` (".../v1"), `.requests` (the raw request bodies received, in
arrival order) and `.headers` (their headers, lower-case names). `responder(body: dict) -> str |
ScriptedReply` decides each reply from the parsed request (messages, model, max_tokens, ...): a str is
the assistant message text; a `ScriptedReply` can also set an HTTP status (500, 429, ...), a delay (to
trigger client timeouts), or a raw body (not a chat completion). The responder runs on the server's
event loop, one request at a time: keep it quick and use `delay_s` for slowness.
Use it as a context manager; leaving the block stops the server.

    with serve_scripted(lambda body: '{"verdict": "Supported"}') as server:
        judge = OpenAICompatJudge(OpenAICompatConfig(base_url=server.base_url, model="m", api_key_env=""))

`dead_endpoint_url()` gives a loopback URL with nothing listening (connection refused), for failure tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
import time
from typing import Callable

import fastapi
import uvicorn
from fastapi import responses


@dataclasses.dataclass(frozen=True)
class ScriptedReply:
    """content: assistant text (None sends a choice without content); status != 200 sends an OpenAI-style error;
    delay_s: sleep before replying; raw_body: bytes sent verbatim with status 200 instead of a completion."""

    content: str | None = ""
    status: int = 200
    delay_s: float = 0.0
    raw_body: bytes | None = None


Responder = Callable[[dict], "str | ScriptedReply"]


def _completion_json(body: dict, content: str | None) -> dict:
    prompt_words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    completion_words = len((content or "").split())
    return {"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_words, "completion_tokens": completion_words,
                      "total_tokens": prompt_words + completion_words}}


def build_app(responder: Responder, requests: list[bytes], headers: list[dict], lock: threading.Lock) -> fastapi.FastAPI:
    app = fastapi.FastAPI()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: fastapi.Request):
        raw = await request.body()
        with lock:
            requests.append(raw)
            headers.append({k.lower(): v for k, v in request.headers.items()})
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            return responses.JSONResponse({"error": {"message": "request body is not JSON"}}, status_code=400)
        reply = responder(body)
        if isinstance(reply, str):
            reply = ScriptedReply(content=reply)
        if reply.delay_s > 0:
            await asyncio.sleep(reply.delay_s)
        if reply.raw_body is not None:
            return responses.Response(reply.raw_body, media_type="application/json")
        if reply.status != 200:
            return responses.JSONResponse({"error": {"message": f"scripted error {reply.status}",
                                                     "type": "server_error"}}, status_code=reply.status)
        return responses.JSONResponse(_completion_json(body, reply.content))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "scripted", "object": "model"}]}

    return app


class ScriptedServer:
    """A running scripted server (see the module docstring)."""

    def __init__(self, responder: Responder, host: str = "127.0.0.1"):
        self.requests: list[bytes] = []
        self.headers: list[dict] = []
        self._lock = threading.Lock()
        config = uvicorn.Config(build_app(responder, self.requests, self.headers, self._lock), host=host, port=0,
                                log_level="critical", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="scripted-openai-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30.0
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"scripted OpenAI server on {host} did not start")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://{host}:{port}/v1"

    def request_bodies(self) -> list[dict]:
        with self._lock:
            return [json.loads(r) for r in self.requests]

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10.0)

    def __enter__(self) -> "ScriptedServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_scripted(responder: Responder, host: str = "127.0.0.1") -> ScriptedServer:
    """Start a scripted OpenAI-compatible server; use as a context manager."""
    return ScriptedServer(responder, host)


def dead_endpoint_url() -> str:
    """A loopback base URL whose port was free a moment ago and has no listener (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
