"""`keygen`, `sign`, `verify`: images signed with a key the user holds, and checked before they are trusted.

The signing key's password comes from $KILN_SIGNING_KEY_PASSWORD, never an argument (argv is visible to
every process on the machine); the private key is never printed. What is signed and where it is stored:
images/attest/ (start at its __init__.py) and docs/images.md, "Signed images".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..attest import keys
from .command import Command


def _keygen_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("kiln"), metavar="PREFIX",
                   help="write PREFIX.key (the private key, mode 0600, never overwritten) and PREFIX.pub "
                   "(default: kiln)")


def _keygen(args: argparse.Namespace) -> int:
    key, pub, encrypted = keys.generate(args.out)
    public = keys.load_public(pub, "--out")
    print(f"wrote {key} (private, {'encrypted with $' + keys.PASSWORD_ENV if encrypted else 'UNENCRYPTED'}) "
          f"and {pub} (public, {public.fingerprint})")
    if not encrypted:
        print(f"note: {key} is not encrypted: keep it off shared disks, or make it again with "
              f"{keys.PASSWORD_ENV} set", file=sys.stderr)
    return 0


def _sign_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, metavar="T", help="the target the image was built from "
                   "(recorded in the signature; a --verdict must be this target's)")
    p.add_argument("--image", required=True, metavar="REF@sha256:...", help="the pushed image, by the digest "
                   "the push printed (a tag could move between reading and signing)")
    p.add_argument("--key", required=True, type=Path, metavar="FILE", help="the private key (PEM, ECDSA P-256: "
                   f"`keygen` makes one); an encrypted one is opened with ${keys.PASSWORD_ENV}")
    p.add_argument("--attest", type=Path, metavar="DIR", help="the build's attest/ directory: attest "
                   "sbom.spdx.json (SPDX) and provenance.predicate.json (SLSA provenance v1) about the image")
    p.add_argument("--verdict", type=Path, metavar="FILE", help="the GPU gate's verdict, what `python -m images.ci "
                   "gate` printed: attested as https://kiln.dev/selftest-verdict/v1 (only for the image it ran)")


def _sign(args: argparse.Namespace) -> int:
    from ..attest.sign import Request, sign
    from ..registry import client_for, parse_ref

    key = keys.load_private(args.key)
    image = parse_ref(args.image)
    for line in sign(client_for(image.registry), Request(args.image, args.target, args.attest, args.verdict), key):
        print(line)
    if args.attest is None or args.verdict is None:
        missing = [o for o, v in (("--attest", args.attest), ("--verdict", args.verdict)) if v is None]
        print(f"note: without {' and '.join(missing)} this image does not pass `verify` yet: sign again with "
              f"{' and '.join(missing)} (the signature made now is kept)", file=sys.stderr)
    return 0


def _verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", required=True, metavar="REF", help="the image (a tag is resolved to its digest, "
                   "and that digest is what is verified)")
    key_argument(p)
    p.add_argument("--ungated", action="store_true", help="do not require the GPU gate's verdict (an image "
                   "released without a GPU gate); the signature, SBOM and provenance still are")


def key_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key", type=Path, metavar="FILE", help=f"the public key (PEM) the signatures must verify "
                   f"with (default: ${keys.VERIFY_KEY_ENV})")


def _verify(args: argparse.Namespace) -> int:
    from ..attest.verify import VerifyFailed, verify
    from ..registry import client_for, parse_ref

    key = keys.verify_key(args.key)
    try:
        done = verify(client_for(parse_ref(args.image).registry), args.image, key, require_verdict=not args.ungated)
    except VerifyFailed as e:
        for problem in e.problems:
            print(f"FAILED {problem}", file=sys.stderr)
        return 1
    for line in done.lines:
        print(f"ok {line}")
    return 0


COMMANDS = (
    Command("keygen", "make an ECDSA P-256 signing key pair (PREFIX.key, PREFIX.pub)", _keygen, _keygen_arguments,
            description="Make an ECDSA P-256 key pair for `sign`: PREFIX.key (PKCS#8 PEM, mode 0600, encrypted "
            f"with ${keys.PASSWORD_ENV} when it is set) and PREFIX.pub (PEM, what `verify --key`, `up --verify "
            "--key` and `cosign verify --key` take). An existing file is never overwritten."),
    Command("sign", "sign a pushed image's digest and attest its SBOM, provenance and GPU gate verdict",
            _sign, _sign_arguments,
            description="Sign a pushed image by digest with your key, stored beside it in its registry as cosign "
            "stores signatures (REPO:sha256-<hex>.sig); with --attest and --verdict also DSSE-signed in-toto "
            "statements about that digest for the SBOM, the provenance and the GPU gate's verdict "
            "(REPO:sha256-<hex>.att).\nRegistry credentials: $KILN_REGISTRY_USER and $KILN_REGISTRY_PASSWORD."),
    Command("verify", "verify an image's signature, SBOM, provenance and passed GPU gate with a public key",
            _verify, _verify_arguments,
            description="Verify an image as `promote` and `up --verify` do: the signature is over this exact "
            "manifest digest, and the SBOM, provenance and gate verdict attestations verify, name this digest, "
            "and the verdict says passed.\nExit 0 when all hold, 1 with one line per failure and its fix."),
)
