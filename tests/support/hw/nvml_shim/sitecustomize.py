"""On a GPU pod the driver's device nodes exist, so the supervisor asks NVML (supervisor/host/hardware.py
_nvidia_device_nodes). This machine has none: loading the stand-in at interpreter start (this directory
is first on the child's PYTHONPATH) stands for them."""

import pynvml  # noqa: F401  (tests/support/hw/nvml_shim/pynvml.py)
