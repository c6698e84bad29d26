"""A scripted HTTP server on 127.0.0.1 for retry and client tests (standard library only).

    with serve_script({"/retrieve": [Reply(429, {"Retry-After": "1"}), Reply(200, body={"result": []})]}) as srv:
        ...  srv.url, srv.seen("/retrieve") -> [(monotonic arrival time, method, parsed JSON body or None), ...]

Each path answers its script's replies in order (a callable in a script is called with the parsed request
body and returns the Reply, for answers that depend on the request); once a script is used up it answers 599 ("script used
up"), so a client that retries more than the test expects is seen, not hung. Unscripted paths answer 404.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict = dataclasses.field(default_factory=dict)
    body: object = None               # JSON-encoded; bytes are sent verbatim


class ScriptedServer:
    def __init__(self, scripts: dict[str, list[Reply]]):
        self.scripts = {path: list(replies) for path, replies in scripts.items()}
        self.log: list[tuple[float, str, str, object]] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):   # keep test output quiet
                pass

            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    parsed = json.loads(raw) if raw else None
                except ValueError:
                    parsed = raw
                with owner.lock:
                    owner.log.append((time.monotonic(), self.command, self.path, parsed))
                    script = owner.scripts.get(self.path)
                    if script is None:
                        reply = Reply(404, body={"detail": "not found"})
                    elif not script:
                        reply = Reply(599, body={"detail": "script used up"})
                    else:
                        reply = script.pop(0)
                if callable(reply):
                    reply = reply(parsed)
                body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def seen(self, path: str) -> list[tuple[float, str, object]]:
        with self.lock:
            return [(t, method, body) for t, method, p, body in self.log if p == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve_script(scripts: dict[str, list[Reply]]) -> ScriptedServer:
    return ScriptedServer(scripts)
