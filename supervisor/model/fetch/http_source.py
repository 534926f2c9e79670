"""A file's bytes over HTTP, a range at a time, through huggingface_hub (its session, headers, retries).

The file's location is asked once (`get_hf_file_metadata`, a HEAD on the resolve URL, as
`hf_hub_download` does): for an LFS file the Hub answers with a redirect to its CDN, and every
segment is then a Range request to that CDN URL. That is one resolve per file, not one per
segment: the Hub's "Resolvers" rate limit is per 5 minutes (docs/hub/rate-limits: 3,000 for an
anonymous IP), and a 181 GiB model is thousands of segments. A presigned CDN URL expires; a
segment that gets 401/403/404/410 from it asks for a fresh location once, then fails. As in
huggingface_hub, the Hub token is never sent to a host that is not the Hub's.

Each segment is one `http_get` call with a `Range: bytes=a-b` header and the segment's length as
its expected size, so huggingface_hub's own resume-on-connection-error works within the
segment, and its 50 GB ceiling (MAX_HTTP_DOWNLOAD_SIZE, checked only for a whole-file request
from byte 0) never applies.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

from .sink import Sink

STALE_LOCATION = (401, 403, 404, 410)


def _origin(url: str) -> tuple[str, str, int | None]:
    u = urlsplit(url)
    return u.scheme, (u.hostname or "").lower(), u.port


class HttpSource:
    kind = "http"

    def __init__(self, repo: str, path: str, commit: str, token: str | None):
        from huggingface_hub import hf_hub_url

        self.url = hf_hub_url(repo, path, revision=commit)     # HF_ENDPOINT's resolve URL
        self.token = token
        self._lock = threading.Lock()
        self._where: tuple[str, dict[str, str]] | None = None

    def _locate(self, stale: str | None = None) -> tuple[str, dict[str, str]]:
        from huggingface_hub import get_hf_file_metadata
        from huggingface_hub.utils import build_hf_headers

        with self._lock:
            if self._where is None or self._where[0] == stale:
                # No retries of the library's own here: a 5xx is for the scheduler (a backoff per
                # segment, or the complete cached copy at once), as for every other request.
                meta = get_hf_file_metadata(self.url, token=self.token or False)
                headers = build_hf_headers(token=self.token or False)
                headers["Accept-Encoding"] = "identity"     # byte ranges of the file, not of a gzip of it
                if _origin(meta.location) != _origin(self.url):
                    headers.pop("authorization", None)      # a CDN's signed URL needs no token
                self._where = (meta.location, headers)
            return self._where

    def fetch(self, sink: Sink) -> None:
        from huggingface_hub.errors import HfHubHTTPError

        location, headers = self._locate()
        try:
            self._get(location, headers, sink)
        except HfHubHTTPError as e:
            status = getattr(getattr(e, "response", None), "status_code", None)
            if location == self.url or status not in STALE_LOCATION:
                raise
            self._get(*self._locate(stale=location), sink)

    @staticmethod
    def _get(location: str, headers: dict[str, str], sink: Sink) -> None:
        from huggingface_hub.file_download import http_get

        if sink.full:
            return
        asked = dict(headers, Range=f"bytes={sink.next}-{sink.end - 1}")
        http_get(location, sink, headers=asked, expected_size=sink.end - sink.next)
