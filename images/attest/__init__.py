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

The SBOM and provenance predicates come from the build's attest/ directory (sbom.py, provenance.py and
statement.py in this package make them: issue 53's SBOM/provenance part). In GitHub Actions the same
three attestations are made keyless by actions/attest and checked with `gh attestation verify`
(.github/workflows/images.yml, images/ci/promote.py).
"""
