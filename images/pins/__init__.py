"""Pins: every input of a build, resolved and locked, and the CUDA an engine really needs.

    target (images/target.py) ── lock.py      images/lock.toml: base digests, engine commit or sdist/wheel
                                              sha256, patch sha256s, each with where it came from
                                 resolve.py   `build.py lock`: registry digests (OCI), git ls-remote, PyPI hashes
                                 pyclosure.py can the index reach every package a pinned engine wheel needs?
                                              (a walk that checks itself against every requirement met)
                                 closure.py   that closure hash-locked: images/closures/<pkg>-<ver>-cp312.txt,
                                              its sha256 the pin engine.closure; the image installs it
                                              with pip --require-hashes
                                 requirements.py  supervisor/requirements.txt, every wheel hashed (generate)
    the engine's CUDA ────────── cuda.py      what the target declares vs what its engine is known to need
                                 cudafloor.py measured from what is installed (libcudart SONAME, torch's CUDA);
                                              also copied into the image build, where it writes share/kiln/cuda.json
    another engine version ───── images/upgrade/ (`build.py upgrade`, its own folder above pins and binaries)

A failed refresh keeps a previously resolved value: an outage never unpins a working build.
"""
