"""Whether the replicas accept the router's key: each is asked GET /v1/models with it (every
OpenAI-compatible server has it; llama-server and vLLM started with --api-key answer 401 without the
right key). Stdlib only: the launcher runs it in the router's Python before smg starts.

    show_key(replicas, key, timeout)  each replica's answer: accepted, refused (401/403) or no verdict
    refusal(answers)                  the line that says why the router cannot route, or None
"""

from __future__ import annotations

import http.client
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

ACCEPTED, REFUSED, NO_VERDICT = "accepted", "refused", "no verdict"


def ask(url: str, key: str | None, timeout_s: float) -> tuple[str, str]:
    """(verdict, what the replica answered)."""
    u = urllib.parse.urlsplit(url)
    conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(u.hostname or "127.0.0.1", u.port, timeout=timeout_s)
    try:
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as e:
        return NO_VERDICT, f"no answer ({type(e).__name__})"
    finally:
        conn.close()
    if status in (401, 403):
        return REFUSED, str(status)
    return (ACCEPTED if 200 <= status < 300 else NO_VERDICT), str(status)


def show_key(replicas: list[str], key: str | None, timeout_s: float) -> dict[str, tuple[str, str]]:
    if not replicas:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(replicas))) as pool:
        return dict(zip(replicas, pool.map(lambda u: ask(u, key, timeout_s), replicas)))


def refusal(answers: dict[str, tuple[str, str]], *, has_key: bool) -> str | None:
    """Why the router could route nothing: no replica accepted its key and at least one refused it.
    Never the key itself."""
    verdicts = [v for v, _ in answers.values()]
    if ACCEPTED in verdicts or REFUSED not in verdicts:
        return None
    said = "; ".join(f"{url} answered {text}" for url, (_, text) in answers.items())
    if not has_key:
        return (f"{said} to GET /v1/models without a key: the router has none (server.api_key = \"none\") and "
                "the replicas want one: set server.api_key to the key they were started with")
    return (f"{said} to GET /v1/models with it. The router sends its own key (server.api_key) to the replicas: "
            "set it to the key the replicas were started with (a Kiln replica's server.api_key; on RunPod the "
            "secret kiln_api_key)")
