"""A Kiln supervisor as a worker of a RunPod Serverless load-balancing endpoint.

    environment (PORT, PORT_HEALTH, HEALTH_CHECK_PATH, RUNPOD_ENDPOINT_ID)
        ─▶ runpod_env.py (base)  serverless mode; PORT -> the engine's port, PORT_HEALTH -> the status
                         server's, where the health path answers 204 / 200 / 503 from the state
                         (health_code); PORT_HEALTH == PORT refused (config.py applies it); many
                         workers, one volume: state_dir on it, shared, and each worker's own
                         directory (workers/<id>/); the worker id
    FAILED for good
        ─▶ run/serverless.py  one log line (class and cause, masked); 503 from the state; exit after
                         [serverless] exit_grace_s so the worker stops billing (the machine's
                         release deadline: lifecycle/machine.py)
        ─▶ failures.py   the failure recorded on the shared volume (only a class that image, config
                         and GPU kind decide), keyed by them; once two different workers failed the
                         same way, a later worker with the same key fails at once, fetching nothing
                         (run/serverless.py recalls it at PREFLIGHT); the endpoint's clear mark
                         (KILN_SERVERLESS_FAILURES_CLEARED_AT) lifts what was written before it
    PREFLIGHT, once
        ─▶ workdirs.py   this worker's directory marked as Kiln's with a heartbeat; dead workers'
                         directories pruned (only marked ones, bounded), a dead worker's driver JIT
                         cache of the same image and GPU kind taken over (run/serverless.py tidy)

Pods (neither PORT_HEALTH nor RUNPOD_ENDPOINT_ID set) never enter any of this: FAILED stays up.
Kept free of imports.
"""
