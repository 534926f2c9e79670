"""`endpoint failures`: what the CLI can see of the failure records an endpoint's workers keep on its
network volume (supervisor/serverless/failures.py), and the one way it can clear them everywhere.

The records are files on the network volume, which RunPod's REST API cannot read or write: it has
no route to a volume's files. What reaches them honestly:
- the workers themselves: each witness and each refusal is a log line, and RunPod serves the logs
  of the workers it lists (`worker_lines`; a worker that has ended is no longer listed);
- RunPod's S3-compatible API (runpod/docs storage/s3-api.mdx @0f215947): `s3://<volume id>/...`
  with a separate S3 API key, in the data centers that page lists. Kiln holds no such key and has
  no stand-in for it, so it prints the `aws s3` commands (`s3_commands`) instead of running them;
- the endpoint's env: `clear_body` sets KILN_SERVERLESS_FAILURES_CLEARED_AT to now, a new release
  whose workers ignore and delete every record written before it (whatever the data center).
  The mark uses this machine's clock and the records the workers': a skew between them moves the
  line by as much. `endpoint up` keeps the mark (endpoints.py `_kept_env`), so the records it lifted
  stay lifted, and its workers delete them.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from supervisor.serverless.failures import CLEARED_ENV

from .endpoints import SECRET_PREFIX

__all__ = ["CLEARED_ENV", "RECORDS_PATH", "MARKERS", "clear_body", "mark_of", "s3_commands", "worker_lines"]

RECORDS_PATH = "kiln/serverless/failures/"      # under the volume's root (/runpod-volume on a worker)
# What a worker logs about the records (supervisor/run/serverless.py, serverless/failures.py as_failure).
MARKERS = ("failure recorded at ", "recorded on the shared volume by workers ", "failure record(s) written before",
           "failure witness(es) of this image")


def mark_of(endpoint: dict[str, Any]) -> str | None:
    """The clear mark the endpoint's env holds, as set; None when there is none."""
    env = endpoint.get("env") if isinstance(endpoint.get("env"), dict) else {}
    value = env.get(CLEARED_ENV)
    return str(value) if value not in (None, "") else None


def clear_body(endpoint: dict[str, Any], refs: dict[str, str], now: float | None = None) -> dict[str, Any]:
    """The PATCH that sets the clear mark: the endpoint's env as it is, plus the mark. `refs` are the
    target's secret references: a secret's variable goes back as its reference, never as a value
    RunPod may have answered in its place."""
    env = dict(endpoint.get("env") or {})
    for key, ref in refs.items():
        if key in env and not str(env[key]).startswith(SECRET_PREFIX):
            env[key] = ref
    env[CLEARED_ENV] = str(int(time.time() if now is None else now))
    return {"env": dict(sorted(env.items()))}


def s3_commands(volume_id: str, data_center: str) -> tuple[str, str]:
    """(list, delete) through RunPod's S3-compatible API: the endpoint URL is per data center
    (https://s3api-<data center, lower case>.runpod.io/), the bucket is the volume's id."""
    where = (f"--region {data_center} --endpoint-url https://s3api-{data_center.lower()}.runpod.io/ "
             f"s3://{volume_id}/{RECORDS_PATH}")
    return f"aws s3 ls --recursive {where}", f"aws s3 rm --recursive {where}"


def worker_lines(events: Iterable[dict[str, Any]], keep: int = 4) -> list[str]:
    """The last `keep` lines of a worker's log that are about the records."""
    found = [str(e.get("line", "")).strip() for e in events if any(m in str(e.get("line", "")) for m in MARKERS)]
    return found[-keep:]
