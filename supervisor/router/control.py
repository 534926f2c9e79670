"""`PUT /kiln/router/replicas` on the router's own port: its replicas changed in place, so its URL
survives a change of them (issue 37 item 9: `pods up --router` terminated the router pod and made a
new one, a new URL, the old one 404, requests in flight cut).

A RunPod pod's environment cannot be changed after it is created (the v2 API has no pod update), and
the router pod's own RunPod key reaches only itself, so the CLI hands the router its new list on the
URL clients already use. Changing where traffic goes is an operator's act, never a client's: it takes
the OPERATOR key ([router] operator_key, a RunPod secret of its own, kiln_operator_key), never the key
every client sends (issue 50: with the clients' key any client could point the router at its own
server and read every other client's prompts). Keys are compared in constant time; each change is
logged with who made it (the operator key's fingerprint and the peer's address) and what it was. The
body is the list in KILN_ROUTER_REPLICAS' form:

    PUT /kiln/router/replicas   Authorization: Bearer <operator key>
    {"replicas": "http://203.0.113.7:40123|https://p1-8081.proxy.runpod.net/ready http://..."}
    -> 200 {"replicas": [{"url", "status_url"}, ...]}   the feeder's next round works with it
       400 naming the bad entry; 401 without a key or with a stranger's; 403 with the clients' key
       (it can never change where traffic goes), or when the router has no operator key (then only its
       deploy config changes its replicas)

The front (front.py) hands such a request here before it relays anything to smg; any other request is
smg's. Stdlib and Kiln's error base only; the validation and what is done with the list are the caller's (`apply`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import socket
import time
from typing import Any, Callable, Mapping

from ..errors import KilnError

log = logging.getLogger("kiln")

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


def read_operator_key(source: str, env: Mapping[str, str]) -> str | None:
    """The operator key [router] operator_key names ("env:NAME", "file:/path", "none"); None when there is
    none (then no list is taken: 403). Never generated: a key nobody holds would lock the operator out."""
    kind, _, ref = source.partition(":")
    if kind == "env":
        return (env.get(ref) or "").strip() or None
    if kind == "file":
        try:
            return open(ref, encoding="utf-8").read().strip() or None
        except OSError:
            return None
    return None


def fingerprint(key: str) -> str:
    """Who a key is, in a log line: the first 12 hex digits of its sha256, never the key."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()[:12]


def _peer(client: socket.socket) -> str:
    try:
        host, port = client.getpeername()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError, TypeError):
        return "a local socket"


def authorise(sent: str, operator: str | None, clients: str | None) -> None:
    """Refused unless `sent` (the Authorization header) carries the operator key; in constant time."""
    if not operator:
        raise Refused(403, "the router has no operator key ([router] operator_key: a RunPod secret, "
                      "kiln_operator_key): its replicas change with its deploy config only")
    if clients and hmac.compare_digest(operator.encode(), clients.encode()):
        raise Refused(403, "the router's operator key is the clients' key: anyone with a client key could change "
                      "where traffic goes; give the operator key a value of its own")
    if hmac.compare_digest(sent.encode(), f"Bearer {operator}".encode()):
        return
    if clients and hmac.compare_digest(sent.encode(), f"Bearer {clients}".encode()):
        raise Refused(403, "the clients' key cannot change where traffic goes: send the operator key "
                      "(Authorization: Bearer <operator key>)")
    raise Refused(401, "send the router's operator key: Authorization: Bearer <operator key>")


def serve(client: socket.socket, key: str | None, apply: Callable[[str], list[dict[str, str]]], *,
          operator: str | None = None) -> int:
    """Answer one control request on `client` (its first bytes only peeked); the status sent. `key`:
    the clients' key (refused here), `operator`: the operator key (the only one taken).
    `apply(value)` validates and applies a KILN_ROUTER_REPLICAS value, raising ValueError naming the
    bad entry. Never says a key."""
    peer = _peer(client)
    try:
        client.settimeout(10.0)
        headers, body = _read(client)
        try:
            authorise(headers.get("authorization", ""), operator, key)
        except Refused as e:
            log.warning("router: a replica list from %s refused (%d): %s", peer, e.status, e)
            raise
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
        assert operator is not None
        log.info("router: replicas changed in place by the operator key %s from %s: %s", fingerprint(operator), peer,
                 " ".join(r["url"] for r in replicas))
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
