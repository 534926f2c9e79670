"""A fleet of three pods taking a published config: verdicts on the Hub, canary rollouts, fleet
status. Real processes throughout: three `python -m supervisor run` with the real CPU llama-server
(`-t 1`) and a tiny real GGUF, the `publish-config` and `fleet-status` CLIs, the real
huggingface_hub client in every one of them. The Hub is kiln_dev/hub/, a local stand-in for
huggingface.co speaking the routes huggingface_hub 2.4 uses; its `after_answer` knob acts at an
exact point of the publisher's sequence (the Hub goes away, or the canary dies, the moment the
canary commit has landed), so no test races a pod's poll.

The three pods share one published config: each keeps its own ports and volume through the
environment (KILN_SERVER_PORT) and the boot-only tables (state_dir, [status]), as pods on one
host would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.fleet import record as fleet
from kiln_dev.hub import HubServer, RepoKey, client_env
from kiln_dev.supervised import Supervised, config, fleet_published, free_port, http, wait_for

pytestmark = pytest.mark.llama
ROOT = Path(__file__).resolve().parents[2]
REPO = "kiln-test/fleet"
POLL_S = 0.5
REPORT_S = 2.0              # a pod silent for 3 of these (6 s) is stale
WATCH = f'[watch]\nrepo = "{REPO}"\npoll_s = {POLL_S}\nmax_backoff_s = 1\nreport_s = {REPORT_S}\n'
API_KEY = "sk-fleet-canary-7d1e0b5a"           # the engine's key: must never reach a record
RUNPOD_KEY = "rpa_FLEETCANARY000111222333"
COMMIT = f"/api/models/{REPO}/commit/"
SELFTEST_FAILS = "[selftest]\nenabled = true\ndecode_tokens = 0\nprefill_tokens = 0\n"  # the random model fails it


class Pod:
    def __init__(self, n: int, tmp: Path, prefix: Path, model: Path, hub: HubServer):
        self.id = f"pod-{n}"
        self.dir = tmp / self.id
        self.dir.mkdir()
        self.port, self.sport = free_port(), free_port()
        self.text = deploy(prefix, model, port=self.port, sport=self.sport, state=self.dir / "state")
        self.env = {**hub.env, "RUNPOD_POD_ID": self.id, "KILN_SERVER_PORT": str(self.port), "KILN_API_KEY": API_KEY,
                    "RUNPOD_API_KEY": RUNPOD_KEY}
        self.sup: Supervised | None = None

    def start(self) -> None:
        self.sup = Supervised(self.dir, self.text, env=self.env)

    def status(self) -> dict:
        return self.sup.status() or {}

    def pid(self) -> int | None:
        return (self.status().get("engine") or {}).get("pid")

    def decided(self, revision: str, source: str = "hub") -> dict | None:
        """This pod's decision on `revision`, once it serves again after it."""
        st = self.status()
        hist = (st.get("reload") or {}).get("history") or []
        hit = next((h for h in reversed(hist) if h.get("revision") == revision and h.get("source") == source), None)
        return hit if hit and st.get("state") == "SERVING" else None

    def reloads(self) -> int:
        return [h["event"] for h in self.status().get("history", [])].count("RELOADING")


def deploy(prefix: Path, model: Path, *, port: int, sport: int, state: Path, ctx: int = 512, extra: str = "") -> str:
    rung = f'[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "{ctx}"]\n'
    return config(binary=prefix / "bin/llama-server", model=model, port=port, status_port=sport, state_dir=state,
                  snapshot=prefix / "share/kiln/llama-server.help.txt", rungs=rung, extra=WATCH + extra)




@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub") as server, client_env(server, tmp_path / "home") as ce:
        server.env = ce.env
        yield server


@pytest.fixture
def pods(tmp_path, prefix, tiny, hub):
    """Three pods serving the config on main (their first verdict: unchanged), each reporting."""
    fleet_pods = [Pod(n, tmp_path, prefix, tiny, hub) for n in (1, 2, 3)]
    hub.main0 = hub.seed(REPO, {"deploy.toml": fleet_published(fleet_pods[0].text).encode()})
    try:
        for p in fleet_pods:
            p.start()
        for p in fleet_pods:
            p.sup.wait_state("SERVING", timeout=60)
        wait_for(lambda: all((records(hub).get(p.id) or {}).get("config", {}).get("revision") == hub.main0
                             for p in fleet_pods), 60, "three records on main's revision")
        yield fleet_pods
    finally:
        for p in fleet_pods:
            if p.sup is not None:
                p.sup.__exit__(None, None, None)


def records(hub: HubServer) -> dict[str, dict]:
    head = hub.resolve(REPO, fleet.FLEET_BRANCH)
    if head is None:
        return {}
    files = hub.store.commit(RepoKey("model", REPO), head)["files"]
    return {p[len("fleet/"):-len(".json")]: json.loads(hub.store.blob_path(s).read_bytes())
            for p, s in files.items() if p.startswith("fleet/")}


def cli(hub: HubServer, tmp: Path, *args: str, text: str | None = None, timeout: float = 120):
    argv = [sys.executable, str(ROOT / "build.py"), *args]
    if text is not None:
        f = tmp / "to-publish.toml"
        f.write_text(text)
        argv = [sys.executable, str(ROOT / "build.py"), "publish-config", str(f), "--repo", REPO, *args]
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **hub.env}, cwd=ROOT, timeout=timeout)
    assert hub.token not in r.stdout + r.stderr
    return r


def change(pods: list[Pod], prefix: Path, tiny: Path, **kv) -> str:
    p = pods[0]
    return fleet_published(deploy(prefix, tiny, port=p.port, sport=p.sport, state=p.dir / "state", **kv))


def test_a_good_change_goes_to_the_canary_first_then_the_others_apply_it_within_a_poll(pods, hub, tmp_path, prefix,
                                                                                          tiny):
    promoted: list[float] = []
    hub.after_answer("POST", COMMIT + "main", lambda: promoted.append(time.time()))
    r = cli(hub, tmp_path, "--canary", "1", "--wait", "--timeout", "90", text=change(pods, prefix, tiny, ctx=1024))
    assert r.returncode == 0, r.stdout + r.stderr
    canary = re.search(r"committed to hf://\S+@kiln-canary/main: commit ([0-9a-f]{40})", r.stdout).group(1)
    main = hub.resolve(REPO)
    assert f"promoted deploy.toml to hf://{REPO}@main: commit {main}" in r.stdout
    assert "canary pod(s) pod-1" in r.stdout and "all 3 pod(s) took" in r.stdout
    table = r.stdout.split("to decide")[1]
    assert all(p.id in table for p in pods) and table.count("applied") == 2 and "unchanged" in table
    one, *others = pods
    got = one.decided(canary, fleet.CANARY_SOURCE)
    assert got["outcome"] == "applied" and one.decided(main)["outcome"] == "unchanged"
    assert one.reloads() == 1                                   # the promotion cost the canary nothing
    for p in others:
        assert p.decided(canary, fleet.CANARY_SOURCE) is None   # never took the canary commit
        d = p.decided(main)
        assert d["outcome"] == "applied" and "1024" in p.status()["engine"]["argv"]
        # Seen within one poll interval of the promotion (slack for 2 shared cores), then its own reload.
        assert d["detected_at"] - promoted[0] <= POLL_S + 2.0, (d, promoted)
        assert p.status()["config"]["revision"] == main


def test_a_change_that_fails_its_selftest_on_the_canary_is_rolled_back_there_and_never_reaches_the_others(
        pods, hub, tmp_path, prefix, tiny):
    pids = {p.id: p.pid() for p in pods}
    r = cli(hub, tmp_path, "--canary", "1", "--timeout", "90", text=change(pods, prefix, tiny, extra=SELFTEST_FAILS))
    assert r.returncode == 3, r.stdout + r.stderr
    line = r.stderr.splitlines()[0]
    assert line.startswith("publish-config: canary pod-1 rolled back ") and "selftest_failed" in line
    assert f"not promoted (hf://{REPO}@main:deploy.toml untouched)" in line
    assert "stderr tail:" in r.stderr and len(r.stderr.splitlines()) > 3
    assert hub.resolve(REPO) == hub.main0
    one, *others = pods
    canary = re.search(r"commit ([0-9a-f]{40})", r.stdout).group(1)
    assert one.decided(canary, fleet.CANARY_SOURCE)["outcome"] == "rolled_back"
    # The others saw the assignment close and took nothing: same engines, same revision, no reload.
    closed = hub.resolve(REPO, fleet.canary_branch("main"))
    for p in others:
        wait_for(lambda: (p.status().get("watch", {}).get("hub", {}).get("canary") or {}).get("revision") == closed,
                 20, f"{p.id} read the closed assignment")
        st = p.status()
        assert st["engine"]["pid"] == pids[p.id] and st["config"]["revision"] == hub.main0 and p.reloads() == 0
    rec = wait_for(lambda: (r := records(hub)["pod-1"])["last_reload"]["outcome"] == "rolled_back" and r, 20,
                   "the canary's verdict on the Hub")
    assert rec["last_reload"]["stderr_tail"] and rec["state"] == "SERVING"


def test_a_plain_publish_with_wait_prints_every_pods_verdict_and_says_who_did_not_take_it(pods, hub, tmp_path,
                                                                                          prefix, tiny):
    r = cli(hub, tmp_path, "--wait", "--timeout", "90", text=change(pods, prefix, tiny, extra=SELFTEST_FAILS))
    assert r.returncode == 3, r.stdout + r.stderr
    main = hub.resolve(REPO)
    assert f"waiting up to 90 s for 3 pod(s) to decide {main[:12]}: pod-1, pod-2, pod-3" in r.stdout
    rows = [x for x in r.stdout.splitlines() if x.startswith("pod-")]
    assert len(rows) == 3 and all(f"rolled_back {main[:12]}" in x and "selftest_failed" in x for x in rows), rows
    assert r.stderr.startswith(f"publish-config: 3 of 3 pod(s) did not take {main[:12]}: pod-1 rolled_back: "
                               "selftest_failed")
    assert "stderr tail:" in r.stderr
    for p in pods:                                  # each rolled back to what it served, and serves it
        st = p.status()
        assert st["state"] == "SERVING" and st["config"]["revision"] == hub.main0


def test_a_hub_outage_during_the_rollout_leaves_every_pod_serving_and_the_publisher_says_so(pods, hub, tmp_path,
                                                                                            prefix, tiny):
    pids = {p.id: p.pid() for p in pods}
    hub.after_answer("POST", COMMIT + "kiln-canary", lambda: hub.set_offline(True))
    r = cli(hub, tmp_path, "--canary", "1", "--timeout", "6", text=change(pods, prefix, tiny, ctx=768))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("publish-config: Hub outage: the fleet's verdicts could not be read"), r.stderr
    assert "offline" in r.stderr and "main:deploy.toml untouched" in r.stderr
    for p in pods:
        st = p.status()
        assert st["state"] == "SERVING" and http(p.sup.url("/ready"))[0] == 200
        assert st["watch"]["hub"]["consecutive_errors"] >= 1
    for p in pods[1:]:
        assert p.pid() == pids[p.id]
    back = time.time()
    hub.set_offline(False)
    # Writes resume (huggingface_hub retries a failed upload itself for ~20 s first).
    wait_for(lambda: all(records(hub)[p.id]["reported_at"] > back for p in pods), 60, "a record after the outage")
    assert all(p.status()["watch"]["report"]["unreachable_since"] is None for p in pods)
    assert "kiln_fleet_report_consecutive_errors 0" in http(pods[0].sup.url("/metrics"))[1].decode()


def test_a_killed_canary_makes_the_rollout_time_out_and_says_it_went_silent(pods, hub, tmp_path, prefix, tiny):
    one, *others = pods
    pids = {p.id: p.pid() for p in others}
    hub.after_answer("POST", COMMIT + "kiln-canary", lambda: one.sup.proc.send_signal(signal.SIGKILL))
    r = cli(hub, tmp_path, "--canary", "1", "--timeout", "10", text=change(pods, prefix, tiny, ctx=768))
    assert r.returncode == 4, r.stdout + r.stderr
    line = r.stderr.splitlines()[0]
    assert line.startswith("publish-config: timed out after 10 s: no verdict on canary commit ")
    assert "pod-1 (last report" in line and "stale: silent for more than 3 heartbeats" in line
    assert "not promoted" in line and hub.resolve(REPO) == hub.main0
    for p in others:
        assert p.status()["state"] == "SERVING" and p.pid() == pids[p.id]


def test_fleet_status_lists_every_pod_with_its_revision_and_shows_a_silent_one_stale(pods, hub, tmp_path):
    r = cli(hub, tmp_path, "fleet-status", "--repo", REPO)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["POD", "STATE", "REVISION"]
    for p, line in zip(pods, lines[1:4]):
        assert line.split()[:3] == [p.id, "SERVING", hub.main0[:12]], line
        assert "unchanged" in line
    assert lines[-1] == f"3 pod(s) on hf://{REPO}"
    for body in map(json.dumps, records(hub).values()):      # nothing secret ever reached the Hub
        assert API_KEY not in body and RUNPOD_KEY not in body and hub.token not in body
    pods[2].sup.proc.send_signal(signal.SIGKILL)
    out = wait_for(lambda: (s := cli(hub, tmp_path, "fleet-status", "--repo", REPO).stdout)
                   and "STALE (SERVING)" in s and s, 30, "pod-3 shown stale")
    assert "pod-3" in next(x for x in out.splitlines() if "STALE" in x)
    assert "1 stale (silent for more than 3 heartbeats)" in out
    pods[1].sup.stop()                                        # a clean stop says so before it goes
    assert wait_for(lambda: records(hub)["pod-2"]["state"] == "STOPPED", 10, "pod-2's last record")
