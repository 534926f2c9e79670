"""llama-server's slot API, as the pinned build (11434) answers it: `GET /slots` (one object per slot:
id, n_ctx, is_processing), `POST /slots/{id}?action=save {"filename"}` -> {"n_saved", "n_written"} and
`?action=restore {"filename"}` -> {"n_restored", "n_read"}, the file under --slot-save-path. Seen on this
build (2026-12-06, CPU, SmolLM2-135M, -c 8192): a 7,295-token slot saved 168 MB in 0.36 s and restored in
0.07 s into a new server, whose next request reprocessed 1 token instead of 7,280 and answered the same
text at temperature 0 (llama.cpp's report that a restore "reports success but does not take effect",
#26676, did not show here). Stdlib and Kiln's error base only: the supervisor's own HTTP."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any

from ..errors import KilnError


class SlotError(KilnError):
    """The engine refused or could not be asked; the message says which call and why."""


@dataclass(frozen=True)
class SlotAPI:
    host: str
    port: int
    key: str | None = None
    timeout_s: float = 60.0

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
            r = conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException) as e:
            raise SlotError(f"{method} {path}: {type(e).__name__}: {e}") from None
        finally:
            conn.close()
        if r.status != 200:
            raise SlotError(f"{method} {path}: HTTP {r.status}: {data[:200].decode(errors='replace')}")
        try:
            return json.loads(data)
        except ValueError:
            raise SlotError(f"{method} {path}: not JSON: {data[:120]!r}") from None

    def slots(self) -> list[dict[str, Any]]:
        listed = self._call("GET", "/slots")
        if not isinstance(listed, list):
            raise SlotError("GET /slots: not a list of slots")
        return [s for s in listed if isinstance(s, dict) and isinstance(s.get("id"), int)]

    def save(self, slot: int, filename: str) -> tuple[int, int]:
        """(tokens saved, bytes written)."""
        out = self._call("POST", f"/slots/{slot}?action=save", {"filename": filename})
        return int(out.get("n_saved") or 0), int(out.get("n_written") or 0)

    def restore(self, slot: int, filename: str) -> int:
        """Tokens restored."""
        out = self._call("POST", f"/slots/{slot}?action=restore", {"filename": filename})
        return int(out.get("n_restored") or 0)
