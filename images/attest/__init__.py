"""Attestations: what an image is (SBOM), how it was made (provenance), whether it served (the GPU gate's
verdict), each signed over the image's manifest digest and kept beside it in its registry (issue 53).

    sign (workstation, a key the user holds)                 verify (promote, up --verify)
    ----------------------------------------                 -----------------------------
    keys.py          the ECDSA P-256 key: load, generate      keys.py     the public key
    simplesigning.py the signature payload naming the digest  verify.py   digest -> .sig -> .att -> verdict
    dsse.py          DSSE envelope around an in-toto           dsse.py     PAE, the signature, the same bytes out
                     statement (PAE, then ECDSA)
    verdict.py       the gate's record as a predicate          verdict.py  did it pass
    store.py         <repo>:sha256-<hex>.sig / .att, cosign's  store.py    read them back
                     layout (tag-based discovery)
    sign.py          the four signed things, checked first, then pushed

What the build writes (the SBOM and provenance predicates, in the build output's attest/ directory):

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
a pin that is unresolved is written as floating with its reason, never filled in. In GitHub Actions the same
three attestations are made keyless by actions/attest and checked with `gh attestation verify`
(.github/workflows/images.yml, images/ci/promote.py).
"""
