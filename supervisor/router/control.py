"""`PUT /kiln/router/replicas` on the router's own port: its replicas changed in place, so its URL
survives a change of them (issue 37 item 9: `pods up --router` terminated the router pod and made a
new one, a new URL, the old one 404, requests in flight cut).

A RunPod pod's environment cannot be changed after it is created (the v2 API has no pod update), and
the router pod's own RunPod key reaches only itself, so the CLI hands the router its new list: on
the URL clients already use, with the key they already send (the router's server.api_key, compared
in constant time). The body is the list in KILN_ROUTER_REPLICAS' form:

    PUT /kiln/router/replicas   Authorization: Bearer <key>
    {"replicas": "http://203.0.113.7:40123|https://p1-8081.proxy.runpod.net/ready http://..."}
    -> 200 {"replicas": [{"url", "status_url"}, ...]}   the feeder's next round works with it
       400 naming the bad entry, 401 without the key, 403 when the router has no key

The front (front.py) hands such a request here before it relays anything to smg; any other request is
smg's. Stdlib and Kiln's error base only; the validation and what is done with the list are the caller's (`apply`).
"""

from __future__ import annotations

import hmac
import json
import re
import socket
import time
from typing import Any, Callable

from ..errors import KilnError

PATH = "/kiln/router/replicas"
PREFIX = f"PUT {PATH} ".encode()
MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
MAX_DEPTH = 32               # the list is one object of strings; json.loads recurses a level at a time
MAX_DRAIN = 16 * 1024 * 1024  # of a body past MAX_BODY, read and dropped so the client reads its 413, not a reset
DRAIN_S = 5.0
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


class Refused(KilnError):
    """What to answer instead of applying: its status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def is_control(first: bytes) -> bool:
    return first.startswith(PREFIX)


def _read(client: socket.socket) -> tuple[dict[str, str], bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = client.recv(4096)
        if not chunk:
            raise Refused(400, "the request ended before its head did")
        buf += chunk
        if len(buf) > MAX_HEAD:
            raise Refused(431, "request head too large")
    head, _, body = buf.partition(b"\r\n\r\n")
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise Refused(400, "Content-Length is not a number") from None
    if length > MAX_BODY:
        raise Refused(413, f"the body is {length} bytes; at most {MAX_BODY}")
    while len(body) < length:
        chunk = client.recv(min(65536, length - len(body)))
        if not chunk:
            raise Refused(400, "the request ended before its body did")
        body += chunk
    return headers, body[:length]


def _depth(body: bytes) -> int:
    """How deep `body` nests ([ and { outside JSON strings), counted without parsing it, up to MAX_DEPTH + 1."""
    depth = deepest = 0
    for c in _STRING.sub(b"", body):
        if c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
        elif c in b"]}":
            depth -= 1
    return deepest


def _discard(client: socket.socket) -> None:
    """After a refusal that left the request unread (413, 431): the answer is sent, so say no more and
    read what the client still sends, up to MAX_DRAIN or DRAIN_S, before the caller closes. A close with
    bytes unread makes the kernel answer with a reset, which can reach the client before it reads the
    answer (it is still sending)."""
    deadline = time.monotonic() + DRAIN_S
    client.shutdown(socket.SHUT_WR)
    left = MAX_DRAIN
    while left > 0 and (wait := deadline - time.monotonic()) > 0:
        client.settimeout(wait)
        chunk = client.recv(min(65536, left))
        if not chunk:
            return
        left -= len(chunk)


def _send(client: socket.socket, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 413: "Payload Too Large",
              431: "Request Header Fields Too Large"}.get(status, "Error")
    client.sendall(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (status, reason.encode(), len(body), body))


def serve(client: socket.socket, key: str | None, apply: Callable[[str], list[dict[str, str]]]) -> int:
    """Answer one control request on `client` (its first bytes only peeked); the status sent.
    `apply(value)` validates and applies a KILN_ROUTER_REPLICAS value, raising ValueError naming the
    bad entry. Never says the key."""
    try:
        client.settimeout(10.0)
        headers, body = _read(client)
        if not key:
            raise Refused(403, "the router has no key (server.api_key = \"none\"): its replicas are changed by "
                          "its deploy config only")
        sent = headers.get("authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {key}".encode()):
            raise Refused(401, "send the router's key: Authorization: Bearer <key>")
        if _depth(body) > MAX_DEPTH:
            raise Refused(400, f"the body nests deeper than {MAX_DEPTH} levels: it must be JSON: "
                          '{"replicas": "URL|STATUS_URL URL|STATUS_URL ..."}')
        try:
            value = json.loads(body)["replicas"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise Refused(400, 'the body must be JSON: {"replicas": "URL|STATUS_URL URL|STATUS_URL ..."}') from None
        if not isinstance(value, str):
            raise Refused(400, '"replicas" must be a string of entries URL|STATUS_URL, separated by spaces')
        try:
            replicas = apply(value)
        except ValueError as e:
            raise Refused(400, str(e)) from None
        _send(client, 200, {"replicas": replicas})
        return 200
    except Refused as e:
        try:
            _send(client, e.status, {"error": {"message": str(e)}})
            if e.status in (413, 431):
                _discard(client)
        except OSError:
            pass
        return e.status
    except OSError:
        return 0
