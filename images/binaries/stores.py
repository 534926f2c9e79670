"""Where binaries artifacts live: a local directory, or a Hugging Face Hub repo.

A store only moves the files of a packed artifact (tarball, manifest, sha256, and the provenance
statement publish-binaries writes beside the tarball, when there is one); it trusts nothing. Trust is images.binaries.artifacts.verify + extract_and_smoke, after fetch.

    open_store("hf://owner/name@revision")   -> HubStore, files under binaries/<name> in the repo
    open_store("hf://datasets/owner/name")   -> HubStore on a dataset repo
    open_store("/var/cache/kiln/binaries")   -> LocalStore
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol, runtime_checkable

from .artifacts import (ArtifactError, Packed, _tmp_path, check_tarball_name, manifest_name, provenance_name,
                        sha256_name)
from supervisor.redact import redact

if TYPE_CHECKING:
    from huggingface_hub import HfApi

HUB_PREFIX = "binaries"
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


@runtime_checkable
class Store(Protocol):
    def put(self, packed: Packed) -> str:
        """Publish the files (with the provenance statement where there is one); return where they went."""
        ...

    def fetch(self, name: str, dest_dir: Path) -> tuple[Path, Path]:
        """Download (tarball, manifest) for tarball `name` into dest_dir."""
        ...

    def exists(self, name: str) -> bool:
        ...


def _copy_atomic(src: Path, dest: Path) -> Path:
    """Copy via a temp file and rename, so a reader never sees half a file under the real name."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(dest.parent, dest.name)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _statement(packed: Packed) -> Path:
    """The provenance statement publish-binaries wrote beside the tarball (images/cli/attest_binaries.py)."""
    return packed.tarball.with_name(provenance_name(packed.tarball.name))


class LocalStore:
    """A directory holding <stem>.tar.gz, <stem>.manifest.json and <stem>.sha256 side by side."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def put(self, packed: Packed) -> str:
        name = check_tarball_name(packed.tarball.name)
        self.root.mkdir(parents=True, exist_ok=True)
        # The manifest goes last: exists() looks for it, so a reader never sees a half-published artifact.
        _copy_atomic(packed.tarball, self.root / name)
        _copy_atomic(packed.sha256_file, self.root / sha256_name(name))
        if _statement(packed).is_file():
            _copy_atomic(_statement(packed), self.root / provenance_name(name))
        _copy_atomic(packed.manifest, self.root / manifest_name(name))
        return str(self.root / name)

    def fetch(self, name: str, dest_dir: Path) -> tuple[Path, Path]:
        name = check_tarball_name(name)
        missing = [f for f in (name, manifest_name(name)) if not (self.root / f).is_file()]
        if missing:
            raise ArtifactError(f"local store {self.root}: no {' or '.join(missing)}: nothing published under that name")
        dest_dir = Path(dest_dir)
        manifest = _copy_atomic(self.root / manifest_name(name), dest_dir / manifest_name(name))
        tarball = _copy_atomic(self.root / name, dest_dir / name)
        return tarball, manifest

    def exists(self, name: str) -> bool:
        name = check_tarball_name(name)
        return (self.root / name).is_file() and (self.root / manifest_name(name)).is_file()


class HubStore:
    """A Hub repo holding binaries/<stem>.tar.gz, binaries/<stem>.manifest.json and binaries/<stem>.sha256.

    ``token`` None means huggingface_hub's own lookup (HF_TOKEN, the stored login). The token is
    never put into a message: errors are rebuilt from what is known (repo, revision, file, status).
    """

    def __init__(
        self,
        repo_id: str,
        *,
        revision: str = "main",
        token: str | None = None,
        endpoint: str | None = None,
        repo_type: str = "model",
    ) -> None:
        if not _REPO_ID.fullmatch(repo_id):
            raise ArtifactError(f"Hub repo id {repo_id!r} is not owner/name")
        if repo_type not in ("model", "dataset"):
            raise ArtifactError(f"Hub repo type {repo_type!r} is not 'model' or 'dataset'")
        if not revision:
            raise ArtifactError("Hub revision is empty")
        self.repo_id = repo_id
        self.revision = revision
        self.endpoint = endpoint
        self.repo_type = repo_type
        self._token = token  # private, and kept out of __repr__

    def __repr__(self) -> str:
        return f"HubStore({self.repo_id!r}, revision={self.revision!r}, repo_type={self.repo_type!r})"

    @property
    def _where(self) -> str:
        kind = "" if self.repo_type == "model" else f"{self.repo_type} "
        at = f" at {self.endpoint}" if self.endpoint else ""
        return f"Hub {kind}repo {self.repo_id}{at}"

    def _api(self) -> HfApi:  # imported late: LocalStore users never import huggingface_hub
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self._token)

    def put(self, packed: Packed) -> str:
        from huggingface_hub import CommitOperationAdd

        name = check_tarball_name(packed.tarball.name)
        if re.fullmatch(r"[0-9a-f]{40}", self.revision):
            raise ArtifactError(f"{self._where}: cannot publish to commit {self.revision}: give a branch")
        api = self._api()
        ops = [
            CommitOperationAdd(path_in_repo=f"{HUB_PREFIX}/{name}", path_or_fileobj=str(packed.tarball)),
            CommitOperationAdd(path_in_repo=f"{HUB_PREFIX}/{sha256_name(name)}", path_or_fileobj=str(packed.sha256_file)),
            CommitOperationAdd(path_in_repo=f"{HUB_PREFIX}/{manifest_name(name)}", path_or_fileobj=str(packed.manifest)),
        ]
        if _statement(packed).is_file():
            ops.append(CommitOperationAdd(path_in_repo=f"{HUB_PREFIX}/{provenance_name(name)}",
                                          path_or_fileobj=str(_statement(packed))))
        try:
            api.create_repo(self.repo_id, repo_type=self.repo_type, exist_ok=True)
            if self.revision != "main":  # publishing to a branch: make it (from main) the first time
                api.create_branch(self.repo_id, branch=self.revision, repo_type=self.repo_type, exist_ok=True)
            # One commit for every file: nobody can fetch a tarball without its manifest.
            info = api.create_commit(
                self.repo_id,
                ops,
                commit_message=f"Add binaries {name}",
                commit_description=f"sha256 {packed.sha256}",
                repo_type=self.repo_type,
                revision=self.revision,
            )
        except Exception as err:  # noqa: BLE001 - every client error becomes one clear ArtifactError
            self._raise(err, f"publishing {HUB_PREFIX}/{name}")
        kind = "" if self.repo_type == "model" else "datasets/"
        return f"hf://{kind}{self.repo_id}@{info.oid}/{HUB_PREFIX}/{name}"

    def fetch(self, name: str, dest_dir: Path) -> tuple[Path, Path]:
        name = check_tarball_name(name)
        dest_dir = Path(dest_dir)
        # Manifest first: it is small, and a missing one fails before the big download starts.
        manifest = _copy_atomic(self._download(manifest_name(name)), dest_dir / manifest_name(name))
        tarball = _copy_atomic(self._download(name), dest_dir / name)
        return tarball, manifest

    def exists(self, name: str) -> bool:
        """True when the file is there to fetch; False for a missing repo, revision or file."""
        name = check_tarball_name(name)
        try:
            return bool(self._api().file_exists(
                self.repo_id, f"{HUB_PREFIX}/{name}", repo_type=self.repo_type, revision=self.revision,
            ))
        except Exception as err:  # noqa: BLE001
            self._raise(err, f"looking for {HUB_PREFIX}/{name}")

    def _download(self, filename: str) -> Path:
        from huggingface_hub import hf_hub_download

        path_in_repo = f"{HUB_PREFIX}/{filename}"
        try:
            # Into the HF cache, so a second boot (or an offline one) reuses what is already there.
            return Path(hf_hub_download(
                self.repo_id, path_in_repo, repo_type=self.repo_type, revision=self.revision,
                endpoint=self.endpoint, token=self._token,
            ))
        except Exception as err:  # noqa: BLE001
            self._raise(err, f"fetching {path_in_repo}")

    def _raise(self, err: Exception, doing: str) -> NoReturn:
        """Re-raise a client error as an ArtifactError naming repo, revision and file, never the token."""
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        where = f"{self._where}, revision {self.revision!r}"
        if isinstance(err, ArtifactError):
            raise err
        if isinstance(err, GatedRepoError):
            msg = f"{doing}: {where} is gated: accept its terms with the account whose token is used"
        elif isinstance(err, RepositoryNotFoundError):
            msg = (f"{doing}: {where} does not exist, or is private and the token given cannot see it"
                   f"{'' if self._token or os.environ.get('HF_TOKEN') else ' (no token was given)'}")
        elif isinstance(err, RevisionNotFoundError):
            msg = f"{doing}: {self._where} has no revision {self.revision!r} (branch, tag or commit)"
        elif isinstance(err, LocalEntryNotFoundError):
            # hf_hub_download could not reach the Hub and nothing usable was in the HF cache.
            msg = f"{doing}: {where}: the Hub could not be reached and the file is not in the local HF cache"
        elif isinstance(err, EntryNotFoundError):
            msg = f"{doing}: {where} has no such file: no binaries were published under that name"
        elif isinstance(err, HfHubHTTPError):
            status = err.response.status_code if getattr(err, "response", None) is not None else "?"
            hint = {401: "the token is invalid or lacks access", 403: "the token may not write here",
                    429: "rate limited: try again later"}.get(status, "")
            server = self._scrub(getattr(err, "server_message", "") or "")
            msg = (f"{doing}: {where}: the Hub answered HTTP {status}"
                   + (f" ({hint})" if hint else "") + (f": {server}" if server else ""))
        else:
            msg = f"{doing}: {where}: {type(err).__name__}: {self._scrub(str(err))}"
        # `from None`: the client's exception carries request details we did not write and cannot
        # promise are free of secrets; its type is in our message where it matters.
        raise ArtifactError(msg) from None

    def _scrub(self, text: str) -> str:
        text = redact(text, [self._token, os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN")])
        return text[:500]


def open_store(spec: str, *, token: str | None = None, endpoint: str | None = None) -> Store:
    """"hf://[datasets/]owner/name[@revision]" -> HubStore; anything else is a local directory."""
    if not spec.startswith("hf://"):
        if not spec:
            raise ArtifactError("binaries store is empty: give a directory or hf://owner/name[@revision]")
        return LocalStore(Path(spec))
    rest = spec[len("hf://"):]
    repo_type = "model"
    for prefix, kind in (("datasets/", "dataset"), ("models/", "model")):
        if rest.startswith(prefix):
            rest, repo_type = rest[len(prefix):], kind
    # The revision may itself hold '/' (branch feat/x): split at the first '@' only.
    repo_id, _, revision = rest.partition("@")
    if not _REPO_ID.fullmatch(repo_id) or ("@" in spec and not revision):
        raise ArtifactError(f"binaries store {spec!r} is not hf://owner/name[@revision]")
    return HubStore(repo_id, revision=revision or "main", token=token, endpoint=endpoint, repo_type=repo_type)
