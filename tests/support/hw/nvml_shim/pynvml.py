"""`import pynvml` in a real supervisor process under test: the NVML stand-in of fake_pynvml.py with
KILN_FAKE_NVML_GPUS A40s (default one) and the driver branch KILN_FAKE_NVML_BRANCH names ("550", "570",
"580"). Put this directory first on the child's PYTHONPATH; it stands for NVIDIA's libnvidia-ml behind
nvidia-ml-py."""

import os
import sys

from tests.support.hw import fake_pynvml

_branch = os.environ.get("KILN_FAKE_NVML_BRANCH", "580")
_count = int(os.environ.get("KILN_FAKE_NVML_GPUS", "1"))
sys.modules[__name__] = fake_pynvml.FakeNVML([fake_pynvml.a40(i) for i in range(_count)],
                                             driver=fake_pynvml.DRIVERS[_branch])
