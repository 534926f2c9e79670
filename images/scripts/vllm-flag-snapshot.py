#!/usr/bin/env python3
"""Write `vllm serve --help=all` to stdout where no GPU is present (an image build, a CI runner).

vLLM infers its platform (CUDA, ROCm, CPU, ...) before its CLI parses anything, and on a machine
without a GPU `vllm serve --help` dies with "Failed to infer device type". Pinning the platform
to vLLM's own CPU platform first lets the real parser print every flag; the flag list does not
depend on the platform (checked on vLLM 0.27.1: tests/fixtures/engine-logs has the output).
The supervisor lints every deploy config rung against this snapshot before launching vLLM.

    python vllm-flag-snapshot.py > /opt/kiln/engine/share/kiln/vllm-serve.help.txt
"""

import os
import sys

# vLLM's own log lines go to stdout; keep the snapshot to the parser's output alone.
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

import vllm.platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

vllm.platforms._current_platform = CpuPlatform()   # what vllm.platforms.__setattr__ would do

from vllm.entrypoints.cli.main import main  # noqa: E402 - after the platform is pinned

sys.argv = ["vllm", "serve", "--help=all"]
try:
    main()
except SystemExit as e:          # argparse exits 0 after printing help
    sys.exit(e.code or 0)
