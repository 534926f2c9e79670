"""The shell: the loop that runs what lifecycle/ decides, and one file per effect's body. Each body
is handed values and callbacks, never the loop; the libraries (engines/, model/, ladder/, ...) it
calls never import this folder.

    python -m supervisor run (__main__.py)
      └─ loop.py          one thread waits for an event, hands it to lifecycle/machine.py, runs the
                          effects it answers with (each a `_do_<Effect>` of a line or a few)
           ├─ preflight.py    begin(): PID 1's first steps; Prepare: engine, binary, API key,
           │                  driver, [hardware], flag snapshot, the rung the walk starts at
           ├─ prefetch.py     the walk's page-cache read of the weights (Prepare, CheckLaunch)
           ├─ fetch.py        Fetch: the model local at once, or from the Hub in a task
           ├─ launch.py       CheckLaunch, Launch, WaitHealthy, Barrier, Calibrate, and why an
           │                  engine went down (the one classify call)
           ├─ selftest.py     RunSelftest: the SELFTEST stage in a task
           ├─ serving.py      Serving: the winning rung remembered, timings, residency
           ├─ reload.py       the reload book through a run: boot from last good, check a
           │                  candidate, record a decision (RecordReload), MarkGood
           ├─ serverless.py   a Serverless worker: who it is; a deterministic failure recorded on
           │                  the shared volume (Failed) and recalled before anything is fetched
           ├─ terminate.py    Failed / Serving / exit: a pod that can never serve ends itself
           ├─ peripherals.py  status page, TCP relay, config watcher, fleet reporter, the router's
           │                  feeder: started at the loop's first idle moment, wired with callbacks
           ├─ record.py       what /status shows, under one lock; timeline.py its boot phases
           ├─ runtime.py      what the loop knows about the host and the prepared config
           ├─ tasks.py        slow work beside the loop: cancellable threads, one event each
           └─ logs.py         the supervisor's log and the engine's lines in it
      └─ boot_failure.py  (instead of the loop) a deploy config that does not validate: FAILED at
                          once, the status page alone says why, the pod may terminate itself

Kept free of imports (P1: `run` imports only what the launch needs).
"""
