"""Once an engine serves, the loop gathers its output into batched reads (P2b: a read per line was
the supervisor's largest CPU cost on a GPU); not before (the boot timeline reads the engine's phases
from its lines as they come), and only for the engine that serves."""

from __future__ import annotations

import sys
from pathlib import Path

from supervisor.config import parse_config
from supervisor.lifecycle import events as E
from supervisor.run import loop, serving
from supervisor.lifecycle.machine import Machine
from supervisor.lifecycle.state import Live
from supervisor.process.managed import ManagedProcess


def test_the_serving_engine_and_only_it_reads_its_output_in_batches(tmp_path: Path) -> None:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF" + bytes(96))
    cfg = parse_config(f'engine = "llamacpp"\nstate_dir = "{tmp_path / "state"}"\n[model]\nsource = "{m}"\n'
                       '[[ladder.rungs]]\nname = "a"\n', env={})
    sup = loop.Supervisor(cfg, loop.Options(env={}))
    live = Live(cfg, model_path=m)
    sup.machine = Machine(live)
    procs = [ManagedProcess.start([sys.executable, "-c", "import signal; signal.pause()"], on_line=None)
             for _ in range(2)]
    try:
        sup.engines = {7: loop._Engine(procs[0], live, 0), 8: loop._Engine(procs[1], live, 0)}
        sup.machine.engine = 7                    # 8: one being replaced, say
        assert procs[0]._batch_s == 0.0           # loading, health, selftest: each line as it comes
        sup._do_Serving(E.Serving(0))
        assert procs[0]._batch_s == serving.ENGINE_OUTPUT_BATCH_S > 0
        assert procs[1]._batch_s == 0.0
    finally:
        for p in procs:
            p.stop(1)


def test_boot_to_ready_counts_from_the_processs_exec_as_the_boot_timeline_does(tmp_path: Path) -> None:
    # issue 37, "small lies": kiln_boot_to_ready_seconds left out supervisor_start, which boot.seconds has
    import time

    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF" + bytes(96))
    cfg = parse_config(f'engine = "llamacpp"\nstate_dir = "{tmp_path / "state"}"\n[model]\nsource = "{m}"\n'
                       '[[ladder.rungs]]\nname = "a"\n', env={})
    sup = loop.Supervisor(cfg, loop.Options(env={}, process_start=time.monotonic() - 5.0))
    sup.machine = Machine(Live(cfg, model_path=m))
    sup._do_Serving(E.Serving(0))
    assert sup.rec.snapshot()["timings"]["boot_to_ready_s"] >= 5.0
