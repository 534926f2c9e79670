"""Kiln in-image supervisor: PID 1 that brings the inference server up safely and keeps it honest.

Every Kiln image carries this package and nothing else of Kiln (it imports nothing of images/ or
kiln_dev/). A folder is a concept, a file one of its parts; each folder's __init__ maps its files.
Read lifecycle/ first: it is the main flow, and says where every step's work is done.

    __main__.py   python -m supervisor run | check-config | check-model | selftest
    lifecycle/    the loop, the pure state machine, its policies, events, states, tasks, preflight
    engines/      llama.cpp and vLLM behind one surface; launch, health wait, API key, flag snapshot
    process/      managed processes, PID-1 duties, the leftovers of a killed supervisor
    ladder/       where the walk starts, the reclaim barrier between rungs, the balanced split
    host/         the hardware probe and guard, the driver's CUDA, host-resident weights
    model/        the model file: resolve, fetch (into the volume), GGUF layout, model preflight
    reload/       published configs: watch, candidate, decide, the book
    fleet/        the pod's side of the fleet: its record on the Hub, self-termination
    status/       the status page and metrics, the TCP relay, listening sockets
    router/       engine = "router": smg fed with the replicas whose /ready says 200 (the feeder)
    selftest/     does the healthy engine answer well, and how fast

    config.py     the deploy-config schema: parse, validate, a frozen DeployConfig
    validate.py   Reader: every problem of a config or target at once (the Problem is in errors.py)
    errors.py     the exception tree, and Problem
    failure.py    FailureClass, Failure, classify (what an engine's exit means)
    redact.py     the one redaction of secrets for logs, pages, records and errors
    hubclient.py  the Hub token, and what a Hub error means (error_kind)

Package __init__ files hold a map and no imports, so `run` imports only what the launch needs (P1).
"""

__version__ = "0.1.0"
