#!/usr/bin/env python3
"""Kiln: bake LLM-serving images. A thin CLI over the images package.

    python build.py --list
    python build.py [--target T]                  build the image (default: cpu-llamacpp)
    python build.py --target T --render --out D   Dockerfile + context only, no engine
    python build.py lock --target T               resolve pins into images/lock.toml
    python build.py compile --target T            compile llama-server on this host (cached)
    python build.py publish-binaries --target T --store S [--in-build]   pack + publish the compiled binaries
    python build.py --target T --print-tag        the image's immutable tag
    python build.py --target T --runpod-template  the RunPod template (JSON); --runpod-upsert creates or
                                                  updates it by name ($RUNPOD_API_KEY)

`python build.py <command> --help` says more.
"""

import sys

from images.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
