"""An in-toto Statement v1 around a predicate: one subject, named and pinned by its sha256.

The layout is in-toto's (https://github.com/in-toto/attestation spec/v1/statement.md, read at commit
051624ce466deaed4c5a66e66877f69b471fccbe): `_type`, `subject` (ResourceDescriptors, each with a
`digest`), `predicateType`, `predicate`. Kiln's subjects are a pushed image's manifest digest (the
image's SBOM and provenance, signed by images/attest/) and a published engine tarball.
"""

from __future__ import annotations

import re
from typing import Any

from supervisor.errors import KilnError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE_V1 = "https://slsa.dev/provenance/v1"      # SLSA v1.0 provenance, spec/provenance.md
SPDX_DOCUMENT = "https://spdx.dev/Document"                 # in-toto spec/predicates/spdx2.md

_HEX64 = re.compile(r"[0-9a-f]{64}")
_URI = re.compile(r"[a-z][a-z0-9+.-]*:\S+")


class StatementError(KilnError):
    """A statement's subject or predicate type is not what in-toto's Statement v1 takes."""


def statement(subject_name: str, digest_sha256: str, predicate_type: str, predicate: dict) -> dict[str, Any]:
    """The Statement v1 binding `predicate` to the artifact `subject_name` whose sha256 is `digest_sha256`
    (64 lowercase hex, with or without a `sha256:` prefix, as an image digest is written)."""
    problems = []
    if not isinstance(subject_name, str) or not subject_name.strip():
        problems.append(f"subject_name {subject_name!r}: give the artifact's name (an image reference, a file "
                        "name), or '_' where a name means nothing")
    hexdigest = digest_sha256.removeprefix("sha256:") if isinstance(digest_sha256, str) else ""
    if not _HEX64.fullmatch(hexdigest):
        problems.append(f"digest_sha256 {digest_sha256!r}: expected 64 lowercase hex digits (optionally "
                        "prefixed sha256:), the artifact's sha256")
    if not isinstance(predicate_type, str) or not _URI.fullmatch(predicate_type):
        problems.append(f"predicate_type {predicate_type!r}: expected a URI such as {SLSA_PROVENANCE_V1}")
    if not isinstance(predicate, dict):
        problems.append(f"predicate: expected a JSON object (dict), got {type(predicate).__name__}")
    if problems:
        raise StatementError("in-toto statement: " + "; ".join(problems))
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": hexdigest}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }
