"""The test-support models and the fake llama-server behave as documented.

The fake stands in for llama-server only where a CPU box can't produce the condition
(CUDA OOM, segfault, hung load); these tests check it replays the recorded real logs.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `pytest` without `python -m` doesn't put the repo root on sys.path
    sys.path.insert(0, str(ROOT))

from kiln_dev import children, models  # noqa: E402

from kiln_dev.supervised import FAKE, free_port  # noqa: E402
LOGS = ROOT / "tests" / "fixtures" / "engine-logs"
DEADLINE_S = 10.0  # generous: the machine may be busy compiling


# --- tiny GGUF -------------------------------------------------------------------------------

def test_tiny_gguf_is_deterministic_per_seed(tmp_path: Path) -> None:
    a = models.make_tiny_gguf(tmp_path / "a.gguf", seed=3)
    b = models.make_tiny_gguf(tmp_path / "b.gguf", seed=3)
    c = models.make_tiny_gguf(tmp_path / "c.gguf", seed=4)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert 200_000 < a.stat().st_size < 800_000
    assert abs(a.stat().st_size - models.gguf_nbytes()) < 100_000  # the estimate is close


def test_tiny_gguf_metadata_reads_back(tmp_path: Path) -> None:
    import gguf

    path = models.make_tiny_gguf(tmp_path / "m.gguf", n_layers=3, width=128, n_vocab=1000, dtype="f32")
    r = gguf.GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items()}
    assert f["general.architecture"] == "llama"
    assert (f["llama.block_count"], f["llama.embedding_length"], f["llama.vocab_size"]) == (3, 128, 1000)
    assert f["llama.attention.head_count"] == 2 and f["llama.rope.dimension_count"] == 64
    assert f["tokenizer.ggml.model"] == "llama"
    assert "<|im_start|>" in f["tokenizer.chat_template"]
    tokens = f["tokenizer.ggml.tokens"]
    assert len(tokens) == 1000 and len(set(tokens)) == 1000
    assert tokens[f["tokenizer.ggml.eos_token_id"]] == "</s>"
    assert {"<s>", "<unk>", "<|im_start|>", "<|im_end|>", "<0x00>", "<0x0A>", "<0xFF>"} <= set(tokens)
    types = f["tokenizer.ggml.token_type"]
    assert types.count(gguf.TokenType.BYTE) == 256 and types.count(gguf.TokenType.CONTROL) == 4
    t = {x.name: x for x in r.tensors}
    assert len(t) == 2 + 3 * 9 + 1
    assert t["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    out = t["output.weight"].data  # (vocab, width): control/byte rows only read the constant dim
    n = models.FIRST_NORMAL_ID
    assert (out[:n, 1:] == 0).all() and (out[:n, 0] < -100).all() and (out[n:, 0] == 0).all()


def test_cli_writes_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "cli.gguf"
    res = subprocess.run([sys.executable, "-m", "kiln_dev.models", "tiny", str(out), "--seed", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.strip() == str(out)
    assert out.read_bytes() == models.make_tiny_gguf(tmp_path / "api.gguf", seed=3).read_bytes()


# --- fake llama-server: recorded failures ----------------------------------------------------

def run_fake(scenario: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FAKE), *args], capture_output=True, text=True,
                          timeout=DEADLINE_S, env={**os.environ, "KILN_FAKE_SCENARIO": scenario, **env})


@pytest.mark.parametrize("scenario,log", [
    ("cuda-oom-h200", "llama-server-cuda-oom-h200.log"),
    ("param-reject", "llama-server-param-reject-cpu.log"),
    ("missing-model", "llama-server-missing-model-cpu.log"),
    ("removed-flag", "llama-server-removed-flag-cpu.log"),
])
def test_fake_replays_recorded_log(scenario: str, log: str) -> None:
    res = run_fake(scenario, "--port", "8080", "-ngl", "99")  # no -m: the recorded model name stays
    assert res.returncode == 1
    assert res.stderr == (LOGS / log).read_text()
    assert res.stdout == ""


def test_fake_uses_the_given_model_path() -> None:
    res = run_fake("cuda-oom-h200", "-m", "/models/big.gguf", "-ngl", "99", "-c", "200000000")
    assert "load_model: loading model '/models/big.gguf'" in res.stderr
    assert "cudaMalloc failed: out of memory" in res.stderr


def test_fake_seed_oom_and_delay() -> None:
    t0 = time.monotonic()
    res = run_fake("seed-oom", KILN_FAKE_DELAY_S="0.3")
    assert time.monotonic() - t0 >= 0.3
    assert res.returncode == 1
    assert ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 84790.00 MiB on device 1: "
            "cudaMalloc failed: out of memory\n") in res.stderr


def test_fake_version_goes_to_stderr() -> None:
    res = subprocess.run([str(FAKE), "--version"], capture_output=True, text=True, timeout=DEADLINE_S)
    assert res.returncode == 0 and res.stdout == ""  # also checks the shebang and exec bit
    assert res.stderr.startswith("version: ")


def test_fake_without_scenario_refuses() -> None:
    res = run_fake("no-such-scenario")
    assert res.returncode == 2 and "KILN_FAKE_SCENARIO" in res.stderr


# --- fake llama-server: serving scenarios ----------------------------------------------------

class Fake:
    """The fake as a child process (dying with this one), with its stderr read on a thread."""

    def __init__(self, scenario: str, **env: str) -> None:
        self.port = free_port()
        self.proc = children.spawn(
            [sys.executable, FAKE, "-m", "tiny.gguf", "--host", "127.0.0.1", "--port", str(self.port)],
            stderr=subprocess.PIPE, text=True, env={**os.environ, "KILN_FAKE_SCENARIO": scenario, **env})
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_line(self, needle: str) -> str:
        deadline = time.monotonic() + DEADLINE_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if needle in line:
                return line
        raise AssertionError(f"no line with {needle!r} in {self.seen}")

    def health_raw(self) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def health(self) -> tuple[int, dict[str, object]]:
        status, body = self.health_raw()
        return status, json.loads(body)

    def __enter__(self) -> "Fake":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=DEADLINE_S)


def test_fake_hang_loading_stays_503() -> None:
    with Fake("hang-loading") as f:
        f.wait_line("loading model 'tiny.gguf'")  # printed after the port is bound
        # byte-for-byte what the real llama-server answered while loading
        assert f.health_raw() == (503, b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}')
        f.proc.send_signal(signal.SIGTERM)  # before "loaded" the real server has no handler yet
        assert f.proc.wait(timeout=DEADLINE_S) == -signal.SIGTERM


def test_fake_ok_serves_and_exits_0_on_sigterm() -> None:
    with Fake("ok") as f:
        f.wait_line(f"listening on http://127.0.0.1:{f.port}")
        assert f.health() == (200, {"status": "ok"})
        f.proc.send_signal(signal.SIGTERM)
        assert f.proc.wait(timeout=DEADLINE_S) == 0


def test_fake_slow_loading_prints_progress_then_serves() -> None:
    with Fake("slow-loading-progress", KILN_FAKE_LOAD_S="0.5", KILN_FAKE_DOT_S="0.05") as f:
        dots = f.wait_line("load_tensors:")  # the dots share one line, as in llama.cpp
        assert dots.rstrip().endswith("....")
        f.wait_line("model loaded")
        assert f.health()[0] == 200


def test_fake_crash_after_ready_segfaults() -> None:
    with Fake("crash-after-ready", KILN_FAKE_CRASH_AFTER_S="0.3") as f:
        f.wait_line("model loaded")
        assert f.health()[0] == 200
        assert f.proc.wait(timeout=DEADLINE_S) == -signal.SIGSEGV


def test_fake_ignore_sigterm_needs_kill() -> None:
    with Fake("ignore-sigterm") as f:
        f.wait_line("model loaded")
        f.proc.send_signal(signal.SIGTERM)
        f.wait_line("got SIGTERM, ignoring it")
        assert f.health()[0] == 200 and f.proc.poll() is None
        f.proc.kill()
        assert f.proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL


def test_fake_spawn_orphan_outlives_it() -> None:
    with Fake("spawn-orphan", KILN_FAKE_ORPHAN_S="30") as f:
        orphan = int(f.wait_line("orphan pid").split()[-1])
        try:
            f.wait_line("model loaded")
            f.proc.send_signal(signal.SIGTERM)
            assert f.proc.wait(timeout=DEADLINE_S) == 0
            os.kill(orphan, 0)  # still alive after its parent exited
            assert os.getsid(orphan) != os.getsid(0)  # left our session: killpg won't reach it
        finally:
            os.kill(orphan, signal.SIGKILL)  # we caused it; the test's own reaper is not ours
