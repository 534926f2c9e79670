"""Faults and bad input against the real supervisor (issue 18), each driven the way it was seen:
a reload that downloads a model never blinds the loop, only our engine counts as healthy, nothing
of a killed supervisor outlives it, a port collision or a half-written file or a symlink out of
the watch dir is caught before anything is stopped, and a missing engine is explained, not a
traceback. Real processes: `python -m supervisor run`, the CPU llama-server, tiny real GGUFs, the
Hub stand-in (kiln_dev/hub/, standing for huggingface.co) behind a throttled link
(kiln_dev/throttle.py, standing for a slow CDN), and the recorded-output engine stand-in only
where a CPU cannot hang a load (kiln_dev/fake_llama_server.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kiln_dev.hub import HubServer, client_env
from kiln_dev.models import make_tiny_gguf
from kiln_dev.supervised import FAKE, Supervised, config, free_port, http, wait_for
from kiln_dev.throttle import Throttle

pytestmark = pytest.mark.llama
WRITER_PACE_S = 0.5          # how fast the careless publisher writes its chunks (the stimulus, not a wait)


def rung(args: list[str] | None = None, env: dict[str, str] | None = None) -> str:
    out = (f'[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\n'
           f'args = {json.dumps(args or ["-t", "1", "-c", "512"])}\n')
    if env:
        out += "[ladder.rungs.env]\n" + "".join(f'{k} = "{v}"\n' for k, v in env.items())
    return out


class Pod:
    def __init__(self, tmp: Path, prefix: Path, model: Path | str):
        self.tmp, self.prefix, self.model = tmp, prefix, model
        self.port, self.sport = free_port(), free_port()
        self.dir = tmp / "published"
        self.state = tmp / "state"

    def text(self, *, model: str | Path | None = None, args: list[str] | None = None, binary: str | None = None,
             rung_env: dict[str, str] | None = None, extra: str = "", watch: bool = True, port: int | None = None,
             status: bool = True) -> str:
        src = str(model or self.model)
        text = config(binary=binary or str(self.prefix / "bin/llama-server"), model=src, port=port or self.port,
                      status_port=self.sport, state_dir=self.state, rungs=rung(args, rung_env),
                      snapshot=str(self.prefix / "share/kiln/llama-server.help.txt"),
                      extra=(f'[watch]\ndir = "{self.dir}"\ndebounce_s = 0.2\n' if watch else "") + extra)
        if src.startswith("hf://"):
            text = text.replace(f'source = "{src}"', f'source = "{src}"\nentry = "*.gguf"\nfetch_stall_s = 30')
        if not status:
            text = text[:text.index("[status]")]
        return text

    def publish(self, text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / ".deploy.toml.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / "deploy.toml")


def decided(sup: Supervised, status: dict | None = None) -> list[dict]:
    """The reload decisions /status shows: of `status` when given (one snapshot for every check)."""
    return (((status if status is not None else sup.status()) or {}).get("reload") or {}).get("history") or []


def test_an_engine_killed_while_a_reload_downloads_its_model_is_restarted_at_once(tmp_path, prefix, tiny):
    big = make_tiny_gguf(tmp_path / "big.gguf", n_layers=4, width=256, n_ff=1024)   # ~9 MB
    with HubServer(tmp_path / "hub") as hub, client_env(hub, tmp_path / "home") as ce:
        hub.seed("kiln-test/big", {"big.gguf": big.read_bytes()})
        with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=1_000_000) as slow:
            pod = Pod(tmp_path, prefix, tiny)
            # One connection at 1 MB/s: the ~9 MB download takes ~9 s (the fetch is parallel by default).
            env = {**ce.env, "HF_ENDPOINT": slow.url, "KILN_MODEL_FETCH_CONNECTIONS": "1"}
            with Supervised(tmp_path, pod.text(), env=env) as sup:
                first = sup.wait_state("SERVING")["engine"]["pid"]
                pod.publish(pod.text(model="hf://kiln-test/big"))
                wait_for(lambda: ((sup.status() or {}).get("model_candidate") or {}).get("fetch"), 30,
                         "the published config's model downloading")
                os.kill(first, signal.SIGKILL)
                # Seen while the download still runs: /ready drops, the engine is restarted.
                wait_for(lambda: http(sup.url("/ready"))[0] == 503, 5, "/ready reflecting the dead engine")
                st = wait_for(lambda: (s := sup.status()) and s["state"] == "SERVING"
                              and s["engine"]["pid"] != first and s, 30, "the engine restarted")
                assert st["failures"].get("crashed") == 1 and st["restarts"] == 1
                assert decided(sup) == [], "the reload was decided before its model arrived"
                # The download goes on, and the published config is applied once its model is in.
                st = wait_for(lambda: (s := sup.status()) and decided(sup, s) and s["state"] == "SERVING" and s, 60,
                              "the published config applied")
                assert st["reload"]["last"]["outcome"] == "applied"
                assert st["model"]["source"] == "hf://kiln-test/big"
                assert sup.stop() == 0


def test_a_foreign_listener_on_the_engine_port_is_port_in_use_and_never_healthy(tmp_path, prefix, tiny):
    site = tmp_path / "site"
    site.mkdir()
    (site / "health").write_text("ok")                   # GET /health answers 200
    port = free_port()
    foreign = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                               cwd=site, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{port}/health")[0] == 200, 10, "the foreign server")
        pod = Pod(tmp_path, prefix, tiny)
        with Supervised(tmp_path, pod.text(port=port, watch=False)) as sup:
            st = sup.wait_state("FAILED")
            assert st["last_failure"]["class"] == "port_in_use"
            assert f"pid {foreign.pid}" in st["last_failure"]["reason"] and "not our engine" in st["last_failure"]["reason"]
            assert st["launches"] == 0 and not any(h["event"] == "HEALTHY" for h in st["history"])
            assert sup.stop() == 3
    finally:
        foreign.kill()
        foreign.wait(10)


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def test_a_sigkilled_supervisor_takes_its_engine_with_it(tmp_path, prefix, tiny):
    # The real llama-server, idle after loading, writes nothing: without a parent-death signal it
    # would outlive the supervisor (the next test shows it does) and keep the port.
    pod = Pod(tmp_path, prefix, tiny)
    with Supervised(tmp_path, pod.text(watch=False)) as sup:
        engine = sup.wait_state("SERVING")["engine"]["pid"]
        sup.proc.send_signal(signal.SIGKILL)
        sup.proc.wait(10)
        wait_for(lambda: not _alive(engine), 10, "the engine ended by its parent-death signal")


def test_the_next_supervisor_ends_the_engine_a_killed_one_left_and_serves_its_own(tmp_path, prefix, tiny):
    # As on a platform without a parent-death signal: only the journal in the volume remains.
    pod = Pod(tmp_path, prefix, tiny)
    with Supervised(tmp_path, pod.text(watch=False), env={"KILN_NO_PDEATHSIG": "1"}) as sup:
        leftover = sup.wait_state("SERVING")["engine"]["pid"]
        sup.proc.send_signal(signal.SIGKILL)
        sup.proc.wait(10)
    try:
        # The leftover still holds the port and answers: exactly what the next supervisor must not trust.
        assert _alive(leftover) and http(f"http://127.0.0.1:{pod.port}/health")[0] == 200
        with Supervised(tmp_path, pod.text(watch=False)) as sup:
            st = sup.wait_state("SERVING", timeout=60)
            assert st["engine"]["pid"] != leftover and not _alive(leftover)
            assert f"ending a leftover engine of an earlier supervisor: pid {leftover}" in sup.log()
            assert [h["event"] for h in st["history"]].count("HEALTHY") == 1
            assert sup.stop() == 0
    finally:
        if _alive(leftover):
            psutil.Process(leftover).kill()


def test_a_config_that_moves_the_engine_onto_the_status_port_is_rejected_before_anything_stops(tmp_path, prefix,
                                                                                              tiny):
    pod = Pod(tmp_path, prefix, tiny)
    with Supervised(tmp_path, pod.text()) as sup:
        first = sup.wait_state("SERVING")["engine"]["pid"]
        # No [status] table: the defaults' port is not the one running, so only a check on the config
        # as it will run (the running [status] put back) sees the collision.
        pod.publish(pod.text(port=pod.sport, status=False))
        wait_for(lambda: decided(sup), 30, "a decision")
        st = sup.status()
        assert st["reload"]["last"]["outcome"] == "rejected"
        assert "status.port: must differ from server.port" in st["reload"]["last"]["cause"]
        assert st["engine"]["pid"] == first and st["launches"] == 1
        assert sup.stop() == 0


def test_a_config_written_in_place_in_chunks_is_read_once_when_complete(tmp_path, prefix, tiny):
    pod = Pod(tmp_path, prefix, tiny)
    with Supervised(tmp_path, pod.text()) as sup:
        sup.wait_state("SERVING")
        text = pod.text(args=["-t", "1", "-c", "1024"])
        cut = text.index("[selftest]")          # the second chunk is valid TOML without its last tables
        chunks = [text[:cut // 2], text[cut // 2:cut], text[cut:]]
        pod.dir.mkdir(parents=True, exist_ok=True)
        with open(pod.dir / "deploy.toml", "w") as f:        # in place, one writer, pauses between chunks
            for chunk in chunks:
                f.write(chunk)
                f.flush()
                time.sleep(WRITER_PACE_S)
        st = wait_for(lambda: (s := sup.status()) and decided(sup, s) and s["state"] == "SERVING" and s, 30,
                      "the complete config decided")
        assert [h["outcome"] for h in decided(sup)] == ["applied"], decided(sup)
        assert "1024" in st["engine"]["argv"] and st["launches"] == 2
        assert sup.stop() == 0


def test_a_symlink_out_of_the_watch_dir_is_refused_and_its_target_never_copied(tmp_path, prefix, tiny):
    secret = tmp_path / "shadow"
    secret.write_text("root:TOPSECRET-HASH:19000:0:99999:7:::\n")
    pod = Pod(tmp_path, prefix, tiny)
    with Supervised(tmp_path, pod.text()) as sup:
        first = sup.wait_state("SERVING")["engine"]["pid"]
        pod.dir.mkdir(parents=True, exist_ok=True)
        os.symlink(secret, pod.dir / "deploy.toml")
        wait_for(lambda: decided(sup), 30, "a decision")
        st = sup.status()
        assert st["reload"]["last"]["outcome"] == "rejected" and "outside the watch dir" in st["reload"]["last"]["cause"]
        assert st["engine"]["pid"] == first
        kept = pod.state / "reload" / "last-rejected.toml"
        assert not kept.exists() or b"TOPSECRET" not in kept.read_bytes()
        assert "TOPSECRET" not in json.dumps(st) and "TOPSECRET" not in sup.log()
        # A loop shows too, instead of nothing.
        (pod.dir / "deploy.toml").unlink()
        os.symlink("deploy.toml", pod.dir / "deploy.toml")
        wait_for(lambda: len(decided(sup)) >= 2, 30, "the loop decided")
        st = sup.status()
        assert "symlink loop" in st["reload"]["last"]["cause"] and "symlink loop" in st["watch"]["local"]["last_error"]
        assert sup.stop() == 0


def test_a_missing_engine_binary_is_failed_and_explained_on_status_not_a_traceback(tmp_path, prefix, tiny):
    pod = Pod(tmp_path, prefix, tiny)
    with Supervised(tmp_path, pod.text(binary=str(tmp_path / "no-such-llama-server"), watch=False)) as sup:
        st = sup.wait_state("FAILED")
        assert st["last_failure"]["class"] == "engine_missing"
        assert "no-such-llama-server" in st["last_failure"]["reason"] and "server.binary" in st["last_failure"]["reason"]
        assert http(sup.url("/live"))[0] == 200                # PID 1 stays up to say why
        assert "Traceback" not in sup.log()
        assert sup.stop() == 3
