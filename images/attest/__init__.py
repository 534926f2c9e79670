"""What an image or an engine tarball is made of and how it was made, as documents others can check.

    build.py build --target T
        |  the build context (Dockerfile, requirements files) + the lock + the built image
        v
    inputs.py       what the build read, each with its digest, from the pins and the context
    dpkg.py         the image's distribution packages, from its own /var/lib/dpkg/status
    sbom.py         -> an SPDX 2.3 document, checked against the spec's own JSON schema
    provenance.py   -> a SLSA provenance v1 predicate (build type, parameters, dependencies, run)
    write.py        -> <out>/attest/sbom.spdx.json and provenance.predicate.json
    statement.py    an in-toto Statement v1 around a predicate, once the subject's digest is known
                    (the pushed image's manifest digest; a published tarball's sha256)
    refs.py         image references and package URLs

Everything in the documents is read from what Kiln pinned and what the image holds, never guessed:
a pin that is unresolved is written as floating with its reason, never filled in.
"""
