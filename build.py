#!/usr/bin/env python3
"""Kiln: bake LLM-serving images. A thin CLI over the images package (images/cli/).

    python build.py list                                  the targets
    python build.py build --target T                      build the image (default target: cpu-llamacpp)
    python build.py render --target T --out D             Dockerfile + build context only, no engine
    python build.py tag --target T                        the image's immutable tag
    python build.py lock --target T                       resolve pins into images/lock.toml
    python build.py compile --target T                    compile llama-server on this host (cached)
    python build.py publish-binaries --target T --store S pack + publish the compiled binaries
    python build.py template --target T [--upsert]        the RunPod template (JSON), or create/update it

`python build.py --help` lists the commands, `python build.py COMMAND --help` says what each takes;
docs/cli.md is the same text. The old flag spellings (--list, --render, --print-tag, ...) still work
until the next release, with a deprecation line naming the new one.
"""

import sys

from images.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
