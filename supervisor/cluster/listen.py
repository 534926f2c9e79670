"""The group's own port, on the cluster's private network: rank 0 answers its ranks' beats here, and
nowhere else (issue 50: beats were answered on the status port, which a cluster exposes through RunPod's
public HTTP proxy, so anyone with rank 0's pod id could send one). It binds NODE_ADDR (this node's address
on the cluster network, ens1) at KILN_CLUSTER_PORT, a port no template exposes; the status page keeps
/ready and /status, for `cluster up` to watch, and takes no beat. Only GET /cluster: anything else is 404.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from ..status.httpd import HttpServer, Request, Response
from .protocol import PATH

__all__ = ["GroupListener"]

log = logging.getLogger("kiln")


class GroupListener:
    def __init__(self, host: str, port: int, answer: Callable[[bytes], tuple[int, bytes]]):
        self._address = (host, port)
        self._answer = answer
        self._server: HttpServer | None = None

    def _respond(self, request: Request) -> Response:
        split = urlsplit(request.target)
        if request.method != "GET" or split.path != PATH:
            return Response(404, "text/plain; charset=utf-8", b"not found\n")
        beat = parse_qs(split.query).get("beat", [""])[0]
        status, body = self._answer(beat.encode("utf-8"))
        return Response(status, "application/json", body)

    def start(self) -> None:
        """Bind and serve; OSError (the port taken, the address not this node's) is the caller's to report."""
        self._server = HttpServer(self._address, respond=self._respond, lane=lambda request: "now", log=log,
                                  name="group port")
        self._server.start()
        log.info("cluster: the group's beats on %s:%d (the cluster network only)", *self._address)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def port(self) -> int:
        return self._server.address[1] if self._server is not None else self._address[1]
