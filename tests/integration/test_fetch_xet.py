"""The Xet path of the model fetch (supervisor/model/fetch/xet_source.py): files the Hub lists with a Xet
hash go through the real hf_xet client, a segment per download stream, against the Hub stand-in's
Xet CAS (kiln_dev/hub/xetcas.py stands for cas-server.xethub.hf.co: the V2 reconstruction API and
ranged xorb fetches, read from xet-core's source). Everything else in the same repo still goes
over HTTP ranges from the CDN.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import signal
from importlib.metadata import version
from pathlib import Path

import pytest

from supervisor.model.fetch import parent
from tests.integration.test_fetch import (MIB, REPO, blobs_dir, cfg_for, finished_segments, hub,  # noqa: F401
                                          run_fetch, start_child)
from kiln_dev.hub import xetcas
from kiln_dev.supervised import wait_for
from kiln_dev.throttle import Throttle

ROOT = Path(__file__).resolve().parents[2]


def framed(n: int) -> int:
    """What n bytes of file cost as xorb ranges: an 8-byte header per (started) 64 KiB chunk."""
    return n + xetcas.HEADER * -(-n // xetcas.CHUNK)


@pytest.fixture
def mixed(hub):
    """One Xet shard larger than the segment size, one LFS shard, one regular file."""
    data = {"q4/model-00001-of-00002.gguf": os.urandom(4 * MIB + 4321),
            "q4/model-00002-of-00002.gguf": os.urandom(1_500_000)}
    hub.seed(REPO, {"q4/model-00001-of-00002.gguf": data["q4/model-00001-of-00002.gguf"]}, storage="xet")
    hub.seed(REPO, {"q4/model-00002-of-00002.gguf": data["q4/model-00002-of-00002.gguf"]}, storage="lfs")
    hub.seed(REPO, {"q4/README.md": b"mixed"})
    return {**data, "q4/README.md": b"mixed"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_xet_file_goes_through_hf_xet_in_segments_and_the_rest_over_http(hub, mixed, tmp_path):
    state = tmp_path / "state"
    res = run_fetch(cfg_for(state, entry="q4/model-00001-*.gguf"))
    for rel, body in mixed.items():
        assert (res.snapshot / rel).read_bytes() == body
    xet = mixed["q4/model-00001-of-00002.gguf"]
    assert (blobs_dir(state) / sha(xet)).is_file()                   # verified against the LFS sha256
    assert hub.counts["reconstruction"] == 5                          # one stream per 1 MiB segment
    assert not [r for r in hub.log if r.path == f"/cdn/{sha(xet)}"]   # not one byte of it over plain HTTP
    assert hub.bytes_served["xorb_get"] == framed(len(xet))           # each byte once (segments are chunk-aligned)
    assert hub.bytes_served["cdn_get"] == len(mixed["q4/model-00002-of-00002.gguf"])
    assert hub.counts["xet_read_token"] == 1


def test_a_killed_xet_download_resumes_from_the_segments_on_disk(hub, mixed, tmp_path):
    state = tmp_path / "state"
    xet = mixed["q4/model-00001-of-00002.gguf"]
    journal = blobs_dir(state) / f"{sha(xet)}.incomplete.journal"
    with Throttle(int(hub.url.rsplit(":", 1)[1]), bytes_per_s=500_000) as slow:
        env = parent.child_env({**os.environ, "HF_ENDPOINT": slow.url}, hub.token)
        proc = start_child(state, env, entry="q4/model-00001-*.gguf", connections=2)
        wait_for(lambda: len(finished_segments(journal)) >= 2, 60, "two Xet segments on disk")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    done = finished_segments(journal)
    kept = len(done)
    assert 2 <= kept < 5
    missing = sum(min(MIB, len(xet) - i * MIB) for i in range(5) if i not in done)
    hub.reset_counts()
    res = run_fetch(cfg_for(state, entry="q4/model-00001-*.gguf"))
    assert res.path.read_bytes() == xet and not journal.exists()
    assert hub.counts["reconstruction"] == 5 - kept                  # only the missing segments
    assert hub.bytes_served["xorb_get"] == framed(missing)


def test_with_xet_switched_off_the_same_file_comes_over_http(hub, mixed, tmp_path):
    env = {**os.environ, "HF_HUB_DISABLE_XET": "1"}
    res = run_fetch(cfg_for(tmp_path / "state", entry="q4/model-00001-*.gguf"), env=env)
    assert res.path.read_bytes() == mixed["q4/model-00001-of-00002.gguf"]
    assert hub.counts["reconstruction"] == 0 and hub.counts["xorb_get"] == 0
    assert hub.bytes_served["cdn_get"] == sum(len(b) for rel, b in mixed.items() if rel.endswith(".gguf"))


def test_the_private_huggingface_hub_helpers_the_xet_path_uses_are_the_pinned_ones():
    """xet_source.py calls huggingface_hub.utils._xet (private) and hf_xet's stream API: pinned ranges
    in pyproject.toml, exact versions in supervisor/requirements.txt, and the signatures it calls."""
    from hf_xet import XetDownloadStreamGroup, XetSession
    from huggingface_hub.utils import _xet

    pyproject = (ROOT / "pyproject.toml").read_text()
    lock = (ROOT / "supervisor/requirements.txt").read_text()
    for dist, pin in (("huggingface_hub", r'"huggingface_hub>=2\.4,<2\.5"'), ("hf_xet", r'"hf_xet>=1\.8,<2"')):
        assert re.search(pin, pyproject), f"{dist} is not pinned to a range in pyproject.toml"
        name = dist.replace("_", "-")
        assert f"{name}=={version(dist)} " in lock, f"{name} {version(dist)} is not the version the image locks"
    assert {"file_data", "headers"} <= set(inspect.signature(_xet.refresh_xet_connection_info).parameters)
    assert {"token_type", "repo_id", "repo_type", "revision"} <= set(
        inspect.signature(_xet.xet_connection_info_refresh_url).parameters)
    assert [f for f in _xet.XetFileData.__dataclass_fields__] == ["file_hash", "refresh_route"]
    assert {"access_token", "expiration_unix_epoch", "endpoint"} <= set(_xet.XetConnectionInfo.__dataclass_fields__)
    assert callable(_xet.get_xet_session) and callable(_xet.xet_headers_without_auth)
    assert _xet.XetTokenType.READ.value == "read"
    group_args = XetSession.new_download_stream_group.__text_signature__
    for arg in ("endpoint", "token", "token_expiry_unix_secs", "token_refresh_url", "token_refresh_headers",
                "custom_headers"):
        assert arg in group_args
    assert XetDownloadStreamGroup.download_stream.__text_signature__ == "($self, file_info, start=None, end=None)"
