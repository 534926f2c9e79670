"""The Hub stand-in (kiln_dev/hub/) works with the real huggingface_hub client.

The server stands for huggingface.co, which cannot be reached here: these tests drive it with the
installed huggingface_hub (uploads, refs, downloads, cache, typed errors, failure knobs) so that
Kiln's own tests can trust it. No sleeps: the one client retry that sleeps is patched out.
"""

from __future__ import annotations

import hashlib
import random
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # plain `pytest` (not `python -m pytest`) from anywhere
    sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402  (huggingface_hub's HTTP library; its ConnectError is what "offline" raises)
from huggingface_hub import (  # noqa: E402
    HfApi,
    constants,
    file_download,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder  # noqa: E402

from kiln_dev.hub import ClientEnv, HubServer, client_env  # noqa: E402

REPO = "kiln-test/tiny"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubServer]:
    with HubServer(tmp_path / "hub-store") as server:
        yield server


@pytest.fixture
def env(hub: HubServer, tmp_path: Path) -> Iterator[ClientEnv]:
    with client_env(hub, tmp_path / "hf-home") as applied:
        yield applied


@pytest.fixture
def api(hub: HubServer, env: ClientEnv) -> HfApi:
    return HfApi(endpoint=hub.url, token=hub.token)


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def _make_repo(api: HfApi, files: dict[str, bytes], repo_id: str = REPO) -> str:
    api.create_repo(repo_id)
    sha = ""
    for path, data in files.items():
        sha = api.upload_file(path_or_fileobj=data, path_in_repo=path, repo_id=repo_id).oid
    return sha


# ----------------------------------------------------------------------------- repos and commits


def test_client_env_points_module_level_client_at_server(hub: HubServer, env: ClientEnv) -> None:
    # HfApi() and the module-level functions read import-time copies that client_env patched.
    assert HfApi().endpoint == hub.url == env.env["HF_ENDPOINT"]
    assert constants.HF_HUB_CACHE == str(env.cache_dir)
    assert HfApi().whoami()["name"] == hub.user  # token from HF_TOKEN


def test_create_repo_conflict_and_exist_ok(api: HfApi) -> None:
    url = api.create_repo(REPO)
    assert url.repo_id == REPO and url.repo_type == "model"
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo(REPO)
    assert err.value.response.status_code == 409
    assert api.create_repo(REPO, exist_ok=True).repo_id == REPO


def test_create_repo_without_namespace_uses_token_user(api: HfApi, hub: HubServer) -> None:
    assert api.create_repo("solo").repo_id == f"{hub.user}/solo"


def test_whoami_needs_a_valid_token(hub: HubServer, env: ClientEnv) -> None:
    assert HfApi(endpoint=hub.url, token=hub.token).whoami()["name"] == hub.user
    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=hub.url, token="hf_wrong").whoami()
    assert err.value.response.status_code == 401


def test_commit_moves_sha_and_old_commit_stays_readable(api: HfApi, hub: HubServer) -> None:
    api.create_repo(REPO)
    first = api.model_info(REPO).sha
    commit = api.upload_file(path_or_fileobj=b"{}", path_in_repo="config.json", repo_id=REPO)
    info = api.model_info(REPO)
    assert info.sha == commit.oid != first
    assert [s.rfilename for s in info.siblings] == [".gitattributes", "config.json"]
    assert api.model_info(REPO, revision=first).sha == first
    assert api.list_repo_files(REPO, revision=first) == [".gitattributes"]
    assert hub.resolve(REPO) == commit.oid


def test_poll_is_one_small_request(api: HfApi, hub: HubServer) -> None:
    api.create_repo(REPO)
    hub.reset_counts()
    api.model_info(REPO)
    assert dict(hub.counts) == {"repo_info": 1}


def test_files_metadata_gives_sizes_and_git_oids(api: HfApi) -> None:
    _make_repo(api, {"config.json": b'{"a": 1}'})
    siblings = {s.rfilename: s for s in api.model_info(REPO, files_metadata=True).siblings}
    assert siblings["config.json"].size == 8
    assert siblings["config.json"].blob_id == _git_oid(b'{"a": 1}')
    assert siblings["config.json"].lfs is None


def test_unchanged_upload_makes_no_commit(api: HfApi, hub: HubServer) -> None:
    sha = _make_repo(api, {"config.json": b"{}"})
    hub.reset_counts()
    again = api.upload_file(path_or_fileobj=b"{}", path_in_repo="config.json", repo_id=REPO)
    assert again.oid == sha and hub.counts["commit"] == 0  # preupload's oid matched the local one


def test_delete_file_and_parent_commit_check(api: HfApi) -> None:
    first = _make_repo(api, {"a.txt": b"a", "b.txt": b"b"})
    api.delete_file("a.txt", repo_id=REPO)
    assert api.list_repo_files(REPO) == [".gitattributes", "b.txt"]
    with pytest.raises(HfHubHTTPError) as err:
        api.upload_file(path_or_fileobj=b"c", path_in_repo="c.txt", repo_id=REPO, parent_commit=first)
    assert err.value.response.status_code == 412


def test_upload_folder_and_snapshot_download_with_patterns(api: HfApi, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "weights").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# tiny\n")  # goes through validate-yaml
    (folder / "weights" / "part-1.bin").write_bytes(b"\x01" * 1000)
    api.create_repo(REPO)
    api.upload_folder(folder_path=folder, repo_id=REPO)
    assert api.list_repo_files(REPO) == [".gitattributes", "README.md", "config.json", "weights/part-1.bin"]

    snap = Path(snapshot_download(REPO, allow_patterns=["*.json", "weights/*"]))
    got = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file())
    assert got == ["config.json", "weights/part-1.bin"]
    assert (snap / "weights" / "part-1.bin").read_bytes() == b"\x01" * 1000


def test_tree_listing_recursive_and_not(api: HfApi) -> None:
    _make_repo(api, {"top.txt": b"t", "d/one.txt": b"1", "d/e/two.txt": b"2"})
    flat = {(type(e).__name__, e.path) for e in api.list_repo_tree(REPO)}
    assert flat == {("RepoFile", ".gitattributes"), ("RepoFile", "top.txt"), ("RepoFolder", "d")}
    deep = {e.path for e in api.list_repo_tree(REPO, recursive=True)}
    assert {"d", "d/e", "d/one.txt", "d/e/two.txt", "top.txt"} <= deep
    assert {e.path for e in api.list_repo_tree(REPO, path_in_repo="d")} == {"d/one.txt", "d/e"}


def test_get_paths_info(api: HfApi) -> None:
    _make_repo(api, {"d/w.bin": b"weights"})
    infos = {e.path: e for e in api.get_paths_info(REPO, ["d/w.bin", "d", "missing.txt"])}
    assert set(infos) == {"d/w.bin", "d"}
    file = infos["d/w.bin"]
    assert isinstance(file, RepoFile) and file.size == 7 and file.blob_id == _git_oid(b"weights")
    assert isinstance(infos["d"], RepoFolder)


# ----------------------------------------------------------------------------- refs and downloads


def test_download_by_branch_tag_and_commit(api: HfApi, hub: HubServer) -> None:
    v1 = _make_repo(api, {"w.txt": b"v1"})
    api.create_tag(REPO, tag="v1")
    api.create_branch(REPO, branch="feat/dev")  # a '/' travels URL-encoded as one segment
    api.upload_file(path_or_fileobj=b"v2", path_in_repo="w.txt", repo_id=REPO)
    api.upload_file(path_or_fileobj=b"dev", path_in_repo="w.txt", repo_id=REPO, revision="feat/dev")

    assert _read(hf_hub_download(REPO, "w.txt")) == b"v2"
    assert _read(hf_hub_download(REPO, "w.txt", revision="v1")) == b"v1"
    assert _read(hf_hub_download(REPO, "w.txt", revision="feat/dev")) == b"dev"
    assert _read(hf_hub_download(REPO, "w.txt", revision=v1)) == b"v1"

    refs = api.list_repo_refs(REPO)
    assert {b.name for b in refs.branches} == {"main", "feat/dev"}
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", v1)]


def test_branch_and_tag_conflicts_and_deletes(api: HfApi) -> None:
    _make_repo(api, {"w.txt": b"x"})
    api.create_branch(REPO, branch="dev")
    with pytest.raises(HfHubHTTPError) as err:
        api.create_branch(REPO, branch="dev")
    assert err.value.response.status_code == 409
    api.create_branch(REPO, branch="dev", exist_ok=True)
    api.create_tag(REPO, tag="t")
    api.create_tag(REPO, tag="t", exist_ok=True)
    api.delete_branch(REPO, branch="dev")
    api.delete_tag(REPO, tag="t")
    refs = api.list_repo_refs(REPO)
    assert [b.name for b in refs.branches] == ["main"] and refs.tags == []


def test_second_download_reuses_cache(api: HfApi, hub: HubServer) -> None:
    sha = _make_repo(api, {"w.txt": b"cached"})
    hub.reset_counts()
    first = hf_hub_download(REPO, "w.txt")
    second = hf_hub_download(REPO, "w.txt")
    assert first == second and _read(second) == b"cached"
    assert hub.counts["resolve_get"] == 1 and hub.counts["resolve_head"] == 2  # a branch is re-checked

    hub.reset_counts()
    hf_hub_download(REPO, "w.txt", revision=sha)  # a commit id is final: no request at all
    assert sum(hub.counts.values()) == 0


def test_dataset_repo_round_trip(api: HfApi) -> None:
    api.create_repo(REPO, repo_type="dataset")
    api.upload_file(path_or_fileobj=b"a,b\n", path_in_repo="data.csv", repo_id=REPO, repo_type="dataset")
    assert api.dataset_info(REPO).siblings[-1].rfilename == "data.csv"
    assert _read(hf_hub_download(REPO, "data.csv", repo_type="dataset")) == b"a,b\n"
    with pytest.raises(RepositoryNotFoundError):
        api.model_info(REPO)  # same name, other type


def test_large_file_round_trip(api: HfApi) -> None:
    data = random.Random(7).randbytes(5 * 1024 * 1024)
    _make_repo(api, {"model.gguf": data})
    got = _read(hf_hub_download(REPO, "model.gguf"))
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_range_request_answers_206(hub: HubServer, env: ClientEnv, tmp_path: Path) -> None:
    hub.seed(REPO, {"w.bin": bytes(range(256)) * 4})
    url = f"{hub.url}/{REPO}/resolve/main/w.bin"
    partial = tmp_path / "partial"
    with partial.open("wb") as f:  # the client's own resume primitive: Range from the bytes we have
        f.write(bytes(range(256)) * 2)
        file_download.http_get(url, f, resume_size=512, expected_size=1024)
    assert partial.read_bytes() == bytes(range(256)) * 4
    assert (hub.log[-1].status, hub.log[-1].range) == (206, "bytes=512-")


def test_interrupted_download_resumes_with_range(
    hub: HubServer, env: ClientEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(3).randbytes(600_000)
    hub.seed(REPO, {"w.bin": data})
    # Smaller chunks so bytes reach the file before the cut; no 1 s pause before the retry.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    monkeypatch.setattr(file_download, "time", types.SimpleNamespace(sleep=lambda _s: None))
    hub.truncate_next_download(after_bytes=200_000)

    assert _read(hf_hub_download(REPO, "w.bin")) == data
    gets = [r for r in hub.log if r.route == "resolve_get"]
    assert [g.status for g in gets] == [200, 206]
    assert gets[1].range is not None and int(gets[1].range[len("bytes="):-1]) > 0


# ----------------------------------------------------------------------------- errors and knobs


def test_typed_errors_for_missing_repo_revision_and_file(api: HfApi) -> None:
    _make_repo(api, {"w.txt": b"x"})
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("kiln-test/nope")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("kiln-test/nope", "w.txt")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "w.txt", revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.txt")


def test_private_repo_needs_token(api: HfApi, hub: HubServer) -> None:
    api.create_repo(REPO, private=True)
    api.upload_file(path_or_fileobj=b"secret", path_in_repo="w.txt", repo_id=REPO)
    anonymous = HfApi(endpoint=hub.url, token=False)
    with pytest.raises(RepositoryNotFoundError):
        anonymous.model_info(REPO)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(REPO, "w.txt", token=False)
    with pytest.raises(HfHubHTTPError) as err:  # writes need the token too
        anonymous.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=REPO)
    assert err.value.response.status_code == 401
    assert api.model_info(REPO).private is True
    assert _read(hf_hub_download(REPO, "w.txt")) == b"secret"


def test_fail_next_429_raises_then_recovers(api: HfApi, hub: HubServer) -> None:
    api.create_repo(REPO)
    hub.fail_next(1, status=429)
    with pytest.raises(HfHubHTTPError) as err:
        api.model_info(REPO)  # model_info does not retry, so no backoff sleep
    assert err.value.response.status_code == 429
    assert api.model_info(REPO).id == REPO


def test_fail_next_only_hits_matching_prefix(api: HfApi, hub: HubServer) -> None:
    api.create_repo(REPO)
    api.create_repo("kiln-test/other")
    hub.fail_next(1, status=503, path_prefix="/api/models/kiln-test/other")
    assert api.model_info(REPO).id == REPO
    with pytest.raises(HfHubHTTPError) as err:
        api.model_info("kiln-test/other")
    assert err.value.response.status_code == 503


def test_offline_serves_from_cache_then_comes_back(api: HfApi, hub: HubServer) -> None:
    _make_repo(api, {"w.txt": b"cached"})
    path = hf_hub_download(REPO, "w.txt")
    url = hub.url
    hub.set_offline(True)
    assert hub.offline
    assert hf_hub_download(REPO, "w.txt") == path  # HEAD is refused; the cached ref answers
    with pytest.raises(httpx2.ConnectError):
        api.model_info(REPO)
    hub.set_offline(False)
    assert hub.url == url and api.model_info(REPO).id == REPO


# ----------------------------------------------------------------------------- LFS, the CDN, Xet


def test_an_lfs_file_is_listed_as_lfs_and_served_from_the_cdn(hub: HubServer, env: ClientEnv) -> None:
    data = random.Random(11).randbytes(300_000)
    commit = hub.seed(REPO, {"model.gguf": data}, storage="lfs")
    (entry,) = [f for f in HfApi().list_repo_tree(REPO) if f.path == "model.gguf"]
    assert entry.lfs is not None and entry.lfs.sha256 == hashlib.sha256(data).hexdigest() and entry.size == len(data)
    assert entry.blob_id != _git_oid(data)                         # git stores the pointer, not the content
    meta = file_download.get_hf_file_metadata(file_download.hf_hub_url(REPO, "model.gguf"))
    assert meta.etag == entry.lfs.sha256 and meta.size == len(data) and meta.commit_hash == commit
    assert meta.location.startswith(hub.url.replace("127.0.0.1", "localhost") + "/cdn/")    # another origin
    assert _read(hf_hub_download(REPO, "model.gguf")) == data
    assert hub.counts["cdn_get"] == 1 and hub.bytes_served["cdn_get"] == len(data)


def test_a_cdn_url_expires(hub: HubServer, env: ClientEnv) -> None:
    hub.seed(REPO, {"model.gguf": b"x" * 1000}, storage="lfs")
    hub.cdn_ttl_s = -1.0
    meta = file_download.get_hf_file_metadata(file_download.hf_hub_url(REPO, "model.gguf"))
    with pytest.raises(HfHubHTTPError) as err:
        file_download.http_get(meta.location, types.SimpleNamespace(write=lambda b: None, tell=lambda: 0))
    assert err.value.response.status_code == 403


def test_a_xet_file_downloads_through_the_real_hf_xet_client(
    hub: HubServer, env: ClientEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hf_hub_download takes its Xet path (xet_get: read token, reconstruction, xorb ranges)."""
    monkeypatch.setattr("kiln_dev.hub.xetcas.CHUNKS_PER_XORB", 4)      # 256 KiB xorbs: several per file
    data = random.Random(5).randbytes(1_000_003)
    hub.seed(REPO, {"model.safetensors": data}, storage="xet")
    (entry,) = [f for f in HfApi().list_repo_tree(REPO) if f.path == "model.safetensors"]
    assert entry.xet_hash and entry.lfs is not None
    assert _read(hf_hub_download(REPO, "model.safetensors")) == data
    assert hub.counts["xet_read_token"] == 1 and hub.counts["reconstruction"] >= 1 and hub.counts["xorb_get"] >= 4
    assert hub.counts["cdn_get"] == 0                                  # not one byte over plain HTTP


def test_hf_xet_streams_any_byte_range_of_a_xet_file(
    hub: HubServer, env: ClientEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hf_xet import XetFileInfo
    from huggingface_hub.utils import build_hf_headers
    from huggingface_hub.utils._xet import get_xet_session, refresh_xet_connection_info

    monkeypatch.setattr("kiln_dev.hub.xetcas.CHUNKS_PER_XORB", 4)
    data = random.Random(6).randbytes(1_000_003)
    hub.seed(REPO, {"w.bin": data}, storage="xet")
    meta = file_download.get_hf_file_metadata(file_download.hf_hub_url(REPO, "w.bin"))
    assert meta.xet_file_data is not None
    headers = build_hf_headers()
    info = refresh_xet_connection_info(file_data=meta.xet_file_data, headers=headers)
    group = get_xet_session().new_download_stream_group(
        endpoint=info.endpoint, token=info.access_token, token_expiry_unix_secs=info.expiration_unix_epoch,
        token_refresh_url=meta.xet_file_data.refresh_route, token_refresh_headers=headers)
    file = XetFileInfo(meta.xet_file_data.file_hash, len(data))
    # Inside one chunk, across a chunk edge, across a xorb edge (4 x 64 KiB), to the end.
    for start, end in [(0, 10), (65530, 65546), (262000, 530000), (999_000, 1_000_003)]:
        assert b"".join(group.download_stream(file, start=start, end=end)) == data[start:end]


def test_corrupt_next_download_flips_one_byte(hub: HubServer, env: ClientEnv) -> None:
    data = bytes(1000)
    hub.seed(REPO, {"w.bin": data})
    hub.corrupt_next_download(at=10)
    got = _read(hf_hub_download(REPO, "w.bin"))
    assert got[:10] == data[:10] and got[10] == 0xFF and got[11:] == data[11:]


def test_a_sparse_file_of_any_size_costs_no_disk(hub: HubServer, env: ClientEnv, tmp_path: Path) -> None:
    size = 60 * 10**9                                                # over huggingface_hub's 50e9 ceiling
    hub.seed_sparse(REPO, "huge.gguf", size)
    (entry,) = [f for f in HfApi().list_repo_tree(REPO) if f.path == "huge.gguf"]
    assert entry.size == size and entry.lfs is not None
    meta = file_download.get_hf_file_metadata(file_download.hf_hub_url(REPO, "huge.gguf"))
    out = tmp_path / "tail"
    with out.open("wb") as f:
        file_download.http_get(meta.location, f, headers={"Range": f"bytes={size - 100}-{size - 1}"},
                               expected_size=100)
    assert out.read_bytes() == bytes(100) and hub.log[-1].status == 206
    assert sum(p.stat().st_blocks for p in hub.root.rglob("*") if p.is_file()) * 512 < 10**8
