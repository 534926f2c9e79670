#!/usr/bin/env python3
"""Kiln's workstation CLI: bake LLM-serving images, deploy them on RunPod, publish configs to a fleet.
A thin entry point over images/cli/app.py; `pip install -e .` installs the same parser as `kiln`.

    python build.py list                                  the targets
    python build.py build --target T                      build the image (default target: cpu-llamacpp)
    python build.py render --target T --out D             Dockerfile + build context only, no engine
    python build.py tag --target T                        the image's immutable tag
    python build.py lock --target T                       resolve pins into images/lock.toml
    python build.py compile --target T                    compile llama-server on this host (cached)
    python build.py publish-binaries --target T --store S pack + publish the compiled binaries
    python build.py template --target T [--upsert]        the RunPod template (JSON), or create/update it
    python build.py pods up|status|logs|down|volumes      RunPod pods from a target's template
    python build.py publish-config FILE --repo R          validate a deploy config, upload it for pods to take
    python build.py fleet-status --repo R                 the pods reporting to a Hub repo

`python build.py --help` lists the commands, `python build.py COMMAND --help` says what each takes;
docs/cli.md is the same text.
"""

import sys

from images.cli.app import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
