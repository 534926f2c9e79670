"""The signing key a user holds: ECDSA P-256 with SHA-256, the one scheme cosign requires of every
implementation (sigstore/cosign specs/SIGNATURE_SPEC.md, "Signature Schemes"), so `cosign verify --key`
takes Kiln's public key file as it is (a PEM `PUBLIC KEY`, SubjectPublicKeyInfo).

    load_private(path)   the signer: a PEM private key (PKCS#8 or OpenSSL's SEC1 `EC PRIVATE KEY`);
                         an encrypted one is opened with $KILN_SIGNING_KEY_PASSWORD, never an argument
    load_public(path)    the verifier: a PEM public key
    generate(prefix)     PREFIX.key (mode 0600, encrypted when $KILN_SIGNING_KEY_PASSWORD is set) and PREFIX.pub

A private key never reaches a message, a log or a repr: errors name the file and what is wrong with it,
never its content. Signatures are DER-encoded (r, s), what cosign writes and reads.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from supervisor.errors import KilnError

PASSWORD_ENV = "KILN_SIGNING_KEY_PASSWORD"      # the private key's password (never an argument: argv is public)
VERIFY_KEY_ENV = "KILN_VERIFY_KEY"              # the public key file `--verify` uses when --key is not given
MAKE_ONE = "make one with `python build.py keygen --out kiln` (or openssl, docs/images.md)"


class KeyFileError(KilnError):
    """A key file that cannot be used: the message names the file and the fix, never the key."""


@dataclass(frozen=True)
class PublicKey:
    key: ec.EllipticCurvePublicKey
    source: str                                   # where it came from, for messages

    @property
    def fingerprint(self) -> str:
        """sha256 of the DER SubjectPublicKeyInfo: `openssl pkey -pubin -outform DER | sha256sum` prints the same."""
        der = self.key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return "sha256:" + hashlib.sha256(der).hexdigest()

    def describe(self) -> str:
        return f"{self.source} ({self.fingerprint[:19]}…)"

    def verifies(self, data: bytes, signature: bytes) -> bool:
        try:
            self.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
            return True
        except (InvalidSignature, ValueError):
            return False

    def pem(self) -> bytes:
        return self.key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class PrivateKey:
    source: str
    _key: ec.EllipticCurvePrivateKey = field(repr=False)

    @property
    def public(self) -> PublicKey:
        return PublicKey(self._key.public_key(), f"{self.source} (its public half)")

    def sign(self, data: bytes) -> bytes:
        """ECDSA P-256 over SHA-256(data), DER-encoded."""
        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))


def _read(option: str, path: Path) -> bytes:
    if not path.is_file():
        raise KeyFileError(f"{option} {path}: no such file; {MAKE_ONE}")
    try:
        return path.read_bytes()
    except OSError as e:
        raise KeyFileError(f"{option} {path}: cannot be read ({e.strerror})") from None


def _p256(option: str, path: Path, key: object) -> None:
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) \
            or not isinstance(key.curve, ec.SECP256R1):
        what = f"an EC {key.curve.name} key" if isinstance(key, (ec.EllipticCurvePrivateKey,
                                                                  ec.EllipticCurvePublicKey)) \
            else f"a {type(key).__name__.lstrip('_')} key"
        raise KeyFileError(f"{option} {path}: {what}; Kiln signs with ECDSA P-256 (cosign's scheme): {MAKE_ONE}")


def load_private(path: Path, option: str = "--key") -> PrivateKey:
    data = _read(option, path)
    if b"ENCRYPTED SIGSTORE PRIVATE KEY" in data or b"ENCRYPTED COSIGN PRIVATE KEY" in data:
        raise KeyFileError(f"{option} {path}: a key in cosign's own encrypted format, which Kiln does not read; "
                           f"use a PEM key ({MAKE_ONE}); cosign signs and verifies with PEM keys too")
    if b"PUBLIC KEY" in data and b"PRIVATE KEY" not in data:
        raise KeyFileError(f"{option} {path}: a public key; signing takes the private key (the .key file)")
    password = os.environ.get(PASSWORD_ENV)
    try:
        key = serialization.load_pem_private_key(data, password.encode() if password else None)
    except TypeError:
        if password:      # a password given for a key that has none
            key = serialization.load_pem_private_key(data, None)
        else:
            raise KeyFileError(f"{option} {path}: the key is encrypted: export {PASSWORD_ENV} with its password "
                               "(it is never taken as an argument)") from None
    except (ValueError, UnsupportedAlgorithm):
        why = f"the password in {PASSWORD_ENV} does not open it, or it" if password else "it"
        raise KeyFileError(f"{option} {path}: {why} is not a PEM private key; {MAKE_ONE}") from None
    _p256(option, path, key)
    return PrivateKey(str(path), key)       # type: ignore[arg-type]


def load_public(path: Path, option: str = "--key") -> PublicKey:
    data = _read(option, path)
    if b"PRIVATE KEY" in data:
        raise KeyFileError(f"{option} {path}: a private key; verifying takes only the public key (the .pub file): "
                           "keep the private one where it signs")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise KeyFileError(f"{option} {path}: not a PEM public key (-----BEGIN PUBLIC KEY-----); {MAKE_ONE}") from None
    _p256(option, path, key)
    return PublicKey(key, str(path))        # type: ignore[arg-type]


def verify_key(path: Path | None, option: str = "--key") -> PublicKey:
    """The public key to verify with: `option`'s file, else $KILN_VERIFY_KEY's, else one line saying how."""
    if path is not None:
        return load_public(path, option)
    env = os.environ.get(VERIFY_KEY_ENV)
    if env:
        return load_public(Path(env), f"${VERIFY_KEY_ENV}")
    raise KeyFileError(f"verifying needs the signer's public key: {option} FILE or ${VERIFY_KEY_ENV}=FILE")


def generate(prefix: Path) -> tuple[Path, Path, bool]:
    """Write PREFIX.key (0600, created only if absent) and PREFIX.pub; returns (key, pub, encrypted)."""
    key_path, pub_path = prefix.with_name(prefix.name + ".key"), prefix.with_name(prefix.name + ".pub")
    taken = [str(p) for p in (key_path, pub_path) if p.exists()]
    if taken:
        raise KeyFileError(f"--out {prefix}: {' and '.join(taken)} already exist(s): a key is never overwritten; "
                           "choose another --out")
    password = os.environ.get(PASSWORD_ENV)
    key = ec.generate_private_key(ec.SECP256R1())
    encryption = serialization.BestAvailableEncryption(password.encode()) if password \
        else serialization.NoEncryption()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_path.write_bytes(PublicKey(key.public_key(), str(pub_path)).pem())
    return key_path, pub_path, bool(password)
