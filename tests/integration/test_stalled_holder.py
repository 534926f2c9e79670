"""A frozen lock holder on a shared volume (issue 37, item 15), with real processes: two `python -m
supervisor run` Serverless workers on one volume, the CPU llama-server, and the Hub stand-in
(kiln_dev/hub/, standing for huggingface.co) behind a throttled link (kiln_dev/throttle.py, standing
for a slow CDN). The holder's whole tree is stopped (SIGSTOP, as a frozen container is): the waiter
judges it by what it moves on the volume and takes over once it moved nothing for the stall window;
thawed (SIGCONT), the holder does not count the stopped time against its own download and serves too.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from kiln_dev.hub import HubServer, client_env
from kiln_dev.models import make_tiny_gguf
from kiln_dev.supervised import SELFTEST_OFF, Supervised, config, free_port, wait_for
from kiln_dev.throttle import Throttle

pytestmark = pytest.mark.llama
REPO = "kiln-test/tiny"
STALL_S = 6


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub") as server, client_env(server, tmp_path / "home") as ce:
        server.env = ce.env
        yield server


def worker(tmp: Path, prefix: Path, name: str, env: dict[str, str]) -> Supervised:
    model, health = f"hf://{REPO}", free_port()
    text = config(binary=str(prefix / "bin/llama-server"), model=model, port=free_port(), status_port=health,
                  state_dir=tmp / "image-default", snapshot=str(prefix / "share/kiln/llama-server.help.txt"),
                  selftest=SELFTEST_OFF,
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "512"]\n')
    text = text.replace(f'source = "{model}"', f'source = "{model}"\nentry = "*.gguf"\nfetch_stall_s = {STALL_S}')
    home = tmp / name
    home.mkdir()
    return Supervised(home, text, env={**env, "RUNPOD_ENDPOINT_ID": "ep-test", "RUNPOD_POD_ID": name,
                                       "PORT": str(free_port()), "PORT_HEALTH": str(health), "KILN_API_KEY": "k-stalled-holder"})


def fetch_event(sup: Supervised) -> dict:
    return (((sup.status() or {}).get("model") or {}).get("fetch")) or {}


def tree(sup: Supervised) -> list[psutil.Process]:
    """The worker's whole container, as far as signals go: the supervisor and every descendant."""
    me = psutil.Process(sup.proc.pid)
    return [me, *me.children(recursive=True)]


def test_a_frozen_holder_is_taken_over_and_thawed_finishes_its_own_download(tmp_path, prefix, hub):
    model = make_tiny_gguf(tmp_path / "wider.gguf", n_layers=4, width=128, n_ff=512)   # ~2 MB
    hub.seed(REPO, {"tiny.gguf": model.read_bytes()}, storage="lfs")
    volume = tmp_path / "runpod-volume"
    volume.mkdir()
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=100_000) as slow:
        env = {**hub.env, "HF_ENDPOINT": slow.url, "KILN_MODEL_FETCH_CONNECTIONS": "1",
               "KILN_SERVERLESS_VOLUME": str(volume)}
        a = worker(tmp_path, prefix, "wa", env)
        with a:
            wait_for(lambda: fetch_event(a).get("done", 0) >= 256 << 10, 90, "wa to have bytes on the volume")
            b = worker(tmp_path, prefix, "wb", env)
            with b:
                wait_for(lambda: fetch_event(b).get("event") == "waiting", 60, "wb to wait for wa")
                frozen = tree(a)
                for p in frozen:
                    p.send_signal(signal.SIGSTOP)          # the holder's container freezes, lock and all
                try:
                    # The waiter takes over after the stall window and serves (before: `waiting`, for ever).
                    st = b.wait_state("SERVING", timeout=120)
                    assert st["model"]["path"].startswith(str(volume / "kiln/hf/"))
                    assert "model fetch: event=take_over from=worker wa " in b.log()
                    assert all(p.status() == psutil.STATUS_STOPPED for p in frozen)   # wa was frozen throughout
                finally:
                    for p in reversed(frozen):
                        p.send_signal(signal.SIGCONT)
                # Thawed, the holder's own download goes on (before: failed at once, "moved no byte for 6 s").
                st = a.wait_state("SERVING", "FAILED", timeout=120)
                assert st["state"] == "SERVING", st.get("last_failure")
                assert os.path.samefile(st["model"]["path"], b.status()["model"]["path"])
                assert b.stop() == 0
            assert a.stop() == 0


BODY_ROUTES = ("resolve_get", "cdn_get", "xorb_get")       # what a download costs the Hub (test_fetch.py)


def served(hub: HubServer) -> int:
    return sum(hub.bytes_served[r] for r in BODY_ROUTES)


def asked(hub: HubServer, since: int, size: int) -> int:
    """The body bytes the Hub was asked for in its requests after the first `since` (their Range headers;
    a GET without one asks for the whole file)."""
    total = 0
    for rec in list(hub.log)[since:]:
        if rec.method != "GET" or rec.route not in BODY_ROUTES or rec.status not in (200, 206):
            continue
        lo, _, hi = (rec.range or "").removeprefix("bytes=").partition("-")
        total += (int(hi) if hi else size - 1) - int(lo or 0) + 1
    return total


def test_three_waiters_of_one_frozen_holder_take_over_once_and_the_others_wait_for_the_taker(
        tmp_path, prefix, hub):
    # Issue 50 item 8b: every waiter that judged the holder stalled downloaded beside it, so three waiters
    # taking over in the same second fetched the model three times over (with the holder's part, 3.5x its
    # bytes from the Hub). Now one claims the takeover and the others wait on it, as on any holder.
    model = make_tiny_gguf(tmp_path / "wider.gguf", n_layers=4, width=128, n_ff=512)   # ~2.5 MB, 3 segments
    size = len(model.read_bytes())
    hub.seed(REPO, {"tiny.gguf": model.read_bytes()}, storage="lfs")
    volume = tmp_path / "runpod-volume"
    volume.mkdir()
    port = int(hub.url.rsplit(":", 1)[1])
    # The holder's link is slow (its download is far from done while three workers boot); the waiters'
    # is faster (what they fetch after the takeover is over in seconds).
    with Throttle(port, bytes_per_s=50_000, chunk=16 << 10) as slow, Throttle(port, bytes_per_s=200_000) as fast:
        env = {**hub.env, "KILN_MODEL_FETCH_CONNECTIONS": "1", "KILN_SERVERLESS_VOLUME": str(volume)}
        a = worker(tmp_path, prefix, "wa", {**env, "HF_ENDPOINT": slow.url})
        with a:
            wait_for(lambda: fetch_event(a).get("moved", 0) >= 64 << 10, 90, "wa to have bytes on the volume")
            waiters = [worker(tmp_path, prefix, name, {**env, "HF_ENDPOINT": fast.url}) for name in ("wb", "wc", "wd")]
            frozen: list[psutil.Process] = []
            try:
                for w in waiters:
                    wait_for(lambda: fetch_event(w).get("event") == "waiting", 60, f"{w.tmp.name} to wait for wa")
                frozen = tree(a)
                for p in frozen:
                    p.send_signal(signal.SIGSTOP)          # the holder's container freezes, lock and all
                since, at_freeze = len(hub.log), served(hub)
                for w in waiters:
                    st = w.wait_state("SERVING", timeout=180)
                    assert st["model"]["path"].startswith(str(volume / "kiln/hf/"))
                after, bytes_after = asked(hub, since, size), served(hub) - at_freeze
                logs = {w.tmp.name: w.log() for w in waiters}
                took = [n for n, log in logs.items() if "model fetch: event=take_over from=worker wa " in log]
                print(f"\nHub: model {size} bytes; after the freeze asked for {after} ({after / size:.2f}x the "
                      f"model), sent {bytes_after} ({bytes_after / size:.2f}x; the frozen holder's open "
                      f"request included); before it sent {at_freeze}; took over: {took}")
                assert len(took) == 1, {n: [x for x in log.splitlines() if "model fetch:" in x][-6:]
                                        for n, log in logs.items()}
                for n, log in logs.items():
                    if n not in took:                # waited on the taker, then reused its files
                        assert f"model fetch: event=waiting for=worker {took[0]} " in log, log
                assert after <= size, (after, size)          # once at most, not once per waiter
                assert all(p.status() == psutil.STATUS_STOPPED for p in frozen)   # wa frozen throughout
            finally:
                for p in reversed(frozen):
                    p.send_signal(signal.SIGCONT)
                for w in waiters:
                    w.__exit__(None, None, None)
