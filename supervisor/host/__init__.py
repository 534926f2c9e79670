"""The host: what machine this is, and whether it is the one the config was made for.

    hardware.py   GPUs (NVML, else nvidia-smi), the container's real vCPU and RAM (cgroups), the
                  [hardware] guard, GPU memory in use (the reclaim barrier's baseline)
    cuda.py       the driver's CUDA (NVML) against the CUDA this image's engine needs

Kept free of imports.
"""
