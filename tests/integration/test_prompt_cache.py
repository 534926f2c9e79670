"""A prompt cache that survives (issue 51): the real supervisor, the real CPU llama-server (the pinned build
11434) and a real model (SmolLM2-135M-Instruct), a long prompt (~2,500 tokens). Before, every restart Kiln
made threw the engine's prompt cache away, and the next request of every session paid the cold prefill.

    a supervisor restarted on the same state dir   restores the slot its predecessor saved at TERM
    a reload (a published config)                  saves before it stops the old engine, restores after
    an engine of another computation (-c)          skips the saved slot, says why, computes cold
and at temperature 0 the answer after a restore is the answer without one, token for token."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kiln_dev.models import smollm2_gguf
from kiln_dev.supervised import Supervised, config, free_port, http, wait_for

pytestmark = pytest.mark.llama
PROMPT = " ".join(f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(180))


class Pod:
    def __init__(self, tmp: Path, prefix: Path):
        self.tmp, self.prefix, self.model = tmp, prefix, smollm2_gguf()
        self.port, self.sport, self.state, self.published = free_port(), free_port(), tmp / "state", tmp / "published"

    def text(self, ctx: int = 4096, temperature: float | None = None) -> str:
        sampler = f"[sampler]\ntemperature = {temperature}\n" if temperature is not None else ""
        return config(binary=self.prefix / "bin" / "llama-server", model=self.model, port=self.port,
                      status_port=self.sport, state_dir=self.state, snapshot=self.prefix / "share/kiln/llama-server.help.txt",
                      rungs=f'[[ladder.rungs]]\nname = "cpu"\nplacement = "cpu"\nargs = ["-t", "1", "-c", "{ctx}", "-np", "1"]\n',
                      extra=f'{sampler}[cache]\nmin_tokens = 256\n[watch]\ndir = "{self.published}"\ndebounce_s = 0.2\n')

    def ask(self) -> dict:
        body = json.dumps({"prompt": PROMPT, "n_predict": 24, "temperature": 0, "cache_prompt": True}).encode()
        code, out = http(f"http://127.0.0.1:{self.port}/completion", data=body, timeout=600,
                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
        assert code == 200, out
        return json.loads(out)

    key = "kiln-prompt-cache-test-key"


def _supervised(pod: Pod, tmp: Path, name: str, text: str) -> Supervised:
    d = tmp / name
    d.mkdir()
    return Supervised(d, text, env={"KILN_API_KEY": Pod.key})


def test_a_restarted_supervisor_restores_the_slot_and_answers_the_same_tokens(tmp_path, prefix):
    pod = Pod(tmp_path, prefix)
    with _supervised(pod, tmp_path, "first", pod.text()) as first:
        first.wait_state("SERVING", timeout=120)
        cold = pod.ask()
        assert cold["timings"]["prompt_n"] > 1000, cold["timings"]
        assert first.stop() == 0                               # TERM: the slot is saved before the engine stops
        assert "prompt cache: saved 1 slot(s)" in first.log(), first.log()[-2000:]
    saved = sorted(p.name for p in (pod.state / "prompt-cache").iterdir())
    assert len([n for n in saved if n.endswith(".bin")]) == 1 and not [n for n in saved if n.endswith(".partial")]
    with _supervised(pod, tmp_path, "second", pod.text()) as second:
        st = second.wait_state("SERVING", timeout=120)
        pc = st["prompt_cache"]
        assert pc["restored_slots"] == 1 and pc["restored"]["tokens"] >= 1000, pc
        warm = pod.ask()
        assert warm["timings"]["prompt_n"] <= 4, warm["timings"]           # the restore took effect
        assert warm["content"] == cold["content"]                          # token for token, temperature 0
        metrics = http(second.url("/metrics"))[1].decode()
        assert 'kiln_prompt_cache_slots_total{action="restored"} 1' in metrics
        assert "prompt_cache" in json.dumps(st["boot"])                  # its phase on the boot timeline
        assert second.stop() == 0


def test_a_reload_keeps_the_cache_and_another_computation_never_loads_it(tmp_path, prefix):
    pod = Pod(tmp_path, prefix)
    with _supervised(pod, tmp_path, "first", pod.text()) as sup:
        sup.wait_state("SERVING", timeout=120)
        cold = pod.ask()
        # A reload of [sampler] only: a new engine, the same computation -> saved, restored.
        pod.published.mkdir(parents=True, exist_ok=True)
        (pod.published / "deploy.toml").write_text(pod.text(temperature=0.5))
        st = wait_for(lambda: (s := sup.status()) and s["state"] == "SERVING" and s.get("launches") == 2 and s, 120,
                      "the reloaded engine serving")
        assert st["prompt_cache"]["saved"]["slots"] == 1 and st["prompt_cache"]["restored"]["slots"] == 1, \
            st["prompt_cache"]
        warm = pod.ask()
        assert warm["timings"]["prompt_n"] <= 4 and warm["content"] == cold["content"]
        # Another context: another key. The saved slot is skipped (said why), never loaded; the prompt is cold.
        (pod.published / "deploy.toml").write_text(pod.text(ctx=3072, temperature=0.5))
        st = wait_for(lambda: (s := sup.status()) and s["state"] == "SERVING" and s.get("launches") == 3 and s, 120,
                      "the engine of another context serving")
        restored = st["prompt_cache"]["restored"]
        assert restored["slots"] == 0 and restored["skipped_total"] >= 1
        assert any("its key differs" in s["why"] for s in restored["skipped"]), restored
        again = pod.ask()
        assert again["timings"]["prompt_n"] > 1000
        assert sup.stop() == 0
    # Nothing but Kiln's own files in the cache directory; within its bounds.
    names = os.listdir(pod.state / "prompt-cache")
    assert all(n.endswith((".bin", ".json")) for n in names), names


def test_a_rollback_restores_what_the_replaced_engine_saved(tmp_path, prefix):
    pod = Pod(tmp_path, prefix)
    with _supervised(pod, tmp_path, "first", pod.text()) as sup:
        first = sup.wait_state("SERVING", timeout=120)
        cold = pod.ask()
        # A published config whose engine exits at start (a value llama-server refuses): the old engine is
        # stopped (its slot saved), the new one fails, the last good config comes back and restores it.
        pod.published.mkdir(parents=True, exist_ok=True)
        (pod.published / "deploy.toml").write_text(
            pod.text().replace('"-np", "1"]', '"-np", "1", "--rope-scaling", "no-such-scaling"]'))
        st = wait_for(lambda: (s := sup.status()) and s["state"] == "SERVING"
                      and (s.get("reload") or {}).get("last_rollback") and s, 120, "the rollback serving")
        assert st["reload"]["last_rollback"]["outcome"] == "rolled_back", st["reload"]
        assert st["engine"]["pid"] != first["engine"]["pid"]                 # the old engine really stopped
        assert st["prompt_cache"]["saved"]["slots"] == 1 and st["prompt_cache"]["restored"]["slots"] == 1, \
            st["prompt_cache"]
        warm = pod.ask()
        assert warm["timings"]["prompt_n"] <= 4 and warm["content"] == cold["content"]
        assert sup.stop() == 0


def test_a_fresh_serverless_worker_restores_what_an_earlier_worker_of_its_endpoint_saved(tmp_path, prefix):
    """Scale to zero and back: worker one serves, is scaled down (TERM), worker two starts on the same
    network volume (the shared state dir) with another pod id and restores worker one's slot."""
    pod = Pod(tmp_path, prefix)

    def worker(name: str) -> Supervised:
        d = tmp_path / name
        d.mkdir()
        return Supervised(d, pod.text(), env={"KILN_API_KEY": Pod.key, "PORT": str(pod.port),
                                              "PORT_HEALTH": str(pod.sport), "RUNPOD_ENDPOINT_ID": "ep-cache",
                                              "RUNPOD_POD_ID": name})

    with worker("worker-one") as one:
        one.wait_state("SERVING", timeout=120)
        cold = pod.ask()
        assert cold["timings"]["prompt_n"] > 1000
        assert one.stop() == 0                                       # scaled down: RunPod sends TERM
    with worker("worker-two") as two:
        st = two.wait_state("SERVING", timeout=120)
        assert st["prompt_cache"]["restored_slots"] == 1, st["prompt_cache"]
        warm = pod.ask()
        assert warm["timings"]["prompt_n"] <= 4 and warm["content"] == cold["content"]
        assert two.stop() == 0
    # One shared directory on the volume; each worker's own state apart from it.
    assert any(n.endswith(".bin") and "worker-one" in n for n in os.listdir(pod.state / "prompt-cache"))
