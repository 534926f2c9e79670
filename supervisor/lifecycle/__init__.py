"""The lifecycle's decisions: how the supervisor boots, serves, restarts, reloads and stops. Read
this first. Pure: no thread, no I/O, no clock of their own (tests/unit/test_house.py checks the
imports); the shell (run/) does what they decide.

    machine.py    the decisions, in one class: `Machine.step(event, now)` -> effects; each handler
                  names the state it acts in
      policy.py     the questions it asks, as pure functions: which rung next, whether a balanced
                    rung re-plans first, restart or crash loop, exit codes
      reload.py     what becomes of a published config: rejected, unchanged, fetched first, applied
    events.py     what goes in (a signal, an exit, a task's answer, a published config, a tick) and
                  what comes out (effects): immutable data
    state.py      the states, the transitions allowed between them, the live config (Live, Origin)

The boot:   PREFLIGHT -> FETCH -> LAUNCHING(rung) -> LOADING -> HEALTHY -> [SELFTEST] -> SERVING
A rung fails: policy.next_rung -> the next rung after the reclaim barrier, or FAILED.
SERVING, the engine dies: policy.after_crash -> RESTARTING (backoff) -> the same rung, or FAILED.
A published config (SERVING or FAILED): reload.decide -> rejected, unchanged, or RELOADING ->
the ladder with it -> SERVING; any step fails -> ROLLBACK -> the last good config.

tests/unit/test_machine.py property-tests the machine; test_policy.py pins each policy.
"""
