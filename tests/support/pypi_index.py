"""A package index on loopback that speaks what pip and `build.py lock` speak: PEP 691 JSON
(`GET /simple/<name>/` with `Accept: application/vnd.pypi.simple.v1+json`), PEP 658 metadata
(`GET <file url>.metadata`) and HTTP Range on the files. It stands for pypi.org/simple.

Each wheel is a real zip with a real `.dist-info/METADATA`. A project can withhold its PEP 658
metadata (`metadata=False`), as the index this machine reaches does for some files, so the
client has to read METADATA out of the zip through range requests.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Wheel:
    name: str
    version: str
    requires: list[str] = field(default_factory=list)
    tag: str = "py3-none-any"
    metadata: bool = True          # serve PEP 658 metadata for it
    _zip: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def filename(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-{self.tag}.whl"

    def metadata_text(self) -> str:
        return (f"Metadata-Version: 2.1\nName: {self.name}\nVersion: {self.version}\n"
                + "".join(f"Requires-Dist: {r}\n" for r in self.requires))

    def zip_bytes(self) -> bytes:
        if self._zip is None:
            self._zip = self._make_zip()
        return self._zip

    def _make_zip(self) -> bytes:
        buf = io.BytesIO()
        info = f"{self.name.replace('-', '_')}-{self.version}.dist-info"
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            # padding first, so METADATA sits past the client's first range block
            z.writestr(f"{self.name.replace('-', '_')}/payload.bin", bytes(range(256)) * 2048)
            z.writestr(f"{info}/METADATA", self.metadata_text())
            z.writestr(f"{info}/RECORD", "")
        return buf.getvalue()


class PackageIndex:
    def __init__(self, wheels: list[Wheel]):
        self.wheels = wheels
        self.requests: list[tuple[str, str]] = []       # (path, Range header)
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                index.requests.append((self.path, self.headers.get("Range", "")))
                if m := re.fullmatch(r"/simple/([^/]+)/", self.path):
                    return self._json(m.group(1))
                if m := re.fullmatch(r"/files/([^/]+)", self.path):
                    return self._file(m.group(1))
                self._send(404, b"not found")

            def _json(self, project: str):
                if "application/vnd.pypi.simple.v1+json" not in self.headers.get("Accept", ""):
                    return self._send(406, b"JSON only")
                files = [{"filename": w.filename, "url": f"{index.url}/files/{w.filename}",
                          "hashes": {"sha256": hashlib.sha256(w.zip_bytes()).hexdigest()}, "yanked": False}
                         for w in index.wheels if w.name == project]
                if not files:
                    return self._send(404, b"no such project")
                self._send(200, json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": files}).encode(),
                           "application/vnd.pypi.simple.v1+json")

            def _file(self, filename: str):
                meta = filename.endswith(".metadata")
                w = next((w for w in index.wheels if w.filename == filename.removesuffix(".metadata")), None)
                if w is None or (meta and not w.metadata):
                    return self._send(404, b"not found")
                if meta:
                    return self._send(200, w.metadata_text().encode())
                body = w.zip_bytes()
                rng = self.headers.get("Range", "")
                if m := re.fullmatch(r"bytes=(\d*)-(\d*)", rng):
                    lo, hi = m.groups()
                    start = len(body) - int(hi) if lo == "" else int(lo)
                    end = len(body) - 1 if lo == "" or hi == "" else min(int(hi), len(body) - 1)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(body)}")
                    part = body[start:end + 1]
                    self.send_header("Content-Length", str(len(part)))
                    self.end_headers()
                    self.wfile.write(part)
                    return
                self._send(200, body)

            def _send(self, code: int, body: bytes, ctype: str = "application/octet-stream"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def simple(self) -> str:
        return f"{self.url}/simple"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
