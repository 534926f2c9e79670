"""The placement ladder: the rungs a config walks until one serves.

    memory.py     where the walk starts: ladder.start, or the rung that won last time on this
                  kind of machine (GPU model x count, driver, image, config), kept in the volume
    reclaim.py    the barrier between two rungs: no process of ours survives, GPU memory back
                  near the baseline taken before the first launch
    balanced.py   a balanced split over several GPUs, planned from the GGUF layout and re-planned
                  from the engine's cudaMalloc shortfall lines after an OOM (the Calibrate effect)
    residency.py  once a llama.cpp rung serves: how much of the model stayed in host RAM, and a
                  warning when the vCPU per host-resident GiB is low

Which rung comes next is a policy (lifecycle/policy.py next_rung, calibrates); the machine asks
it, the loop runs the barrier and the re-plan. Kept free of imports.
"""
