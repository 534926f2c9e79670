"""`kiln plan`: what to rent for a model, before renting (issue 39).

    seed.py      facts carried from the field notes' measurements (docs/field-notes.md, by heading): the A40's
                 memory, the vCPU pods reported, the measured speed rows, the three models' shapes
    source.py    SRC -> a Shape: a local GGUF, an hf:// GGUF (headers by range), an hf:// safetensors
                 repo (config.json + index)
    speed.py     decode/prefill tok/s for a plan, with its basis: a measured row, else a bandwidth bound
    rank.py      every catalog GPU x count -> a plan (memory per card, resident or not, $/1M), ranked,
                 with a deploy config whose [plan] table the booted pod checks itself against
    measured.py  Kiln's own measurements (measured.json), appended by bench/plan_record.py from a
                 booted pod's /status, read by speed.py beside the field notes' rows

The memory arithmetic itself is the supervisor's (supervisor/plan/), so a booted pod can show the
plan's prediction beside what it measured.
"""
