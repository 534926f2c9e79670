"""Kiln's exception tree. Every error Kiln raises on purpose is a KilnError, and each carries
what a person needs to fix it; `str()` is one readable message (the CLIs print it and exit 2).
tests/unit/test_errors.py checks that every exception class in supervisor/ and images/ is in
this tree and listed here.

    KilnError
    ├── ConfigError              a config, target or published change is invalid (all problems at once)
    │   └── RunPodSchemaError    (images.runpod_schema) a RunPod request body breaks the vendored v2 schema
    ├── FetchError               a download failed or did not verify
    │   ├── PlanError            (supervisor.model.fetch.plan) no file of the repo fits allow_patterns / model.entry
    │   ├── RangeIgnored         (supervisor.model.fetch.sink) a server answered a range request with other bytes
    │   └── ArtifactError        (images.binaries.artifacts) a binaries tarball could not be fetched or trusted
    │       ├── ArtifactCorrupt  its bytes are not the published bytes
    │       ├── ArtifactUnsafe   it would write outside its destination
    │       ├── ArtifactMismatch it is intact but not the one the target names
    │       ├── SmokeTestFailed  the extracted llama-server did not start
    │       └── RebuildMismatch  (images.binaries.rebuild) two compiles of the same inputs gave different tarballs
    ├── Cancelled                a stop was requested while a task ran (the task is gone)
    ├── ClientError              (supervisor.selftest.client) a request to the engine failed
    │   └── RequestCancelled     the selftest was told to stop (also a Cancelled)
    ├── GGUFError                (supervisor.model.gguf_layout) a model file's header cannot be read
    ├── SlotError                (supervisor.promptcache.slots) the engine's slot API refused or did not answer
    ├── DoesNotFit               (supervisor.ladder.balanced) no split of the model fits the free VRAM
    ├── IllegalTransition        (supervisor.lifecycle.state) a lifecycle transition the state machine forbids (a bug)
    ├── CannotListen             (supervisor.status.listen) a port the supervisor serves on cannot be bound
    │   └── PortBusy             another process already listens on it (named when psutil can tell)
    ├── FloatingRefused          (images.build.render) a target has unresolved pins and floating was not allowed
    ├── CudaMismatch             (images.build.render) a target's [cuda] version is not the CUDA its engine runs
    ├── ClosureMismatch          (images.build.render) the lock's engine.closure is not the closure file's sha256
    ├── FloorError               (images.pins.cudafloor) the engine's CUDA could not be measured, or disagrees
    ├── CudaUnknown              (images.pins.cuda) the index did not say which CUDA the engine runs
    ├── ClosureIncomplete        (images.pins.closure) the index lacks a package the engine's tree needs
    ├── NoSuchRelease            (images.upgrade.releases) the index has no usable file of the version asked for
    ├── SnapshotFailed           (images.upgrade.snapshot) an engine's parser could not be made to print its flags
    ├── BinariesError            (images.binaries.obtain) engine binaries could not be compiled or published
    ├── FactsError               (images.build.engine_facts) the pinned engine source cannot be read for its facts
    ├── PipFailed                (images.pins.requirements) pip could not download the supervisor's pinned wheels
    ├── RouterUnavailable        (supervisor.router.smg) the router did not answer its worker API
    ├── Refused                  (supervisor.router.control) a replica list pushed to the router it will not apply
    ├── KVTypeError              (supervisor.plan.kvtypes) a KV cache type the engine does not have
    ├── ShapeError               (supervisor.plan.shape) a model's shape cannot be read for a plan
    ├── SourceError              (images.plan.source) a plan's --model source cannot be read
    ├── Unavailable              (images.generate) what a generated file is made from cannot be had here
    ├── EngineUnavailable        (images.build.docker) no Docker engine answers
    ├── BuildFailed              (images.build.docker) the image build failed
    ├── GateFailed               (images.ci.gate) the GPU selftest gate did not pass
    ├── SbomInvalid              (images.attest.sbom) an SBOM is not a valid SPDX 2.3 document
    ├── StatementError           (images.attest.statement) an in-toto statement's subject or type is wrong
    ├── EnvelopeError            (images.attest.dsse) not a DSSE envelope (bad JSON, a missing field, bad base64)
    ├── KeyFileError             (images.attest.keys) a signing or verifying key file cannot be read or used
    ├── SignError                (images.attest.sign) an image could not be signed (nothing was written)
    ├── VerdictError             (images.attest.verdict) the gate's verdict is not one Kiln can sign
    ├── VerifyFailed             (images.attest.verify) an image's signature or attestations do not verify
    ├── RegistryError            (images.registry) a container registry refused, or could not be asked
    │   └── PromoteError         (images.ci.promote) staging tags could not be promoted
    ├── RunPodAPIError           (images.runpod.api) RunPod's API refused or failed a request
    ├── NoMatchingHost           (images.runpod.pods) RunPod's catalog offers no host the image runs on
    └── NoMatchingPool           (images.runpod.endpoints) no serverless pool offers a GPU the image runs on
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

NO_VALUE: Any = object()     # a Problem with no bad value to show (a missing key, say)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config or a target: where (the field path), what, the bad value and
    what is allowed. supervisor/validate.py's Reader collects them; a ConfigError carries them all."""
    path: str
    message: str
    value: Any = NO_VALUE
    allowed: str | None = None

    def __str__(self) -> str:
        out = f"{self.path}: {self.message}"
        if self.value is not NO_VALUE:
            out += f" (got {self.value!r})"
        if self.allowed:
            out += f"; allowed: {self.allowed}"
        return out


class KilnError(Exception):
    """Base of every error Kiln raises on purpose. `str()` is one readable message."""


class ConfigError(KilnError):
    def __init__(self, what: str, problems: Sequence[Problem]):
        self.what = what
        self.problems = list(problems)
        lines = [f"{what}: {len(self.problems)} problem(s)"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class FetchError(KilnError):
    """A download failed or did not verify; the message says which file and why."""


class Cancelled(KilnError):
    """A stop was requested while a task ran (a fetch, a selftest); the task is gone."""
