"""`PUT /kiln/router/replicas` (supervisor/router/control.py) on a socket pair, without smg: the OPERATOR
key is required and compared whole (issue 50: the clients' key was enough, so any client could point the
router at its own server), the body is checked, the list goes to `apply`, whose refusal is a 400 naming
it. The whole path, through the router's port and RunPod's stand-in: tests/integration/
test_router_replicas.py and test_runpod_router.py."""

import http.client
import json
import socket
import threading

from supervisor.router import control


def ask(request: bytes, key: str | None, apply, operator: str | None = "0per") -> tuple[int, dict]:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(request)
        status = control.serve(b, key, apply, operator=operator)
        b.shutdown(socket.SHUT_WR)
        answer = a.recv(65536).decode()
    head, _, body = answer.partition("\r\n\r\n")
    assert int(head.split()[1]) == status
    return status, json.loads(body)


def put(body: bytes, auth: str | None = "Bearer 0per") -> bytes:
    head = f"PUT {control.PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    return (head + (f"Authorization: {auth}\r\n" if auth else "") + "\r\n").encode() + body


def test_the_key_the_body_and_the_list_are_checked_before_anything_changes():
    seen = []

    def apply(value: str) -> list[dict[str, str]]:
        if "ftp" in value:
            raise ValueError(f"router.replicas[0].url: must be an http(s) URL: {value}")
        seen.append(value)
        return [{"url": value, "status_url": value + "/health"}]

    good = json.dumps({"replicas": "http://a:1"}).encode()
    assert ask(put(good, None), "k3y", apply)[0] == 401
    assert ask(put(good, "Bearer 0pe"), "k3y", apply)[0] == 401              # a stranger
    code, out = ask(put(good, "Bearer k3y"), "k3y", apply)                  # a client: never
    assert code == 403 and "the clients' key cannot change where traffic goes" in out["error"]["message"]
    assert ask(put(good), "k3y", apply, operator=None)[0] == 403          # no operator key: no list taken
    code, out = ask(put(good, "Bearer k3y"), "k3y", apply, operator="k3y")   # the operator key IS the clients'
    assert code == 403 and "is the clients' key" in out["error"]["message"]
    assert ask(put(b"not json"), "k3y", apply)[0] == 400
    code, out = ask(put(json.dumps({"replicas": "ftp://x"}).encode()), "k3y", apply)
    assert code == 400 and "ftp://x" in out["error"]["message"]
    assert seen == []
    code, out = ask(put(good), "k3y", apply)
    assert code == 200 and seen == ["http://a:1"] and out["replicas"][0]["url"] == "http://a:1"
    assert "k3y" not in json.dumps(out) and "0per" not in json.dumps(out)
    assert control.is_control(put(good)) and not control.is_control(b"POST /v1/chat/completions HTTP/1.1\r\n")


def test_a_body_nested_past_the_bound_is_a_400_naming_it_never_a_recursion_error():
    """A 30,000-deep array (30 KB, under the size limit) made json.loads raise RecursionError: the
    control thread died with a traceback and the client got nothing (issue 50 item 10)."""
    for deep in (b"[" * 30_000 + b"]" * 30_000, b'{"replicas": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"):
        code, out = ask(put(deep), "k3y", lambda value: [])
        assert code == 400 and "nest" in out["error"]["message"], out
    # nesting within the bound is a body like any other: the usual 400 for what it is
    code, out = ask(put(b'{"replicas": [[["x"]]]}'), "k3y", lambda value: [])
    assert code == 400 and "must be a string" in out["error"]["message"], out


def test_a_body_over_the_limit_is_a_413_the_client_reads_not_a_reset():
    """The 413 was sent and the socket closed with the body unread: the kernel answered the client's
    bytes with a reset, and the client saw that instead of the 413. Over real TCP, as the front closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    served: list[int] = []

    def serve_one() -> None:
        client, _ = listener.accept()
        try:
            served.append(control.serve(client, "k3y", lambda value: []))
        finally:
            client.close()                                  # as front.Front._sort does

    with listener:
        for size in (control.MAX_BODY + 1, 1 << 20, 3 << 20):
            t = threading.Thread(target=serve_one)
            t.start()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request("PUT", control.PATH, body=b"x" * size, headers={"Authorization": "Bearer k3y"})
                resp = conn.getresponse()
                assert resp.status == 413, size
                assert "at most" in json.loads(resp.read())["error"]["message"]
                assert resp.getheader("Connection") == "close"
            finally:
                conn.close()
                t.join(30)
            assert served[-1] == 413
