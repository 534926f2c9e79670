"""A Kiln supervisor as a RunPod Serverless load-balancing worker, with real processes: `python -m
supervisor run` with PORT / PORT_HEALTH set as RunPod sets them, the CPU llama-server, SmolLM2 (or a
tiny random GGUF that fails its selftest), and the Hub stand-in (kiln_dev/hub/) for a model fetched
into the volume. The health path answers 204 until the selftest passed, 200 while serving, 204
again through a restart, 503 when the worker can never serve; such a worker exits after its grace
and records why, and once two workers failed the same way the next exits without fetching anything. Workers sharing one
volume download a model once (the others wait for it) and keep their own state apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from images.runpod import failures
from kiln_dev.hub import HubServer, client_env
from kiln_dev.models import smollm2_gguf
from kiln_dev.supervised import REPO_ROOT, SELFTEST_OFF, Supervised, config, free_port, http, wait_for
from kiln_dev.throttle import Throttle

pytestmark = pytest.mark.llama
CANARY = "kiln-serverless-canary-5c1e"
MODEL_REPO = "kiln-test/tiny"
SELFTEST_SMALL = ('[selftest]\nprobes = "smollm2"\ndecode_tokens = 32\nprefill_tokens = 200\n'
                  'request_wall_s = 30\ntimeout_s = 300\n')
SELFTEST_FAILS = "[selftest]\nenabled = true\ndecode_tokens = 0\nprefill_tokens = 0\n"   # a random model fails it


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub") as server, client_env(server, tmp_path / "home") as ce:
        server.env = ce.env
        yield server


def worker(tmp: Path, prefix: Path, model: str, *, state: Path, selftest: str, name: str,
           env: dict[str, str] | None = None, grace_s: float = 60.0) -> Supervised:
    """One worker as RunPod starts it: PORT the API, PORT_HEALTH the health path, RUNPOD_ENDPOINT_ID."""
    api, health = free_port(), free_port()
    text = config(binary=str(prefix / "bin/llama-server"), model=model, port=free_port(), status_port=health,
                  state_dir=state, snapshot=str(prefix / "share/kiln/llama-server.help.txt"), selftest=selftest,
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "2048"]\n')
    if model.startswith("hf://"):
        text = text.replace(f'source = "{model}"', f'source = "{model}"\nentry = "*.gguf"\nfetch_stall_s = 20')
    home = tmp / name
    home.mkdir()
    sup = Supervised(home, text, env={"PORT": str(api), "PORT_HEALTH": str(health), "RUNPOD_ENDPOINT_ID": "ep-test",
                                      "RUNPOD_POD_ID": name, "KILN_API_KEY": CANARY,
                                      "KILN_SERVERLESS_EXIT_GRACE_S": str(grace_s), **(env or {})})
    sup.api_port = api
    return sup


def ping(sup: Supervised, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(sup.url("/ping"), method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


class Poller:
    """The load balancer's view: the health path's answers, in order, each change once."""

    def __init__(self, sup: Supervised):
        self.sup, self.codes, self._stop = sup, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            code = ping(self.sup)[0]
            if code and (not self.codes or self.codes[-1] != code):
                self.codes.append(code)
            self._stop.wait(0.02)

    def stop(self) -> list[int]:
        self._stop.set()
        self.thread.join(10)
        return self.codes


def test_the_health_path_says_initializing_until_the_selftest_passed_then_healthy_and_initializing_through_a_restart(
        tmp_path, prefix):
    with worker(tmp_path, prefix, str(smollm2_gguf()), state=tmp_path / "vol", selftest=SELFTEST_SMALL,
                name="w1") as sup:
        poll = Poller(sup)
        st = sup.wait_state("SELFTEST", "SERVING", timeout=180)
        if st["state"] == "SELFTEST":
            assert ping(sup) == (204, b"") and ping(sup, "HEAD") == (204, b"")
        st = sup.wait_state("SERVING", timeout=180)
        assert ping(sup) == (200, b"ok\n") and ping(sup, "HEAD") == (200, b"")
        assert st["config"]["hash"] and st["engine"]["port"] == sup.api_port          # the API is on PORT
        wait_for(lambda: poll.codes and poll.codes[-1] == 200, 10, "the poller to see 200")
        assert poll.codes == [204, 200], poll.codes                                   # never unhealthy on the way
        body = json.dumps({"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8}).encode()
        code, reply = http(f"http://127.0.0.1:{sup.api_port}/v1/chat/completions", data=body,
                           headers={"Authorization": f"Bearer {CANARY}", "Content-Type": "application/json"})
        assert code == 200 and json.loads(reply)["choices"][0]["message"]["content"]
        # The engine dies: the worker restarts it, saying "initializing" meanwhile, never "unhealthy".
        os.kill(st["engine"]["pid"], signal.SIGKILL)
        sup.wait_state("RESTARTING", "LAUNCHING", "LOADING", "HEALTHY", "SELFTEST", timeout=30)
        wait_for(lambda: (s := sup.status()) and s["state"] == "SERVING" and s["restarts"] == 1, 180,
                 "the restarted engine to serve")
        wait_for(lambda: poll.codes[-1] == 200, 10, "the poller to see 200 again")
        assert poll.stop() == [204, 200, 204, 200], poll.codes
        assert sup.stop() == 0
        assert CANARY not in sup.log()


def test_a_worker_that_can_never_serve_is_unhealthy_exits_after_its_grace_and_once_two_did_the_next_fetches_nothing(
        tmp_path, prefix, tiny, hub):
    hub.seed(MODEL_REPO, {"tiny.gguf": tiny.read_bytes()})
    volume = tmp_path / "vol"
    grace = 3.0
    first = worker(tmp_path, prefix, f"hf://{MODEL_REPO}", state=volume, selftest=SELFTEST_FAILS, name="w1",
                   env=hub.env, grace_s=grace)
    with first:
        st = first.wait_state("FAILED", timeout=120)
        failed_at = st["since"]                                   # when it failed, not when the test saw it
        assert st["last_failure"]["class"] == "selftest_failed"
        code, body = ping(first)
        assert code == 503 and b"last_failure=selftest_failed" in body and ping(first, "HEAD")[0] == 503
        assert first.proc.wait(grace + 60) == 3                   # nothing was ever served
        assert time.time() - failed_at >= grace - 0.5             # it stayed to say so, then left
        log = first.log()
        said = log.index("serverless worker: it can never serve (selftest_failed: selftest: ")
        assert said < log.index("state STOPPING: released") and "/ping on port" in log[said:]
        assert "exits in 3 s" in log[said:]
    records = list((volume / "serverless/failures").glob("*/*.json"))
    assert [r.name for r in records] == ["w1.json"]               # one witness per worker
    record = json.loads(records[0].read_text())
    assert record["class"] == "selftest_failed" and record["worker"] == "w1"
    assert hub.env["HF_TOKEN"] not in records[0].read_text() + first.log()
    assert record["key_of"]["config_hash"] == st["config"]["hash"]

    # Issue 37 item 2: one worker's failure may be its host's; the second worker still tries, and fails
    # the same way: now the failure is the image's, config's and GPU kind's.
    second = worker(tmp_path, prefix, f"hf://{MODEL_REPO}", state=volume, selftest=SELFTEST_FAILS, name="w2",
                    env=hub.env, grace_s=grace)
    with second:
        st = second.wait_state("FAILED", timeout=120)
        assert "recorded on the shared volume" not in st["last_failure"]["reason"]
        assert second.proc.wait(grace + 60) == 3
        assert "state LAUNCHING" in second.log()                           # it loaded the model itself
    assert sorted(r.name for r in (volume / "serverless/failures").glob("*/*.json")) == ["w1.json", "w2.json"]

    hub.reset_counts()
    third = worker(tmp_path, prefix, f"hf://{MODEL_REPO}", state=volume, selftest=SELFTEST_FAILS, name="w3",
                   env=hub.env, grace_s=grace)
    with third:
        st = third.wait_state("FAILED", timeout=60)
        assert ping(third)[0] == 503
        assert st["last_failure"]["class"] == "selftest_failed"
        assert "by workers w1 and w2" in st["last_failure"]["reason"]
        assert third.proc.wait(grace + 60) == 3
        log = third.log()
        assert "state FETCH" not in log and "state LAUNCHING" not in log     # neither downloaded nor loaded
    assert sum(hub.counts.values()) == 0, dict(hub.counts)                 # not one request to the Hub
    assert not list((volume / "serverless/failures").glob("*/w3.json"))   # a refusal is no witness
    # what `endpoint failures` reads of a worker's log (images/runpod/failures.py): the witness, the refusal
    assert any("failure recorded at" in x for x in records_said(first))
    assert any("recorded on the shared volume by workers w1 and w2" in x for x in records_said(third))

    # `endpoint failures --clear` sets the mark on the endpoint's env: a worker of that release ignores the
    # records written before it, deletes them, and loads again (its own failure is a new witness).
    mark = str(int(time.time()) + 1)
    wait_for(lambda: time.time() > int(mark), 5, "the mark to pass")
    fourth = worker(tmp_path, prefix, f"hf://{MODEL_REPO}", state=volume, selftest=SELFTEST_FAILS, name="w4",
                    env={**hub.env, failures.CLEARED_ENV: mark}, grace_s=grace)
    with fourth:
        st = fourth.wait_state("FAILED", timeout=120)
        assert "recorded on the shared volume" not in st["last_failure"]["reason"]
        assert fourth.proc.wait(grace + 60) == 3
        assert "state LAUNCHING" in fourth.log()
        assert any("deleted 2 failure record(s) written before" in x for x in records_said(fourth))
    assert [r.name for r in (volume / "serverless/failures").glob("*/*.json")] == ["w4.json"]
    assert CANARY not in first.log() + second.log() + third.log() + fourth.log()


def test_a_worker_that_served_clears_the_failures_before_it_so_two_transient_ones_block_nobody(tmp_path, prefix):
    # Issue 50 item 8a: an OOM on one worker, then workers serving with the same image, config and GPU kind,
    # then an OOM on another: the two witnesses blocked the key for the whole failure_ttl_s (1800 s) and
    # every later worker failed at once. A worker that served (its selftest passed) clears them.
    from supervisor.failure import Failure, FailureClass
    from supervisor.serverless import failures as records

    volume, model = tmp_path / "vol", str(smollm2_gguf())

    def oom(key: str, name: str) -> Path:         # a transient OOM, as the failing worker writes it
        return records.record(volume, key, Failure(FailureClass.OOM, "CUDA out of memory", rung="cpu"),
                              reason="CUDA out of memory (a leaked process beside it)", worker=name,
                              now=time.time(), about={"image": "dev"})

    with worker(tmp_path, prefix, model, state=volume, selftest=SELFTEST_SMALL, name="wa") as wa:
        st = wa.wait_state("SERVING", timeout=180)
        key = st["serverless"]["failure_key"]       # this image, config and GPU kind (none here: CPU)
        assert wa.stop() == 0
    first = oom(key, "w1")
    with worker(tmp_path, prefix, model, state=volume, selftest=SELFTEST_SMALL, name="wb") as wb:
        st = wb.wait_state("SERVING", timeout=180)
        assert st["selftest"]["passed"] is True
        wait_for(lambda: not first.exists(), 30, "wb's serve to clear w1's witness")
        wait_for(lambda: (wb.status() or {}).get("serverless", {}).get("witnesses_cleared") == 1, 10,
                 "wb to say on /status that it cleared one witness")
        assert any("deleted 1 failure witness(es)" in x for x in records_said(wb))   # what `endpoint failures` shows
        assert wb.stop() == 0
    second = oom(key, "w3")
    with worker(tmp_path, prefix, model, state=volume, selftest=SELFTEST_SMALL, name="wc") as wc:
        st = wc.wait_state("SERVING", "FAILED", timeout=180)
        assert st["state"] == "SERVING", st["last_failure"]      # before: "by workers w1 and w3", for 1800 s
        wait_for(lambda: not second.exists(), 30, "wc's serve to clear w3's witness")
        assert wc.stop() == 0
    assert [p.name for p in (volume / "serverless/failures" / key).iterdir()] == [records.SERVED_MARK]


def records_said(sup: Supervised) -> list[str]:
    return failures.worker_lines({"line": line} for line in sup.log().splitlines())


BODY_ROUTES = ("resolve_get", "cdn_get", "xorb_get")       # what a download costs the Hub (test_fetch.py)


def fetch_event(sup: Supervised) -> dict:
    st = sup.status() or {}
    return (st.get("model") or {}).get("fetch") or {}


def test_two_workers_cold_starting_on_one_volume_download_the_model_once_and_keep_their_own_state(
        tmp_path, prefix, tiny, hub):
    body = tiny.read_bytes()
    hub.seed(MODEL_REPO, {"tiny.gguf": body}, storage="lfs")
    volume = tmp_path / "runpod-volume"
    volume.mkdir()
    # A slow link (one connection at 50 KB/s: ~10 s for the model) holds the first download open
    # while the second worker starts.
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=50_000) as slow:
        env = {**hub.env, "HF_ENDPOINT": slow.url, "KILN_MODEL_FETCH_CONNECTIONS": "1",
               "KILN_SERVERLESS_VOLUME": str(volume), "KILN_API_KEY": ""}
        a = worker(tmp_path, prefix, f"hf://{MODEL_REPO}", state=tmp_path / "image-default", selftest=SELFTEST_OFF,
                   name="wa", env=env)
        with a:
            wait_for(lambda: fetch_event(a).get("event") == "progress" and fetch_event(a).get("done", 0) > 0,
                     60, "worker wa to be downloading")
            b = worker(tmp_path, prefix, f"hf://{MODEL_REPO}", state=tmp_path / "image-default", selftest=SELFTEST_OFF,
                       name="wb", env=env)
            with b:
                waiting = wait_for(lambda: (ev := fetch_event(b)).get("event") == "waiting" and ev,
                                   60, "worker wb to say on /status that it waits for wa's download")
                assert waiting["for"].startswith("worker wa ") and "reused" in waiting["why"]
                sa, sb = a.wait_state("SERVING", timeout=120), b.wait_state("SERVING", timeout=120)
                total = sa["model"]["total_bytes"]                     # the model and the repo's .gitattributes
                assert total >= len(body) and served(hub) == total       # one download, by one worker
                for st in (sa, sb):
                    assert st["model"]["path"].startswith(str(volume / "kiln/hf/models--kiln-test--tiny/"))
                    assert st["serverless"]["shared"] == str(volume / "kiln") and st["serverless"]["on_volume"]
                assert sb["serverless"]["own"] == str(volume / "kiln/workers/wb")
                key = (volume / "kiln/api-key").read_text().strip()   # generated once, served by both
                for sup in (a, b):
                    code, _ = http(f"http://127.0.0.1:{sup.api_port}/v1/models",
                                   headers={"Authorization": f"Bearer {key}"})
                    assert code == 200
                assert b.stop() == 0
                assert "model fetch: event=waiting for=worker wa " in b.log() and "event=turn" in b.log()
            assert a.stop() == 0
        for w in ("wa", "wb"):                                         # each worker's own state, apart
            own = volume / "kiln/workers" / w
            assert (own / "run/engine.log").is_file() and (own / "ladder-memory.json").is_file()
        assert not (tmp_path / "image-default").exists()               # the image's state_dir was not used
        assert key not in a.log() + b.log()


def served(hub: HubServer) -> int:
    return sum(hub.bytes_served[r] for r in BODY_ROUTES)


def test_port_health_on_the_engines_port_is_refused_at_boot_naming_both_and_the_fix(tmp_path, prefix):
    text = config(binary=str(prefix / "bin/llama-server"), model=str(tmp_path / "m.gguf"), port=free_port(),
                  status_port=free_port(), state_dir=tmp_path / "state",
                  rungs='[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\n')
    (tmp_path / "deploy.toml").write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    r = subprocess.run([sys.executable, "-m", "supervisor", "run", "--config", str(tmp_path / "deploy.toml")],
                       env={**env, "PYTHONPATH": str(REPO_ROOT), "PORT": "8000", "PORT_HEALTH": "8000",
                            "KILN_SERVERLESS_EXIT_GRACE_S": "0"},     # no 503 to answer for: it goes at once
                       capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 2, r.stderr
    assert "PORT_HEALTH (env): PORT_HEALTH = 8000, which is the engine's port (PORT = 8000)" in r.stderr
    assert "PORT_HEALTH=8081" in r.stderr and "Traceback" not in r.stderr
    # The one failure line every phase logs, last, with the class `endpoint up --wait` reads.
    assert "serverless worker: it can never serve (config_rejected: " in r.stderr.strip().splitlines()[-1]


def test_a_worker_killed_mid_download_lets_the_waiting_one_go_on_from_where_it_stopped(tmp_path, prefix, hub):
    from kiln_dev.models import make_tiny_gguf

    model = make_tiny_gguf(tmp_path / "wider.gguf", n_layers=4, width=128, n_ff=512)   # ~2 MB: a slow minute's worth
    body = model.read_bytes()
    hub.seed(MODEL_REPO, {"tiny.gguf": body}, storage="lfs")
    volume = tmp_path / "runpod-volume"
    volume.mkdir()
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=100_000) as slow:
        env = {**hub.env, "HF_ENDPOINT": slow.url, "KILN_MODEL_FETCH_CONNECTIONS": "1",
               "KILN_SERVERLESS_VOLUME": str(volume)}
        a = worker(tmp_path, prefix, f"hf://{MODEL_REPO}", state=tmp_path / "image-default", selftest=SELFTEST_OFF,
                   name="wa", env=env)
        b = None
        try:
            wait_for(lambda: fetch_event(a).get("done", 0) >= 1 << 20, 90, "wa to have a megabyte on the volume")
            b = worker(tmp_path, prefix, f"hf://{MODEL_REPO}", state=tmp_path / "image-default", selftest=SELFTEST_OFF,
                       name="wb", env=env)
            wait_for(lambda: fetch_event(b).get("event") == "waiting", 60, "wb to wait for wa")
            a.proc.kill()                               # the holder dies: the kernel lets its lock go
            a.proc.wait(10)
            st = b.wait_state("SERVING", timeout=120)
            assert st["model"]["path"].startswith(str(volume / "kiln/hf/"))
            log = b.log()
            assert "event=turn" in log
            need = int(log.split("event=plan ")[1].split(" need=")[1].split()[0])
            assert 0 < need < len(body)                 # it went on from wa's finished segments
            assert served(hub) < 2 * len(body)
            assert b.stop() == 0
        finally:
            a.__exit__(None, None, None)
            if b is not None:
                b.__exit__(None, None, None)
