"""`python build.py fleet-status --repo OWNER/NAME [--branch B] [--path P] [--json]` (its arguments:
images/cli/fleet.py)

The fleet as its pods last reported it (supervisor/fleet/record.py: `fleet/<pod>.json` on the repo's
`kiln-fleet` branch): pod, state, the live config's Hub revision and hash, the last reload verdict,
and how long ago the pod wrote. A pod silent for more than 3 of its heartbeats (`[watch] report_s`)
is shown STALE: it may be down, or cut off from the Hub. Ages are measured with this machine's
clock against the pod's (keep both on NTP).

Also the reader `publish-config --canary/--wait` polls (`FleetReader`), and the table it prints.
Exit: 0 listed (an empty fleet too), 1 the Hub refused or could not be reached, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from supervisor.fleet import record as fleet
from supervisor import hubclient
from supervisor.config import HF_REPO
from supervisor.redact import redact

EXIT_OK, EXIT_HUB, EXIT_USAGE = 0, 1, 2


class FleetReader:
    """The records on the fleet branch, read through huggingface_hub: one listing per read (the
    branch's file list with blob ids: `repo_info`, which takes a timeout and is not retried inside
    the client, so a deadline holds while the Hub is away), and a download only for a record whose
    blob changed since the last read, at that very commit."""

    def __init__(self, api: Any, repo: str, cache_dir: Path, *, timeout_s: float = 10.0):
        self.api = api
        self.repo = repo
        self.cache_dir = cache_dir
        self.timeout_s = timeout_s
        self._by_oid: dict[str, dict[str, Any] | None] = {}

    def read(self) -> list[dict[str, Any]]:
        """Every readable record (an empty list before any pod reported). Raises what the Hub raised
        for anything but a missing fleet branch; a missing repo is an error, not an empty fleet."""
        from huggingface_hub import errors

        try:
            info = self.api.repo_info(self.repo, revision=fleet.FLEET_BRANCH, files_metadata=True,
                                      timeout=self.timeout_s)
        except errors.RevisionNotFoundError:
            return []
        out = []
        for e in info.siblings or []:
            name = e.rfilename
            if not (name.startswith(fleet.RECORDS_DIR + "/") and name.endswith(".json")) \
                    or (e.size or 0) > fleet.MAX_RECORD_BYTES:
                continue
            key = e.blob_id or f"{info.sha}:{name}"
            if key not in self._by_oid:
                self._by_oid[key] = self._download(name, info.sha)
            rec = self._by_oid[key]
            if rec is not None:
                out.append(rec)
        return out

    def _download(self, path: str, commit: str) -> dict[str, Any] | None:
        local = self.api.hf_hub_download(self.repo, path, revision=commit, cache_dir=str(self.cache_dir),
                                         etag_timeout=self.timeout_s)
        try:
            rec = json.loads(Path(local).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) and rec.get("kiln_fleet") == fleet.SCHEMA and rec.get("pod") else None


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _short(rev: Any) -> str:
    return str(rev)[:12] if rev else "-"


def verdict_text(v: Mapping[str, Any] | None, now: float) -> str:
    if not v:
        return "-"
    at = v.get("at")
    when = f" {ago(now - at)}" if isinstance(at, (int, float)) else ""
    cause = f": {str(v.get('cause'))[:60]}" if v.get("cause") and v.get("outcome") not in fleet.OK_OUTCOMES else ""
    return f"{v.get('outcome')} {_short(v.get('revision'))}{when}{cause}"


def table(records: list[Mapping[str, Any]], now: float, *, verdicts: Mapping[str, Any] | None = None) -> str:
    """One line per pod, sorted by pod id. `verdicts` (pod -> verdict) replaces the LAST VERDICT column
    with the verdict on one revision (what `publish-config --wait` waits for)."""
    head = ("POD", "STATE", "REVISION", "CONFIG", "VERDICT" if verdicts is not None else "LAST VERDICT", "REPORTED")
    rows = [head]
    branches = {((r.get("watch") or {}).get("branch"), (r.get("watch") or {}).get("path")) for r in records}
    for r in sorted(records, key=lambda r: str(r.get("pod"))):
        cfg = r.get("config") or {}
        state = str(r.get("state"))
        if fleet.is_stale(r, now) and state not in ("STOPPED",):
            state = f"STALE ({state})"
        v = (verdicts or {}).get(str(r.get("pod"))) if verdicts is not None else r.get("last_reload")
        pod = str(r.get("pod"))
        if len(branches) > 1:
            w = r.get("watch") or {}
            pod += f" [{w.get('branch')}:{w.get('path')}]"
        rows.append((pod, state, _short(cfg.get("revision")) if cfg.get("revision") else str(cfg.get("from") or "-"),
                     _short(cfg.get("hash")), verdict_text(v, now) if v or verdicts is None else "(waiting)",
                     ago(fleet.age_s(r, now))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def main(args: argparse.Namespace) -> int:
    if not re.fullmatch(HF_REPO, args.repo):
        print(f"fleet-status: --repo {args.repo!r} is not OWNER/NAME", file=sys.stderr)
        return EXIT_USAGE
    try:
        token = hubclient.token_or_file(args.token_file)
    except OSError as e:
        print(f"fleet-status: cannot read --token-file: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    if (why := hubclient.endpoint_problem()) is not None:
        print(f"fleet-status: {why}", file=sys.stderr)
        return EXIT_USAGE
    with tempfile.TemporaryDirectory(prefix="kiln-fleet-") as cache:
        try:
            from huggingface_hub import HfApi   # reads HF_ENDPOINT as it loads: a bad one raises here

            records = FleetReader(HfApi(token=token or False), args.repo, Path(cache)).read()
        except Exception as e:  # noqa: BLE001 - one masked line, never a traceback
            print(f"fleet-status: the Hub refused or could not be reached ({hubclient.error_kind(e)}): "
                  f"{redact(hubclient.describe(e), [token])}", file=sys.stderr)
            return EXIT_HUB
    records = [r for r in records if (args.branch is None or (r.get("watch") or {}).get("branch") == args.branch)
               and (args.path is None or (r.get("watch") or {}).get("path") == args.path)]
    if args.json:
        print(json.dumps(sorted(records, key=lambda r: str(r.get("pod"))), indent=1))
        return EXIT_OK
    if not records:
        print(f"no pod reports to hf://{args.repo} yet (nothing in {fleet.RECORDS_DIR}/ on {fleet.FLEET_BRANCH})")
        return EXIT_OK
    now = time.time()
    print(table(records, now))
    stale = sum(1 for r in records if fleet.is_stale(r, now) and r.get("state") != "STOPPED")
    print(f"{len(records)} pod(s) on hf://{args.repo}" + (f", {stale} stale (silent for more than "
                                                           f"{fleet.STALE_HEARTBEATS} heartbeats)" if stale else ""))
    warning = fleet.commit_budget_warning(records, now)
    if warning:
        print(f"fleet-status: {warning}", file=sys.stderr)
    return EXIT_OK
