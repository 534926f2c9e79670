"""The router beside its replicas: smg fed with exactly the replicas that say they are ready.

    launch.py   python -m supervisor.router.launch: smg, its key from a 0600 file (never argv), once
                the replicas were shown the key (keycheck.py: none accepting it is FAILED)
    smg.py      smg's worker API, as Kiln uses it: list, add (with the replicas' key), remove
    feeder.py   the Feeder: each replica's readiness every poll_s, reconciled with smg's workers;
                what /status shows under `router` and whether /ready may say 200
    plan.py     the reconciliation as a pure function: what to add, what to remove
    front.py    the clients' port: a gate before smg (503 while no replica is routed), which hands
                PUT /kiln/router/replicas to control.py
    control.py  the replicas changed in place on the router's own URL, with its key
    pushed.py   that list, kept in the state directory while the config names the list it replaced

The supervised process is the router (engines/router.py: its argv, its failure words); the feeder is
a peripheral (run/peripherals.py), wired with callbacks and never holding the loop. The choice
of smg over vllm-router: docs/research/router-choice-2026-12-01.md. Kept free of imports.
"""
