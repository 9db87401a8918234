"""An OpenAI-compatible chat-completions server on 127.0.0.1 that injects faults, for tests.

`FaultServer(answer, fault)` answers each POST with `answer(body)` as the reply text unless
`fault(body)` names a fault; every request is recorded in `requests` with the fault it got. With
`api_key`, a request without `Authorization: Bearer <api_key>` gets 401.

Faults: `500`, `429` (with Retry-After), `401`, `400` (echoes the Authorization header back),
`hang` (sleeps `hang_s`, then answers), `reset` (TCP reset, no response), `malformed` (a body cut
mid-JSON), `huge` (a `huge_bytes` body with its Content-Length), `huge_unsized` (the same, with
no Content-Length: read until the connection closes), `trickle` (a valid reply sent a byte at a
time over `trickle_s`), and any other string is sent as the reply text itself (e.g. invented or
missing verdicts).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = ("500", "429", "401", "400", "hang", "reset", "malformed", "huge", "huge_unsized", "trickle")


def completion(text: str) -> str:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default 5 drops connections past it: 16 judge calls at once, then a ~1 s retry


class FaultServer:
    def __init__(self, answer: Callable[[dict[str, Any]], str], fault: Callable[[dict[str, Any]], str | None] = None,
                 *, retry_after: str = "1", hang_s: float = 3.0, trickle_s: float = 3.0, huge_bytes: int = 3_000_000,
                 api_key: str | None = None):
        self.answer = answer
        self.fault = fault or (lambda body: None)
        self.retry_after, self.hang_s, self.trickle_s, self.huge_bytes = retry_after, hang_s, trickle_s, huge_bytes
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []  # {"t", "path", "headers", "body", "size", "fault"}
        self.faults: Counter[str] = Counter()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                with server.lock:
                    denied = server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}"
                    fault = "401" if denied else server.fault(body)
                    server.requests.append({"t": time.monotonic(), "path": self.path, "headers": dict(self.headers),
                                            "body": body, "size": len(raw), "fault": fault})
                    if fault in FAULTS:
                        server.faults[fault] += 1
                try:
                    server.respond(self, fault, body)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self) -> "FaultServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def respond(self, h: BaseHTTPRequestHandler, fault: str | None, body: dict[str, Any]) -> None:
        if fault == "hang":
            time.sleep(self.hang_s)
            fault = None
        if fault is None:
            send(h, 200, completion(self.answer(body)))
        elif fault == "500":
            send(h, 500, '{"error": "boom"}')
        elif fault == "429":
            send(h, 429, '{"error": "slow down"}', {"Retry-After": self.retry_after})
        elif fault == "401":
            send(h, 401, '{"error": "invalid api key"}')
        elif fault == "400":  # a hostile server that echoes the Authorization header back
            send(h, 400, json.dumps({"error": f"bad request; you sent {h.headers.get('Authorization')}"}))
        elif fault == "reset":
            h.close_connection = True
            h.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.request.close()
        elif fault == "malformed":
            send(h, 200, '{"choices": [{"message": {"content": "trunc')
        elif fault in ("huge", "huge_unsized"):
            send(h, 200, completion("x" * self.huge_bytes), sized=fault == "huge")
        elif fault == "trickle":
            data = completion(self.answer(body)).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            for i in range(len(data)):
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                time.sleep(self.trickle_s / len(data))
        else:  # the reply text itself (invented, missing or unparseable answers)
            send(h, 200, completion(fault))


def send(h: BaseHTTPRequestHandler, status: int, body: str, headers: dict[str, str] | None = None,
         sized: bool = True) -> None:
    data = body.encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    if sized:
        h.send_header("Content-Length", str(len(data)))
    else:
        h.close_connection = True
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)
