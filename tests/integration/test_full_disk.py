"""A full disk under state_dir (issue 37, item 14), with real processes: `python -m supervisor run`,
the CPU llama-server and a tiny real GGUF, state_dir on a small tmpfs filled to its last byte.

The rule: the serving engine outlives a full disk; what cannot be written (the reload book, the
children journal, the ladder memory, the API key files) is a warning on /status, taken back once it
is written again, never a lost engine or a dead PID 1; nothing Kiln started goes untracked, and no
temp file is left behind. A disk already full at boot is FAILED on /status, not an exit (an exit
restarts the container into the same failure).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from kiln_dev.supervised import Supervised, config, free_port, http, wait_for
from kiln_dev.tmpfs import small_tmpfs

pytestmark = pytest.mark.llama
NOSPACE = "No space left on device"


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs, unmounted afterwards (we are root here and in CI)."""
    with small_tmpfs(tmp_path / "volume", "16m") as mnt:
        yield mnt


def fill(disk: Path) -> None:
    """Fill the filesystem to its last byte (again: something may have been freed since)."""
    with open(disk / "filler", "ab", buffering=0) as f:
        for chunk in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    f.write(b"\0" * chunk)
                except OSError as e:
                    assert e.errno == 28, e
                    break


class Pod:
    def __init__(self, tmp: Path, prefix: Path, model: Path, state: Path):
        self.prefix, self.model, self.state = prefix, model, state
        self.port, self.sport = free_port(), free_port()
        self.dir = tmp / "published"          # the watch dir is not on the full disk: the publisher's

    def text(self, ctx: str = "512") -> str:
        rungs = f'[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "{ctx}"]\n'
        return config(binary=str(self.prefix / "bin/llama-server"), model=str(self.model), port=self.port,
                      status_port=self.sport, state_dir=self.state, rungs=rungs,
                      snapshot=str(self.prefix / "share/kiln/llama-server.help.txt"),
                      extra=f'[watch]\ndir = "{self.dir}"\ndebounce_s = 0.2\n')

    def publish(self, text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / ".deploy.toml.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / "deploy.toml")


def alive_status(sup: Supervised) -> dict | None:
    """/status, after checking PID 1 is still there (a dead one fails the wait at once, with its log)."""
    if sup.proc.poll() is not None:
        raise AssertionError(f"the supervisor exited {sup.proc.returncode}:\n{sup.log()}")
    return sup.status()


def decisions(st: dict) -> list[str]:
    return [h["outcome"] for h in ((st.get("reload") or {}).get("history") or [])]


def disk_warnings(st: dict) -> list[str]:
    return [w for w in st.get("warnings") or [] if NOSPACE in w]


def engine_health(pod: Pod) -> int:
    return http(f"http://127.0.0.1:{pod.port}/health")[0]


def test_a_full_disk_costs_warnings_never_the_serving_engine(tmp_path, prefix, tiny, small_disk):
    pod = Pod(tmp_path, prefix, tiny, small_disk / "kiln")
    with Supervised(tmp_path, pod.text(), env={"KILN_API_KEY": ""}) as sup:   # a generated key, stored
        first = sup.wait_state("SERVING")["engine"]["pid"]

        # A valid config published onto the full disk is applied: the book cannot record it, /status says so.
        fill(small_disk)
        pod.publish(pod.text(ctx="256"))
        st = wait_for(lambda: (s := alive_status(sup)) and decisions(s) == ["applied"] and s["state"] == "SERVING"
                      and s, 60, "the published config applied on the full disk")
        second = st["engine"]["pid"]
        assert second != first and engine_health(pod) == 200
        assert any("reload book" in w for w in disk_warnings(st)), st["warnings"]
        assert "-c 256" in " ".join(st["engine"]["argv"])

        # A rejected one is rejected, and the engine serves on.
        fill(small_disk)
        pod.publish("engine = [not toml\n")
        st = wait_for(lambda: (s := alive_status(sup)) and decisions(s) == ["applied", "rejected"] and s, 60,
                      "the bad config rejected on the full disk")
        assert st["state"] == "SERVING" and st["engine"]["pid"] == second and engine_health(pod) == 200

        # The engine killed on the full disk is restarted, tracked: SERVING with the engine that answers.
        fill(small_disk)
        os.kill(second, signal.SIGKILL)
        st = wait_for(lambda: (s := alive_status(sup)) and s["state"] == "SERVING" and s["engine"]["pid"] != second
                      and s, 60, "the killed engine restarted on the full disk")
        assert st["failures"] == {"crashed": 1} and engine_health(pod) == 200
        assert any("children journal" in w for w in disk_warnings(st)), st["warnings"]
        assert [p.name for p in pod.state.rglob("*") if p.name.endswith(".tmp")] == []

        # Room again: the next config is written, and each warning of a file written since is taken back
        # (the rejected config's bytes were not kept: that one stays true).
        (small_disk / "filler").unlink()
        pod.publish(pod.text(ctx="384"))
        st = wait_for(lambda: (s := alive_status(sup)) and decisions(s)[-1:] == ["applied"] and s["state"] == "SERVING"
                      and s, 60, "the config published after space came back applied")
        assert [w.split(" (")[0] for w in disk_warnings(st)] == ["cannot write the reload book's last-rejected.toml"]
        history = (pod.state / "reload/history.jsonl").read_text().splitlines()
        assert [json.loads(line)["outcome"] for line in history] == ["applied", "rejected", "applied"]
        assert '"-c", "384"' in (pod.state / "reload/last-good.toml").read_text()
        assert sup.stop() == 0
        assert "Traceback" not in sup.log() and "unexpected" not in sup.log()


def test_a_disk_full_at_boot_is_failed_on_status_not_an_exit(tmp_path, prefix, tiny, small_disk):
    fill(small_disk)
    pod = Pod(tmp_path, prefix, tiny, small_disk / "kiln")
    with Supervised(tmp_path, pod.text(), env={"KILN_API_KEY": ""}) as sup:
        st = sup.wait_state("FAILED", timeout=60)
        reason = st["last_failure"]["reason"]
        assert NOSPACE in reason and str(pod.state / "api-key") in reason and "KILN_API_KEY" in reason, reason
        assert http(sup.url("/live"))[0] == 200 and sup.proc.poll() is None
        assert [p.name for p in pod.state.rglob("*") if p.name.endswith(".tmp")] == []
        assert sup.stop() == 3
        assert "Traceback" not in sup.log() and "unexpected" not in sup.log()
