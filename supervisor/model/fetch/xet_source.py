"""A Xet-backed file's bytes, a range at a time, through hf_xet's download streams.

For a file the Hub lists with a Xet hash, huggingface_hub's own path (`xet_get`) hands the whole
file to hf_xet and keeps nothing if it is interrupted. Here each segment is one ordered stream of
hf_xet's `XetDownloadStreamGroup.download_stream(file, start, end)`, written into the partial
like an HTTP range, so a kill loses at most the segments in flight and the journal (journal.py)
resumes the rest; hf_xet fetches each range from the CAS with its own parallelism and retries.

Connection details come from huggingface_hub, as `xet_get` gets them: the refresh route the Hub
serves the Xet read token on (`xet_connection_info_refresh_url`, what 2.4 builds from the tree
listing too), `refresh_xet_connection_info` for the CAS URL and token, the Hub headers without
their Authorization for the CAS (`xet_headers_without_auth`), and the process's shared session
(`get_xet_session`). Those live in the private module huggingface_hub.utils._xet: the versions
are pinned (pyproject.toml, supervisor/requirements.txt) and tests/integration/test_fetch_xet.py
exercises them against the stand-in.
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

from .sink import Sink


def available() -> bool:
    """hf_xet is installed and not switched off (HF_HUB_DISABLE_XET), as huggingface_hub decides."""
    from huggingface_hub import constants

    return not constants.HF_HUB_DISABLE_XET and importlib.util.find_spec("hf_xet") is not None


class XetSource:
    kind = "xet"

    def __init__(self, repo: str, commit: str, token: str | None, xet_hash: str, size: int):
        self.repo, self.commit, self.token, self.xet_hash, self.size = repo, commit, token, xet_hash, size
        self._lock = threading.Lock()
        self._group: Any = None

    def group(self) -> Any:
        from huggingface_hub.utils import build_hf_headers
        from huggingface_hub.utils._xet import (XetFileData, XetTokenType, get_xet_session,
                                                refresh_xet_connection_info, xet_connection_info_refresh_url,
                                                xet_headers_without_auth)

        with self._lock:
            if self._group is None:
                headers = build_hf_headers(token=self.token or False)
                refresh = xet_connection_info_refresh_url(token_type=XetTokenType.READ, repo_id=self.repo,
                                                          repo_type="model", revision=self.commit)
                info = refresh_xet_connection_info(file_data=XetFileData(self.xet_hash, refresh), headers=headers)
                self._group = get_xet_session().new_download_stream_group(
                    endpoint=info.endpoint, token=info.access_token,
                    token_expiry_unix_secs=info.expiration_unix_epoch, token_refresh_url=refresh,
                    token_refresh_headers=headers, custom_headers=xet_headers_without_auth(headers))
            return self._group

    def fetch(self, sink: Sink) -> None:
        from hf_xet import XetFileInfo

        if sink.full:
            return
        stream = self.group().download_stream(XetFileInfo(self.xet_hash, self.size), start=sink.next, end=sink.end)
        for chunk in stream:
            sink.write(chunk)
        if not sink.full:
            raise EOFError(f"the Xet stream ended {sink.end - sink.next} bytes short of its range")
