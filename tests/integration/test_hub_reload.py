"""The supervisor with the Hub: the model fetched into the volume, configs published to a repo
branch and applied, outages ridden out. Real processes throughout: `python -m supervisor run`, the
CPU llama-server, a tiny real GGUF, huggingface_hub, and the `publish-config` CLI. The Hub is
kiln_dev/hub/, a local stand-in for huggingface.co speaking the routes huggingface_hub
2.4 uses; kiln_dev/throttle.py stands for a slow link where a download must be interrupted.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.integration.test_fetch import finished_segments
from kiln_dev.hub import HubServer, client_env
from kiln_dev.models import make_tiny_gguf
from kiln_dev.supervised import Supervised, config, free_port, http, wait_for
from kiln_dev.throttle import Throttle

pytestmark = pytest.mark.llama
ROOT = Path(__file__).resolve().parents[2]
MODEL_REPO, DEPLOY_REPO = "kiln-test/tiny", "kiln-test/deploy"



@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub") as server, client_env(server, tmp_path / "home") as ce:
        server.env = ce.env
        yield server


def pod_text(prefix: Path, tmp: Path, *, ports: tuple[int, int], model: str = f"hf://{MODEL_REPO}",
             ctx: int = 512, watch: str = "", state: Path | None = None, head: str = "") -> str:
    entry = 'entry = "*.gguf"\nfetch_stall_s = 20\n' if model.startswith("hf://") else ""
    text = config(binary=str(prefix / "bin/llama-server"), model=model, port=ports[0], status_port=ports[1],
                  state_dir=state or tmp / "state", snapshot=str(prefix / "share/kiln/llama-server.help.txt"),
                  rungs=f'[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "{ctx}"]\n',
                  extra=watch)
    return head + text.replace(f'source = "{model}"', f'source = "{model}"\n{entry}')


def publish_cli(hub, tmp: Path, text: str) -> str:
    f = tmp / "to-publish.toml"
    f.write_text(text)
    r = subprocess.run([sys.executable, str(ROOT / "build.py"), "publish-config", str(f), "--repo", DEPLOY_REPO],
                       capture_output=True, text=True, env={**os.environ, **hub.env}, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return hub.resolve(DEPLOY_REPO, "main")


def test_a_config_published_to_the_hub_is_applied_and_status_shows_its_revision(tmp_path, prefix, tiny, hub):
    hub.seed(MODEL_REPO, {"tiny.gguf": tiny.read_bytes()})
    hub.seed(DEPLOY_REPO, {"README.md": b"configs\n"})
    ports = (free_port(), free_port())
    watch = f'[watch]\nrepo = "{DEPLOY_REPO}"\npoll_s = 0.2\nmax_backoff_s = 0.5\n'
    with Supervised(tmp_path, pod_text(prefix, tmp_path, ports=ports, watch=watch), env=hub.env) as sup:
        first = sup.wait_state("SERVING", timeout=60)
        assert first["model"]["commit"] == hub.resolve(MODEL_REPO) and first["model"]["from_cache"] is False
        # The Hub's config repo has no deploy.toml yet: reported once as such, the server untouched.
        wait_for(lambda: (sup.status() or {}).get("reload", {}).get("last"), 10, "the first look")
        assert "deploy.toml is not in" in sup.status()["reload"]["last"]["cause"]
        commit = publish_cli(hub, tmp_path, pod_text(prefix, tmp_path, ports=ports, ctx=1024, watch=watch))

        def applied() -> dict | None:
            st = sup.status() or {}
            return st if st.get("state") == "SERVING" and st["config"].get("revision") == commit else None
        st = wait_for(applied, 30, "the published config serving")
        assert st["config"]["from"] == "hub" and st["config"]["origin"] == f"hf://{DEPLOY_REPO}@main:deploy.toml"
        assert st["watch"]["hub"]["revision"] == commit and "1024" in st["engine"]["argv"]
        assert st["engine"]["pid"] != first["engine"]["pid"]
        assert f"at revision {commit}" in sup.log()                     # the logs say it too
        assert hub.token not in sup.log() and hub.token not in json.dumps(st)
        assert sup.stop() == 0


def test_a_hub_outage_while_watching_keeps_serving_and_recovers_when_it_returns(tmp_path, prefix, tiny, hub):
    hub.seed(DEPLOY_REPO, {"README.md": b"configs\n"})
    ports = (free_port(), free_port())
    watch = f'[watch]\nrepo = "{DEPLOY_REPO}"\npoll_s = 0.2\nmax_backoff_s = 0.5\n'
    with Supervised(tmp_path, pod_text(prefix, tmp_path, ports=ports, model=str(tiny), watch=watch),
                    env=hub.env) as sup:
        first = sup.wait_state("SERVING")
        hub.set_offline(True)
        wait_for(lambda: ((sup.status() or {}).get("watch", {}).get("hub", {}).get("consecutive_errors") or 0) >= 3,
                 20, "polls failing")
        st = sup.status()
        assert st["state"] == "SERVING" and st["engine"]["pid"] == first["engine"]["pid"]
        assert st["watch"]["hub"]["unreachable_since"] and st["watch"]["hub"]["last_error"].startswith("offline")
        assert st["watch"]["hub"]["interval_s"] == 0.5                       # backed off
        assert http(sup.url("/ready"))[0] == 200
        # Published while the pod could not see the Hub; picked up once it can.
        commit = hub.seed(DEPLOY_REPO, {"deploy.toml": pod_text(prefix, tmp_path, ports=ports, model=str(tiny),
                                                                ctx=768, watch=watch).encode()})
        hub.set_offline(False)
        st = wait_for(lambda: (s := sup.status() or {}).get("config", {}).get("revision") == commit
                      and s.get("state") == "SERVING" and s, 30, "the change after the outage")
        assert st["watch"]["hub"]["unreachable_since"] is None and "768" in st["engine"]["argv"]
        assert "the Hub answers again" in sup.log()
        assert sup.stop() == 0


def test_the_cached_model_serves_when_the_hub_is_down_and_status_says_so(tmp_path, prefix, tiny, hub):
    hub.seed(MODEL_REPO, {"tiny.gguf": tiny.read_bytes()})
    ports = (free_port(), free_port())
    text = pod_text(prefix, tmp_path, ports=ports)
    with Supervised(tmp_path, text, env=hub.env) as sup:
        sup.wait_state("SERVING", timeout=60)
        assert sup.stop() == 0
    hub.set_offline(True)
    with Supervised(tmp_path, text, env=hub.env) as sup:
        st = sup.wait_state("SERVING", timeout=60)
        assert st["model"]["from_cache"] is True and "unreachable" in st["model"]["note"]
        assert any("complete cached copy" in w for w in st["warnings"])
        assert sup.stop() == 0


def test_an_interrupted_model_download_resumes_after_the_pod_restarts(tmp_path, prefix, hub):
    big = make_tiny_gguf(tmp_path / "big.gguf", n_layers=4, width=256, n_ff=1024)     # 9.3 MB
    body = big.read_bytes()
    hub.seed(MODEL_REPO, {"tiny.gguf": body}, storage="lfs")
    ports = (free_port(), free_port())
    text = pod_text(prefix, tmp_path, ports=ports)
    journal = tmp_path / "state/hf/models--kiln-test--tiny/blobs" / f"{hashlib.sha256(body).hexdigest()}.incomplete.journal"

    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=1_000_000) as slow:
        # Two connections (the environment override a RunPod template would set), so the segments
        # finish one after another and the pod dies with some of them on disk.
        env = {**hub.env, "HF_ENDPOINT": slow.url, "KILN_MODEL_FETCH_CONNECTIONS": "2"}
        with Supervised(tmp_path, text, env=env) as sup:
            wait_for(lambda: len(finished_segments(journal)) >= 2, 60, "two segments on disk")
            child = [p for p in psutil.Process(sup.proc.pid).children(recursive=True)
                     if "supervisor.model.fetch" in " ".join(p.cmdline())]
            sup.proc.send_signal(signal.SIGKILL)          # the supervisor dies mid-download
            sup.proc.wait(10)
            # Its fetch child goes with it (parent-death signal): nothing downloads unsupervised.
            assert child
            _, alive = psutil.wait_procs(child, timeout=10)
            assert alive == [], "the fetch child outlived its supervisor"
    seg = int(journal.read_text().split()[4])
    done = finished_segments(journal)
    missing = sum(min(seg, len(body) - i * seg) for i in range(-(-len(body) // seg)) if i not in done)
    assert 0 < missing < len(body)
    hub.reset_counts()
    with Supervised(tmp_path, text, env=hub.env) as sup:
        st = sup.wait_state("SERVING", timeout=60)
        assert hub.bytes_served["cdn_get"] == missing                 # only the segments not on disk
        assert Path(st["model"]["path"]).read_bytes() == body
        assert sup.stop() == 0


def test_a_disk_too_small_for_the_model_fails_before_downloading_and_says_why(tmp_path, prefix, hub):
    hub.seed(MODEL_REPO, {"tiny.gguf": os.urandom(3_000_000)})
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "kiln-small", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (tests/integration/test_fetch.py covers the refusal in-process)")
    try:
        ports = (free_port(), free_port())
        with Supervised(tmp_path, pod_text(prefix, tmp_path, ports=ports, state=mnt / "state"), env=hub.env) as sup:
            st = sup.wait_state("FAILED", timeout=60)
            assert "not enough disk" in st["last_failure"]["reason"] and "free at" in st["last_failure"]["reason"]
            assert hub.counts["resolve_get"] == 0
            assert sup.stop() == 3
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
