"""A scripted local HTTP server speaking the real OpenAI chat-completions and Anthropic messages wire
formats, on 127.0.0.1, for tests of the providers through the official SDKs.

    with LLMServer(key="sk-test") as srv:
        srv.openai.push(Reply("```python ...```"), Status(429, retry_after=0.05), Garbage())
        OpenAI(base_url=srv.openai_url, api_key="sk-test")      # .../v1
        Anthropic(base_url=srv.anthropic_url, api_key="sk-test")

Each route serves its queued actions first, then its ``responder(body) -> action`` (default: a
fixed reply). The server's "tokenizer" counts ceil(characters / ``chars_per_token``) (4 unless
told: 2 is a tokenizer twice as dense); replies honour ``max_tokens`` (cut, finish ``length``);
``usage=False`` leaves the usage block out as some local servers do (the true counts are still
kept in ``srv.served``); ``context`` refuses, with a 400 in the format's own words, a request
whose prompt plus ``max_tokens`` exceeds that window. The OpenAI API is served under ``/v1`` only
(anything else is a plain 404, as Ollama answers). Every request is kept (path, headers, JSON body)
in ``srv.requests``. ``kill()`` stops the server mid-test (connections are then refused);
``free_port()`` gives a port where nothing listens.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """A 200 with a well-formed completion holding ``text``."""

    text: str
    tokens_in: int | None = None
    tokens_out: int | None = None
    finish: str | None = None
    usage: bool = True


@dataclass
class Status:
    """An error status with the format's error body (and ``Retry-After`` if given)."""

    code: int
    message: str = "scripted error"
    retry_after: float | None = None


@dataclass
class Garbage:
    """A 200 whose body is not JSON (under the given content type)."""

    body: str = "<html>upstream proxy error</html>"
    content_type: str = "application/json"


@dataclass
class Slow:
    """Wait ``delay`` seconds, then perform ``then``."""

    delay: float
    then: Any = None


Action = Reply | Status | Garbage | Slow
Responder = Callable[[dict[str, Any]], Action]


@dataclass
class Route:
    """The script of one API: queued actions, then the responder."""

    responder: Responder = field(default_factory=lambda: lambda body: Reply("no script"))
    queue: deque[Action] = field(default_factory=deque)

    def push(self, *actions: Action) -> None:
        self.queue.extend(actions)

    def next(self, body: dict[str, Any]) -> Action:
        return self.queue.popleft() if self.queue else self.responder(body)


def prompt_text(body: dict[str, Any]) -> str:
    """All prompt text of a request body (either format)."""
    parts = [body.get("system") or ""] if isinstance(body.get("system"), str) else []
    for m in body.get("messages", []):
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [c.get("text", "") for c in content if isinstance(c, dict)]
    return "\n".join(parts)


def count(text: str, chars_per_token: float = 4.0) -> int:
    return max(1, math.ceil(len(text) / chars_per_token))


def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (a never-started server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _QuietServer(ThreadingHTTPServer):
    """A client that gave up (a timeout under test) closes its socket before the reply: not an error of
    the server's, so no traceback on stderr; any other error is reported as before."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class LLMServer:
    """The server; use as a context manager."""

    def __init__(
        self,
        key: str | None = None,
        *,
        port: int = 0,
        chars_per_token: float = 4.0,
        usage: bool = True,
        context: int | None = None,
    ) -> None:
        self.key = key
        self.chars_per_token = chars_per_token
        self.usage = usage
        self.context = context
        self.openai = Route()
        self.anthropic = Route()
        self.requests: list[dict[str, Any]] = []
        #: (prompt tokens, completion tokens) of every reply, as this server's tokenizer counts them.
        self.served: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self.dead = False
        self._connections: set[socket.socket] = set()
        self._httpd = _QuietServer(("127.0.0.1", port), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def kill(self) -> None:
        """Stop serving and close every socket, open keep-alive connections too: the server is gone."""
        self.dead = True
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            for conn in list(self._connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._connections.clear()

    def count(self, text: str) -> int:
        return count(text, self.chars_per_token)

    @property
    def served_tokens(self) -> int:
        return sum(a + b for a, b in self.served)

    def calls(self, api: str) -> list[dict[str, Any]]:
        """Requests that reached ``api`` ("openai" or "anthropic")."""
        return [r for r in self.requests if r["api"] == api]

    # -- HTTP ----------------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server._connections.add(self.connection)

            def finish(self) -> None:
                with server._lock:
                    server._connections.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def do_POST(self) -> None:  # noqa: N802
                if server.dead:  # killed: drop the connection without an answer
                    self.close_connection = True
                    return
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/v1/chat/completions":
                    api, route = "openai", server.openai
                elif path == "/v1/messages":
                    api, route = "anthropic", server.anthropic
                else:
                    data = b"404 page not found"
                    self.send_response(404)
                    self.send_header("content-type", "text/plain; charset=utf-8")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                with server._lock:
                    server.requests.append(
                        {
                            "api": api,
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                if server.key is not None and not self._authorised(server.key):
                    self._error(api, Status(401, "invalid api key"))
                    return
                with server._lock:
                    action = route.next(body)
                self._perform(api, body, action)

            def _authorised(self, key: str) -> bool:
                auth = self.headers.get("authorization", "")
                return auth == f"Bearer {key}" or self.headers.get("x-api-key") == key

            def _perform(self, api: str, body: dict[str, Any], action: Action) -> None:
                if isinstance(action, Slow):
                    time.sleep(action.delay)
                    action = action.then or Reply("slow reply")
                if isinstance(action, Status):
                    self._error(api, action)
                elif isinstance(action, Garbage):
                    data = action.body.encode()
                    self.send_response(200)
                    self.send_header("content-type", action.content_type)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    self._reply(api, body, action)

            def _reply(self, api: str, body: dict[str, Any], r: Reply) -> None:
                limit = body.get("max_tokens") or body.get("max_completion_tokens")
                true_in = server.count(prompt_text(body))
                if server.context is not None and isinstance(limit, int) and true_in + limit > server.context:
                    self._context_error(api, true_in, limit)
                    return
                text, finish = r.text, r.finish
                if isinstance(limit, int) and server.count(text) > limit:  # a real server stops there
                    text, finish = (
                        text[: int(limit * server.chars_per_token)],
                        "length" if api == "openai" else "max_tokens",
                    )
                tin = r.tokens_in if r.tokens_in is not None else true_in
                tout = r.tokens_out if r.tokens_out is not None else server.count(text)
                with server._lock:
                    server.served.append((tin, tout))
                r = Reply(text, tin, tout, finish, r.usage and server.usage)
                model = body.get("model", "unknown")
                if api == "openai":
                    payload: dict[str, Any] = {
                        "id": f"chatcmpl-{len(server.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": r.text},
                                "finish_reason": r.finish or "stop",
                                "logprobs": None,
                            }
                        ],
                    }
                    if r.usage:
                        payload["usage"] = {
                            "prompt_tokens": tin,
                            "completion_tokens": tout,
                            "total_tokens": tin + tout,
                        }
                else:
                    payload = {
                        "id": f"msg_{len(server.requests)}",
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [{"type": "text", "text": r.text}],
                        "stop_reason": r.finish or "end_turn",
                        "stop_sequence": None,
                    }
                    if r.usage:
                        payload["usage"] = {"input_tokens": tin, "output_tokens": tout}
                self._send(200, payload)

            def _context_error(self, api: str, prompt: int, limit: int) -> None:
                window = server.context
                if api == "openai":  # vLLM's (and OpenAI's) words
                    msg = (
                        f"This model's maximum context length is {window} tokens. However, you requested "
                        f"{prompt + limit} tokens ({prompt} in the messages, {limit} in the completion). "
                        "Please reduce the length of the messages or completion."
                    )
                else:
                    msg = (
                        f"input length and `max_tokens` exceed context limit: {prompt} + {limit} > {window}, "
                        "decrease input length or `max_tokens` and try again"
                    )
                self._error(api, Status(400, msg))

            def _error(self, api: str, s: Status) -> None:
                kind = {401: "authentication_error", 429: "rate_limit_error", 404: "not_found_error"}.get(
                    s.code, "api_error" if s.code >= 500 else "invalid_request_error"
                )
                if api == "openai":
                    payload: dict[str, Any] = {"error": {"message": s.message, "type": kind, "code": None}}
                else:
                    payload = {"type": "error", "error": {"type": kind, "message": s.message}}
                headers = {"retry-after": str(s.retry_after)} if s.retry_after is not None else {}
                self._send(s.code, payload, headers)

            def _send(
                self, code: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                with contextlib.suppress(
                    BrokenPipeError, ConnectionResetError
                ):  # the client gave up (timeout)
                    self.wfile.write(data)

        return Handler


# -- canned kernels and a responder that plays a whole run ----------------------------------------------

VECADD_TEMPLATE = '''import torch
import torch.nn as nn
from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void vadd(__global const float* a, __global const float* b, __global float* c, const int n) {{
    int i = get_global_id(0) * WORK;
    for (int k = 0; k < WORK; ++k) {{
        if (i + k < n) c[i + k] = a[i + k] + b[i + k]{tweak};
    }}
}}
"""
TUNABLE = {{"BLOCK": [32, 64, 128, 256], "WORK": [1, 2, 4, 8]}}
BLOCK = PARAMS.get("BLOCK", {block})
WORK = PARAMS.get("WORK", {work})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.mod = load(SRC, defines={{"BLOCK": BLOCK, "WORK": WORK}})

    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        c = torch.empty_like(a)
        n = a.numel()
        self.mod.vadd(a, b, c, n, grid=(cdiv(n, BLOCK * WORK), 1, 1), block=(BLOCK, 1, 1))
        return c
'''


def vecadd(block: int = 64, work: int = 1, wrong: bool = False) -> str:
    """A real OpenCL ``ModelNew`` for ``a + b`` (``wrong``: adds 1, a mismatch)."""
    return VECADD_TEMPLATE.format(block=block, work=work, tweak=" + 1.0f" if wrong else "")


def fenced(source: str, plan: str = "Plan: one work-item per WORK elements.") -> str:
    return f"{plan}\n\n```python\n{source}```\n"


def kind_of(body: dict[str, Any]) -> str:
    """Which prompt a request carries: ``rank``, ``meta`` or ``generate``."""
    text = prompt_text(body)
    if "\n# Rank " in "\n" + text:
        return "rank"
    if "# Rewrite the section" in text:
        return "meta"
    return "generate"


def script_responder(
    kernels: list[str], ranking: str | None = None, meta_text: str = "Measure first."
) -> Responder:
    """Cycle through ``kernels`` (reply texts) for generation prompts; rank with ``ranking`` (or the
    reverse order: newest first); rewrite sections with ``meta_text``."""
    state = {"i": 0}
    lock = threading.Lock()

    def respond(body: dict[str, Any]) -> Action:
        kind = kind_of(body)
        if kind == "rank":
            n = prompt_text(body).count("\n## Candidate ")
            order = ranking or " > ".join(str(i) for i in range(n, 0, -1))
            return Reply(f"Candidate {n} coalesces best.\nRANKING: {order}")
        if kind == "meta":
            return Reply(f"Shorter is better.\n```text\n{meta_text}\n```")
        with lock:
            text = kernels[state["i"] % len(kernels)]
            state["i"] += 1
        return Reply(text)

    return respond


def evolving_responder(flavour: int, meta_text: str = "Prefer contiguous per-work-item loops.") -> Responder:
    """Plays a model through a whole run: every fifth reply is prose without code; otherwise a
    SEARCH/REPLACE diff on the parent's ``WORK`` when there is a parent, else a full kernel (every
    seventh a wrong one); a ranking that prefers later candidates; a section rewrite for meta prompts."""

    import re as _re

    state = {"i": 0}
    lock = threading.Lock()

    def respond(body: dict[str, Any]) -> Action:
        kind = kind_of(body)
        text = prompt_text(body)
        if kind == "rank":
            n = text.count("\n## Candidate ")
            return Reply(
                "Later candidates do more work per item.\nRANKING: "
                + " > ".join(str(i) for i in range(n, 0, -1))
            )
        if kind == "meta":
            return Reply(f"Shorter.\n```text\n{meta_text}\n```")
        with lock:
            state["i"] += 1
            i = state["i"]
        if i % 5 == 0:
            return Reply("I would tile it, but here is only prose.")
        parent = _re.search(r'WORK = PARAMS\.get\("WORK", (\d+)\)', text.split("## Parent kernel", 1)[-1])
        if "## Parent kernel" in text and parent:
            work = int(parent.group(1))
            new = work * 2 + 100 * flavour + i  # distinct per member and per reply
            return Reply(
                f'Double the work per item.\n<<<<<<< SEARCH\n    WORK = PARAMS.get("WORK", {work})\n=======\n'
                f'WORK = PARAMS.get("WORK", {new})\n>>>>>>> REPLACE\n'
            )
        block = [16, 32, 64, 128][(i + flavour) % 4]
        return Reply(fenced(vecadd(block, 1 + 100 * flavour + i, wrong=(i % 7 == 0))))

    return respond
