"""Failure classification from real engine logs (tests/fixtures/engine-logs, provenance beside them)."""

from pathlib import Path

import pytest

from supervisor.engines.llamacpp import HINTS, SIGNATURES
from supervisor.failure import classify

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"


def _classify(name: str, returncode: int = 1, elapsed: float = 0.1):
    lines = (LOGS / name).read_text().splitlines()
    return classify(returncode=returncode, elapsed_s=elapsed, tail=lines, signatures=SIGNATURES,
                    hint_signatures=HINTS)


def test_real_cuda_oom_on_h200_is_oom_and_notes_the_autofit_abort():
    f = _classify("llama-server-cuda-oom-h200.log", elapsed=15.0)
    assert f.failure_class == "oom"
    assert "cudaMalloc failed: out of memory" in f.evidence
    assert any("n_gpu_layers already set by user" in h for h in f.hints)


def test_seed_parameter_rejection_is_config_rejected_not_oom():
    # The field notes' signature: fast, "failed to create llama_context", no cudaMalloc line.
    f = _classify("llama-server-param-reject-cpu.log", elapsed=0.02)
    assert f.failure_class == "config_rejected"


def test_seed_oom_text_is_oom():
    line = "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 84790.00 MiB on device 1: cudaMalloc failed: out of memory"
    f = classify(returncode=1, elapsed_s=29.9, tail=[line, "exiting due to model loading error"], signatures=SIGNATURES)
    assert f.failure_class == "oom"


@pytest.mark.parametrize("name,expected", [
    ("llama-server-missing-model-cpu.log", "load_error"),
    ("llama-server-removed-flag-cpu.log", "config_rejected"),
])
def test_other_recorded_failures(name, expected):
    assert _classify(name).failure_class == expected


def test_port_in_use_and_signals_and_unknown_exit():
    f = classify(returncode=1, elapsed_s=0.01, tail=["couldn't bind HTTP server socket, hostname: 0.0.0.0, port: 8080"],
                 signatures=SIGNATURES)
    assert f.failure_class == "port_in_use"
    f = classify(returncode=-9, elapsed_s=3, tail=["loading"], signatures=SIGNATURES)
    assert f.failure_class == "crashed" and "SIGKILL" in f.reason and "OOM killer" in f.reason
    f = classify(returncode=7, elapsed_s=3, tail=["nothing telling"], signatures=SIGNATURES)
    assert f.failure_class == "crashed" and "status 7" in f.reason


def test_stall_wins_and_tail_is_kept():
    f = classify(returncode=None, elapsed_s=120, tail=["a", "b"], signatures=SIGNATURES, stalled=True)
    assert f.failure_class == "stalled" and f.tail == ("a", "b")
    assert f.to_dict()["stderr_tail"] == ["a", "b"]
