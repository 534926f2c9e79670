"""A small OpenAI-compatible client for the selftest and the bench (stdlib only: it ships in
the image).

- Streaming replies keep the arrival time of every content chunk, so decode speed is measured
  by the client itself and can be held against the engine's own `timings` / `/metrics`.
- Every request has a wall deadline (the proxy in front of a pod cuts at ~125 s) and can be
  cancelled from another thread: `abort()` shuts the in-flight sockets down, which ends a
  blocked read at once (a signal alone would not: the read is retried after the handler).
- The API key goes in the Authorization header and nowhere else: not in errors, not in logs.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

from .. import errors
from ..errors import KilnError

_WATCH_S = 0.05


class ClientError(KilnError):
    """A request failed: `kind` is http | connect | timeout | cancelled | protocol."""

    def __init__(self, kind: str, message: str, status: int | None = None, body: str = ""):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.body = body

    @property
    def context_exceeded(self) -> bool:
        """The server refused a prompt longer than its context (llama.cpp says so by type)."""
        text = self.body.lower()
        return self.status == 400 and ("exceed_context_size" in text or "context length" in text
                                       or "maximum context" in text)


class RequestCancelled(ClientError, errors.Cancelled):
    """The selftest was told to stop; the in-flight request was aborted."""

    def __init__(self) -> None:
        super().__init__("cancelled", "cancelled")


@dataclass
class Reply:
    """One reply, streamed or not, in the shape the selftest needs."""
    status: int
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None          # llama.cpp's own (absent elsewhere)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    t_sent: float = 0.0                             # monotonic clock
    t_done: float = 0.0
    chunk_times: list[float] = field(default_factory=list)   # arrival of each content chunk
    raw: dict[str, Any] | None = None               # the parsed body (non-streamed)

    @property
    def wall_s(self) -> float:
        return self.t_done - self.t_sent

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.t_sent if self.chunk_times else None

    @property
    def completion_tokens(self) -> int | None:
        v = (self.usage or {}).get("completion_tokens")
        return int(v) if isinstance(v, (int, float)) else None

    @property
    def decode_steps(self) -> int:
        """Tokens decoded after the first content chunk, i.e. within first chunk -> last chunk.
        One a chunk where the server streams one token a chunk (llama.cpp; vLLM without
        speculation). Under speculative decoding vLLM streams a step's accepted tokens as one
        chunk: on the H200 (2026-12-01, n-gram, prose) 768 tokens came in ~396 chunks, so counting
        chunks halved the rate. When the usage reports clearly more tokens than chunks, it counts
        (less the first token, from the prompt pass, and an end-of-sequence token, which streams
        no content)."""
        n = len(self.chunk_times)
        if n < 2:
            return 0
        t = self.completion_tokens
        if t is None or t <= n + 1:
            return n - 1
        return t - 1 - (1 if self.finish_reason == "stop" else 0)

    @property
    def decode_span_s(self) -> float:
        """First content chunk -> last content chunk: the time the decode steps took."""
        return self.chunk_times[-1] - self.chunk_times[0] if len(self.chunk_times) > 1 else 0.0

    @property
    def prompt_tokens(self) -> int | None:
        v = (self.usage or {}).get("prompt_tokens")
        return int(v) if isinstance(v, (int, float)) else None

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens the server took from its cache: llama.cpp `timings.cache_n`, else the
        OpenAI-style `usage.prompt_tokens_details.cached_tokens`."""
        if self.timings and isinstance(self.timings.get("cache_n"), (int, float)):
            return int(self.timings["cache_n"])
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        v = details.get("cached_tokens") if isinstance(details, dict) else None
        return int(v) if isinstance(v, (int, float)) else None


class Client:
    """OpenAI-compatible HTTP(S) client for one server. Thread-safe for concurrent requests."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = 100.0,
                 cancelled: Callable[[], bool] | None = None, engine: str | None = None):
        u = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s
        self._key = api_key
        self._cancelled = cancelled or (lambda: False)
        self._aborted = False
        self._lock = threading.Lock()
        self._inflight: dict[int, tuple[socket.socket, float, list[str]]] = {}
        self._watcher: threading.Thread | None = None
        self._model: str | None = None
        self._model_looked = False
        self._engine_hint = engine
        self.engine: str | None = None       # llamacpp | vllm | openai (see detect)
        self.props: dict[str, Any] | None = None

    @property
    def url(self) -> str:
        default = 443 if self.scheme == "https" else 80
        port = "" if self.port == default else f":{self.port}"
        return f"{self.scheme}://{self.host}{port}{self.prefix}"

    @property
    def in_flight(self) -> int:
        """Requests on the wire right now."""
        with self._lock:
            return len(self._inflight)

    def reach(self, timeout_s: float = 10.0) -> None:
        """Open one TCP connection and close it. ClientError(kind="connect") when the server
        cannot be reached at all (refused, no answer, no such host): that is not a failed selftest."""
        try:
            socket.create_connection((self.host, self.port), timeout=timeout_s).close()
        except socket.gaierror as e:
            raise ClientError("connect", f"no such host {self.host} ({e.strerror or e})") from None
        except TimeoutError:
            raise ClientError("connect", f"no answer within {timeout_s:g} s") from None
        except OSError as e:
            raise ClientError("connect", (e.strerror or str(e)).lower()) from None

    # -- cancellation --------------------------------------------------------------------------
    def is_cancelled(self) -> bool:
        return self._aborted or self._cancelled()

    def abort(self) -> None:
        """Cancel: every in-flight request ends now with RequestCancelled, and so does every later one."""
        self._aborted = True
        with self._lock:
            for sock, _, why in self._inflight.values():
                why.append("cancelled")
                _shutdown(sock)

    def _watch(self) -> None:
        while True:
            time.sleep(_WATCH_S)
            now = time.monotonic()
            cancelled = self.is_cancelled()
            with self._lock:
                if not self._inflight:
                    self._watcher = None
                    return
                for sock, deadline, why in self._inflight.values():
                    if not why and (cancelled or now > deadline):
                        why.append("cancelled" if cancelled else "timeout")
                        _shutdown(sock)

    def _register(self, conn: http.client.HTTPConnection, deadline: float) -> list[str]:
        why: list[str] = []
        assert conn.sock is not None
        with self._lock:
            self._inflight[id(conn)] = (conn.sock, deadline, why)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="kiln-selftest-watch", daemon=True)
                self._watcher.start()
        return why

    def _unregister(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._inflight.pop(id(conn), None)

    # -- plumbing ------------------------------------------------------------------------------
    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _headers(self, body: bool) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if body:
            h["Content-Type"] = "application/json"
        if self._key:
            h["Authorization"] = f"Bearer {self._key}"
        return h

    def _open(self, method: str, path: str, payload: dict[str, Any] | None,
              timeout_s: float | None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, list[str], float]:
        if self.is_cancelled():
            raise RequestCancelled()
        wall = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wall
        conn = self._connect(timeout=wall + 5.0)      # the watcher ends it at the deadline
        body = json.dumps(payload).encode() if payload is not None else None
        t_sent = time.monotonic()
        why: list[str] = []
        try:
            conn.connect()
            why = self._register(conn, deadline)
            conn.request(method, self.prefix + path, body=body, headers=self._headers(body is not None))
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            self._unregister(conn)
            conn.close()
            raise self._failure(why, e, path) from None
        return conn, resp, why, t_sent

    def _failure(self, why: list[str], e: BaseException, path: str) -> ClientError:
        if "cancelled" in why or self.is_cancelled():
            return RequestCancelled()
        if "timeout" in why or isinstance(e, TimeoutError):
            return ClientError("timeout", f"{path}: no complete reply within the wall limit")
        if isinstance(e, ConnectionRefusedError):
            return ClientError("connect", f"{path}: connection refused by {self.host}:{self.port}")
        return ClientError("connect", f"{path}: {type(e).__name__}: {e}")

    def _error_for(self, status: int, text: str, path: str) -> ClientError:
        message = text.strip()
        try:
            j = json.loads(text)
            err = j.get("error", j) if isinstance(j, dict) else j
            message = err.get("message", message) if isinstance(err, dict) else str(err)
        except ValueError:
            pass
        return ClientError("http", f"{path}: HTTP {status}: {message[:300]}", status=status, body=text[:2000])

    # -- plain requests --------------------------------------------------------------------------
    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
        conn, resp, why, _ = self._open("GET", path, None, timeout_s)
        try:
            return resp.status, resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as e:
            raise self._failure(why, e, path) from None
        finally:
            self._unregister(conn)
            conn.close()

    def post_json(self, path: str, payload: dict[str, Any], timeout_s: float | None = None) -> Reply:
        conn, resp, why, t_sent = self._open("POST", path, payload, timeout_s)
        try:
            data = resp.read()
            t_done = time.monotonic()
        except (OSError, http.client.HTTPException) as e:
            raise self._failure(why, e, path) from None
        finally:
            self._unregister(conn)
            conn.close()
        text = data.decode("utf-8", "replace")
        if resp.status != 200:
            raise self._error_for(resp.status, text, path)
        try:
            j = json.loads(text)
        except ValueError:
            raise ClientError("protocol", f"{path}: reply is not JSON: {text[:200]!r}") from None
        reply = Reply(status=resp.status, t_sent=t_sent, t_done=t_done, raw=j,
                      usage=j.get("usage"), timings=j.get("timings"))
        choice = (j.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        reply.text = msg.get("content") or choice.get("text") or ""
        reply.finish_reason = choice.get("finish_reason")
        reply.tool_calls = list(msg.get("tool_calls") or [])
        return reply

    def stream(self, path: str, payload: dict[str, Any], timeout_s: float | None = None) -> Reply:
        payload = {**payload, "stream": True, "stream_options": {"include_usage": True}}
        conn, resp, why, t_sent = self._open("POST", path, payload, timeout_s)
        reply = Reply(status=resp.status, t_sent=t_sent)
        parts: list[str] = []
        try:
            if resp.status != 200:
                raise self._error_for(resp.status, resp.read().decode("utf-8", "replace"), path)
            for event in _sse(resp):
                now = time.monotonic()
                if event.get("timings"):
                    reply.timings = event["timings"]
                if event.get("usage"):
                    reply.usage = event["usage"]
                for choice in event.get("choices") or ():
                    delta = choice.get("delta") or {}
                    piece = delta.get("content") if "delta" in choice else choice.get("text")
                    if piece:
                        parts.append(piece)
                        reply.chunk_times.append(now)
                    if choice.get("finish_reason"):
                        reply.finish_reason = choice["finish_reason"]
                if self.is_cancelled():
                    raise RequestCancelled()
            reply.t_done = time.monotonic()
        except ValueError as e:
            if self.is_cancelled():
                raise RequestCancelled() from None
            raise ClientError("protocol", f"{path}: bad event in the stream: {e}") from None
        except (OSError, http.client.HTTPException) as e:
            raise self._failure(why, e, path) from None
        finally:
            self._unregister(conn)
            conn.close()
        reply.text = "".join(parts)
        return reply

    # -- what a selftest asks ----------------------------------------------------------------------
    def model(self, timeout_s: float = 10.0) -> str | None:
        """The first model id of GET /v1/models (vLLM wants it in every request; llama.cpp
        ignores it); None when the list is unavailable."""
        if not self._model_looked:
            self._model_looked = True
            try:
                status, text = self.get("/v1/models", timeout_s=min(10.0, timeout_s))
                if status == 200:
                    data = json.loads(text).get("data") or []
                    self._model = data[0].get("id") if data else None
            except (ClientError, ValueError, AttributeError):
                self._model = None
        return self._model

    def detect(self) -> str:
        """The engine: the hint given (the supervisor knows its engine), else "llamacpp" when
        GET /props answers like llama-server (then `props` holds it), else "openai" (any other
        OpenAI-compatible server; vLLM is only ever named, never guessed)."""
        if self.engine is None:
            self.engine = self._engine_hint or "openai"
            if self._engine_hint not in (None, "llamacpp"):
                return self.engine
            try:
                status, text = self.get("/props")
                j = json.loads(text) if status == 200 else None
                if isinstance(j, dict) and "default_generation_settings" in j:
                    self.engine, self.props = "llamacpp", j
            except (ClientError, ValueError):
                pass
        return self.engine

    def greedy(self) -> dict[str, Any]:
        """Request fields for plain greedy decoding whatever the server's sampler defaults:
        temperature 0 always; the repetition penalty (which the field notes found costs accuracy)
        neutralised in the engine's own spelling."""
        params: dict[str, Any] = {"temperature": 0.0}
        engine = self.detect()
        if engine == "llamacpp":
            params["repeat_penalty"] = 1.0
        elif engine == "vllm":          # vLLM applies the model's generation_config.json defaults
            params["repetition_penalty"] = 1.0
        return params

    def _with_model(self, payload: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        m = self.model(self.timeout_s if timeout_s is None else timeout_s)
        return {"model": m, **payload} if m else payload

    def chat(self, messages: list[dict[str, Any]], *, max_tokens: int, stream: bool = False,
             timeout_s: float | None = None, **extra: Any) -> Reply:
        payload = self._with_model({"messages": messages, "max_tokens": max_tokens, **extra}, timeout_s)
        if stream:
            return self.stream("/v1/chat/completions", payload, timeout_s)
        return self.post_json("/v1/chat/completions", payload, timeout_s)

    def complete(self, prompt: str, *, max_tokens: int, stream: bool = False,
                 timeout_s: float | None = None, **extra: Any) -> Reply:
        payload = self._with_model({"prompt": prompt, "max_tokens": max_tokens, **extra}, timeout_s)
        if stream:
            return self.stream("/v1/completions", payload, timeout_s)
        return self.post_json("/v1/completions", payload, timeout_s)

    def metrics(self) -> str | None:
        """GET /metrics as text, or None when the server exposes none (llama.cpp without
        --metrics answers 501)."""
        try:
            status, text = self.get("/metrics")
        except ClientError as e:
            if isinstance(e, RequestCancelled):
                raise
            return None
        return text if status == 200 else None


def _sse(resp: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream, until [DONE] or the end."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        event = json.loads(data)
        if isinstance(event, dict):
            if "error" in event and not event.get("choices"):
                err = event["error"]
                raise ClientError("http", f"stream error: {err.get('message', err) if isinstance(err, dict) else err}")
            yield event


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
