"""Binaries stores: a local directory, and a Hugging Face Hub repo, moving real packed artifacts.

HubStore is driven through the REAL huggingface_hub client (create_repo, create_commit,
hf_hub_download, file_exists) against kiln_dev/hub/, a local stand-in for
huggingface.co: the public Hub cannot be reached from CI or the sandboxes these tests run in.
tests/integration/test_hubserver.py checks the stand-in against the same client.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # plain `pytest` (not `python -m pytest`) from anywhere
    sys.path.insert(0, str(ROOT))

from huggingface_hub import HfApi  # noqa: E402

from images.binaries.artifacts import (
    ArtifactError,
    ArtifactSpec,
    Packed,
    build_config_hash,
    extract_and_smoke,
    manifest_name,
    provenance_name,
    pack,
    sha256_name,
    verify,
)
from images.binaries.stores import HubStore, LocalStore, Store, open_store  # noqa: E402
from kiln_dev.hub import ClientEnv, HubServer, client_env  # noqa: E402

REPO = "kiln-test/binaries"
# Looks like a real token so any code that pattern-matches tokens treats it as one.
CANARY = "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0042"
SPEC = ArtifactSpec(
    engine="llama.cpp", source="sdist:sha256:" + "b0a2feb64c6f" + "0" * 52, patch_set="none",
    cuda="none", archs="cpu", build_config=build_config_hash([], "5" * 64), base="os:debian-12",
)


def make_prefix(root: Path) -> Path:
    """A compiled-prefix look-alike whose bin/llama-server is a shell script printing a version."""
    (root / "bin").mkdir(parents=True)
    (root / "share" / "kiln").mkdir(parents=True)
    (root / "bin" / "llama-server").write_text('#!/bin/sh\necho "version: 1 (test)" >&2\n')
    (root / "bin" / "llama-server").chmod(0o755)
    (root / "share" / "kiln" / "llama-server.version.txt").write_text("version: 1 (test)\n")
    (root / "share" / "kiln" / "llama-server.help.txt").write_text("-m, --model FNAME\n")
    (root / "share" / "kiln" / "build-info.env").write_text("KILN_ENGINE=llama.cpp\n")
    return root


@pytest.fixture
def packed(tmp_path: Path) -> Packed:
    return pack(make_prefix(tmp_path / "prefix"), SPEC, tmp_path / "packed")


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubServer]:
    with HubServer(tmp_path / "hub-store", token=CANARY) as server:
        yield server


@pytest.fixture
def env(hub: HubServer, tmp_path: Path) -> Iterator[ClientEnv]:
    with client_env(hub, tmp_path / "hf-home") as applied:
        yield applied


def _fetch_and_trust(store: Store, dest: Path) -> Path:
    tarball, manifest = store.fetch(SPEC.name(), dest / "download")
    checked = verify(tarball, manifest, SPEC)
    return extract_and_smoke(tarball, checked, dest / "llama")


def _all_text(err: BaseException) -> str:
    """Everything a person or a log could see of an exception: message, repr, full traceback."""
    return str(err) + repr(err) + "".join(traceback.format_exception(err))


# ----------------------------------------------------------------------------- LocalStore


def test_local_store_round_trip(packed: Packed, tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    assert isinstance(store, LocalStore) and isinstance(store, Store)
    assert not store.exists(SPEC.name())
    location = store.put(packed)
    assert location == str(tmp_path / "store" / SPEC.name())
    assert store.exists(SPEC.name())
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == sorted(
        [SPEC.name(), manifest_name(SPEC.name()), sha256_name(SPEC.name())]
    )  # no temp files left behind
    dest = _fetch_and_trust(store, tmp_path / "boot")
    assert (dest / "bin" / "llama-server").is_file()


def test_local_store_missing_name_is_clear(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    with pytest.raises(ArtifactError, match=f"local store .*store: no {SPEC.name()}"):
        store.fetch(SPEC.name(), tmp_path / "dl")
    with pytest.raises(ArtifactError, match="not a binaries tarball name"):
        store.fetch("../../etc/passwd.tar.gz", tmp_path / "dl")


# ----------------------------------------------------------------------------- HubStore


def test_hub_store_round_trip(packed: Packed, hub: HubServer, env: ClientEnv, tmp_path: Path) -> None:
    store = open_store(f"hf://{REPO}", token=CANARY, endpoint=hub.url)
    assert isinstance(store, HubStore)
    assert not store.exists(SPEC.name())  # the repo does not exist yet: not an error

    location = store.put(packed)
    commit = hub.resolve(REPO)
    assert location == f"hf://{REPO}@{commit}/binaries/{SPEC.name()}"
    assert hub.counts["commit"] == 1  # tarball, manifest and sha256 in one commit
    files = HfApi(endpoint=hub.url, token=CANARY).list_repo_files(REPO)
    assert sorted(files) == sorted([".gitattributes", f"binaries/{SPEC.name()}",
                                    f"binaries/{manifest_name(SPEC.name())}", f"binaries/{sha256_name(SPEC.name())}"])
    assert store.exists(SPEC.name())

    dest = _fetch_and_trust(store, tmp_path / "boot")
    assert (dest / "bin" / "llama-server").read_bytes() == (tmp_path / "prefix" / "bin" / "llama-server").read_bytes()
    # The download went through the HF cache (a later offline boot can reuse it).
    assert any(env.cache_dir.rglob(SPEC.name()))


def test_a_provenance_statement_beside_the_tarball_travels_in_the_same_commit(
    packed: Packed, hub: HubServer, env: ClientEnv, tmp_path: Path
) -> None:
    statement = packed.tarball.with_name(provenance_name(packed.tarball.name))
    statement.write_text('{"_type": "https://in-toto.io/Statement/v1"}\n')   # what publish-binaries writes there
    open_store(f"hf://{REPO}", token=CANARY, endpoint=hub.url).put(packed)
    assert hub.counts["commit"] == 1
    assert f"binaries/{provenance_name(SPEC.name())}" in HfApi(endpoint=hub.url, token=CANARY).list_repo_files(REPO)
    local = open_store(str(tmp_path / "store"))
    local.put(packed)
    assert (tmp_path / "store" / provenance_name(SPEC.name())).read_bytes() == statement.read_bytes()


def test_hub_store_publishes_to_a_branch_and_fetches_from_it(
    packed: Packed, hub: HubServer, env: ClientEnv, tmp_path: Path
) -> None:
    store = open_store(f"hf://{REPO}@builds/cpu", token=CANARY, endpoint=hub.url)
    assert isinstance(store, HubStore) and store.revision == "builds/cpu"
    store.put(packed)
    assert hub.resolve(REPO, "builds/cpu") != hub.resolve(REPO, "main")
    assert not HubStore(REPO, token=CANARY, endpoint=hub.url).exists(SPEC.name())  # main is untouched
    assert _fetch_and_trust(store, tmp_path / "boot").is_dir()


def test_hub_store_works_from_the_cache_when_offline(
    packed: Packed, hub: HubServer, env: ClientEnv, tmp_path: Path
) -> None:
    store = HubStore(REPO, token=CANARY, endpoint=hub.url)
    store.put(packed)
    store.fetch(SPEC.name(), tmp_path / "first")
    hub.set_offline(True)
    tarball, manifest = store.fetch(SPEC.name(), tmp_path / "second")
    assert verify(tarball, manifest, SPEC)["tarball_sha256"] == packed.sha256


def test_hub_store_missing_name_is_clear(packed: Packed, hub: HubServer, env: ClientEnv, tmp_path: Path) -> None:
    store = HubStore(REPO, token=CANARY, endpoint=hub.url)
    store.put(packed)
    other = SPEC.name().replace("arch-cpu", "arch-cpu2")
    assert not store.exists(other)
    with pytest.raises(ArtifactError) as err:
        store.fetch(other, tmp_path / "dl")
    msg = str(err.value)
    assert REPO in msg and "'main'" in msg and f"binaries/{manifest_name(other)}" in msg
    assert "no binaries were published under that name" in msg
    assert not (tmp_path / "dl").exists() or list((tmp_path / "dl").iterdir()) == []


def test_hub_store_wrong_revision_is_clear(packed: Packed, hub: HubServer, env: ClientEnv, tmp_path: Path) -> None:
    HubStore(REPO, token=CANARY, endpoint=hub.url).put(packed)
    store = open_store(f"hf://{REPO}@no-such-branch", token=CANARY, endpoint=hub.url)
    assert not store.exists(SPEC.name())
    with pytest.raises(ArtifactError) as err:
        store.fetch(SPEC.name(), tmp_path / "dl")
    msg = str(err.value)
    assert f"Hub repo {REPO} at {hub.url} has no revision 'no-such-branch'" in msg
    assert f"fetching binaries/{manifest_name(SPEC.name())}" in msg  # the manifest comes first


def test_hub_store_missing_repo_is_clear(hub: HubServer, env: ClientEnv, tmp_path: Path) -> None:
    store = HubStore("kiln-test/nope", token=CANARY, endpoint=hub.url)
    with pytest.raises(ArtifactError, match="kiln-test/nope .*does not exist, or is private"):
        store.fetch(SPEC.name(), tmp_path / "dl")


def test_token_canary_never_appears_in_errors(packed: Packed, hub: HubServer, env: ClientEnv, tmp_path: Path) -> None:
    good = HubStore(REPO, token=CANARY, endpoint=hub.url)
    good.put(packed)
    failures: list[ArtifactError] = []
    attempts = [
        lambda: good.fetch(SPEC.name().replace("cpu", "cpu9"), tmp_path / "a"),            # missing file
        lambda: HubStore(REPO, revision="gone", token=CANARY, endpoint=hub.url).fetch(SPEC.name(), tmp_path / "b"),
        lambda: HubStore("kiln-test/nope", token=CANARY, endpoint=hub.url).fetch(SPEC.name(), tmp_path / "c"),
        # The server knows another token: the canary is now a wrong token, refused with 401.
        lambda: HubStore(REPO, token=CANARY + "x", endpoint=hub.url).put(packed),
        lambda: HubStore(REPO, revision="a" * 40, token=CANARY, endpoint=hub.url).put(packed),
    ]
    for attempt in attempts:
        with pytest.raises(ArtifactError) as err:
            attempt()
        failures.append(err.value)
    hub.fail_next(1, status=500)
    with pytest.raises(ArtifactError, match="HTTP 500") as err:
        good.put(packed)
    failures.append(err.value)
    assert len(failures) == 6
    for failure in failures:
        assert CANARY not in _all_text(failure), _all_text(failure)
    assert "HTTP 401 (the token is invalid or lacks access)" in str(failures[3])
    assert CANARY not in repr(good)


def test_open_store_parses_hub_specs(tmp_path: Path) -> None:
    plain = open_store("hf://owner/name")
    assert isinstance(plain, HubStore) and (plain.repo_id, plain.revision, plain.repo_type) == ("owner/name", "main", "model")
    ds = open_store("hf://datasets/owner/name@v1")
    assert isinstance(ds, HubStore) and (ds.repo_id, ds.revision, ds.repo_type) == ("owner/name", "v1", "dataset")
    branch = open_store("hf://owner/name@feat/x")
    assert isinstance(branch, HubStore) and branch.revision == "feat/x"
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    for bad in ("hf://", "hf://justname", "hf://owner/name@", "hf://a/b/c"):
        with pytest.raises(ArtifactError):
            open_store(bad)
