"""The engine's binaries: compiled once, published as a verified tarball, fetched instead of compiled.

    obtain.py     what a target expects its binaries to be; compile on a host (the one recipe,
                  images/scripts/compile-llama-server.sh), or fetch: store -> sha256 -> manifest vs
                  the target -> name -> extract -> `llama-server --version` smoke -> trusted
    artifacts.py  the tarball: a deterministic archive whose name encodes engine source, patch set,
                  CUDA, arch, build flags and base; its manifest and .sha256
    stores.py     where artifacts live: a local directory, or a Hugging Face Hub repo
    rebuild.py    compile again from scratch and compare, byte for byte (--rebuild-check, rebuild-binaries)

A tarball built for another arch, CUDA, source, patch set or base is refused naming each field.
"""
