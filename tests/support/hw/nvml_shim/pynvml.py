"""`import pynvml` in a real supervisor process under test: the NVML stand-in of fake_pynvml.py with
one A40 and the driver branch KILN_FAKE_NVML_BRANCH names ("550", "570", "580"). Put this
directory first on the child's PYTHONPATH; it stands for NVIDIA's libnvidia-ml behind nvidia-ml-py."""

import os
import sys

from tests.support.hw import fake_pynvml

_branch = os.environ.get("KILN_FAKE_NVML_BRANCH", "580")
sys.modules[__name__] = fake_pynvml.FakeNVML([fake_pynvml.a40(0)], driver=fake_pynvml.DRIVERS[_branch])
