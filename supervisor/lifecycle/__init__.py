"""The lifecycle: how the supervisor boots, serves, restarts, reloads and stops. Read this first.

    python -m supervisor run (__main__.py)
      └─ loop.py        the Supervisor: one thread waits for an event, hands it to the machine,
                        runs the effects it answers with (each in a `_do_<Effect>` handler)
           ├─ machine.py    the decisions, in one pure class: `Machine.step(event, now)` -> effects;
           │                each handler names the state it acts in (no I/O, no clock of its own)
           │   └─ policy.py     the questions it asks, as pure functions: which rung next, whether
           │                    a balanced rung re-plans first, restart or crash loop, exit codes
           ├─ events.py     what goes in (events: a signal, an exit, a task's answer, a published
           │                config, a tick) and what comes out (effects), all immutable data
           ├─ state.py      the states, the transitions allowed between them, the live config,
           │                the record /status shows
           │   └─ timeline.py   the boot timeline (/status `boot`): phases from the states, the
           │                    loop's launches and the engine's own lines; this boot and the last
           ├─ preflight.py  PREFLIGHT: engine, binary, API key, driver, [hardware], flag snapshot,
           │                and the rung the walk starts at
           ├─ runtime.py    what the loop knows about the host and the prepared config, handed to
           │                the stages instead of the loop itself
           ├─ tasks.py      slow work beside the loop (fetch, barrier, health wait, selftest):
           │                cancellable threads answering with one event each
           └─ peripherals.py  status page, TCP relay, config watcher, fleet reporter, the router's
                            feeder: started at the loop's first idle moment and wired with callbacks
                            (never the loop)
      └─ boot_failure.py  (instead of the loop) a deploy config that does not validate: FAILED at
                          once, the status page alone says why, the pod may terminate itself

The boot:   PREFLIGHT -> FETCH -> LAUNCHING(rung) -> LOADING -> HEALTHY -> [SELFTEST] -> SERVING
A rung fails: policy.next_rung -> the next rung after the reclaim barrier, or FAILED.
SERVING, the engine dies: policy.after_crash -> RESTARTING (backoff) -> the same rung, or FAILED.
A published config (SERVING or FAILED): lifecycle/reload.py -> rejected, unchanged, or RELOADING ->
the ladder with it -> SERVING; any step fails -> ROLLBACK -> the last good config.

Where the work of each effect is done lives in the concept folders beside this one: engines/
(launch, health), model/ (fetching), ladder/ (memory, reclaim, balanced), reload/ (decide, book,
tracker, watch), run/selftest.py, host/ (hardware, residency), fleet/ (reporter, self_terminate),
status/ (server, relay). tests/unit/test_machine.py property-tests the machine; test_policy.py pins
each policy. Kept free of imports (P1: `run` imports only what the launch needs).
"""
