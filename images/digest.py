"""The sha256 of a file, as hex: the one helper images/, kiln_dev/ and bench/ use (supervisor/, which
imports nothing of images/, calls hashlib.file_digest itself). A leaf module: it imports no Kiln code.
A digest taken while the bytes stream elsewhere (a download, an extraction) hashes in that loop instead."""

from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike[str]) -> str:
    """hashlib.file_digest (Python 3.11) reads the file in blocks, never whole into memory."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
