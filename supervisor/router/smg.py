"""smg's worker API, the calls the feeder makes (measured on smg 1.13.0 against real llama-servers:
docs/research/router-choice-2026-12-01.md):

    GET    /workers                  {"workers": [{"id", "url", "status", "is_healthy", ...}], ...}
    POST   /workers {"url", "api_key"}   202 (added in the background; ready ~50 ms later)
                                     409 while an add of that URL is in progress
    DELETE /workers/<id>             202: the worker drains (in-flight requests finish), then goes

Every call carries the router's key (`Authorization: Bearer K`), which smg requires on /workers.
The worker's `api_key` is the same key: smg sends it to the replica, whose own --api-key wants it
(without it smg's backend detection gets 401 and retries for over a minute). Stdlib only.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

from ..errors import KilnError
from .plan import Worker


class RouterUnavailable(KilnError):
    """The router did not answer (not started yet, restarting) or answered something unexpected."""


class Smg:
    def __init__(self, host: str, port: int, key: str | None, timeout_s: float = 2.0):
        self.host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        self.port = port
        self.key = key
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise RouterUnavailable(f"{method} {path}: {type(e).__name__}: {e}") from None
        finally:
            conn.close()

    def workers(self) -> list[Worker]:
        status, body = self._call("GET", "/workers")
        if status != 200:
            raise RouterUnavailable(f"GET /workers answered {status}: {body[:200].decode(errors='replace')}")
        try:
            items = json.loads(body)["workers"]
            return [Worker(str(w["url"]), str(w["id"]), str(w.get("status", ""))) for w in items]
        except (ValueError, KeyError, TypeError) as e:
            raise RouterUnavailable(f"GET /workers: unexpected answer ({e})") from None

    def add(self, url: str, worker_key: str | None) -> tuple[bool, str]:
        """(accepted, what smg said). An add already in progress (409) counts as accepted."""
        body: dict[str, Any] = {"url": url}
        if worker_key:
            body["api_key"] = worker_key
        status, text = self._call("POST", "/workers", body)
        return status in (200, 202, 409), f"{status} {text[:200].decode(errors='replace')}"

    def remove(self, worker_id: str) -> tuple[bool, str]:
        status, text = self._call("DELETE", "/workers/" + urllib.parse.quote(worker_id, safe=""))
        return status in (200, 202, 404), f"{status} {text[:200].decode(errors='replace')}"
