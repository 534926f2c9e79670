"""A real OCI registry (Debian's docker-registry, the CNCF distribution server 2.x) on loopback,
with its storage in a temp dir: stands for Docker Hub / ghcr.io in the push and lock tests."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import requests

from . import Unavailable, children
from .supervised import free_port, http, wait_for


class Registry:
    def __init__(self, root: Path):
        exe = shutil.which("docker-registry")
        if exe is None:
            raise Unavailable("docker-registry is missing: apt-get install docker-registry (scripts/dev-setup.sh does)")
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        cfg = root / "config.yml"
        cfg.write_text(f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root / 'data'}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{self.port}
""")
        self.log = open(root / "registry.log", "w")
        self.proc = children.spawn([exe, "serve", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: http(f"http://{self.host}/v2/")[0] == 200, 20, "the registry to answer /v2/")

    def tags(self, repo: str) -> list[str]:
        import json

        code, body = http(f"http://{self.host}/v2/{repo}/tags/list")
        return json.loads(body).get("tags") or [] if code == 200 else []

    def close(self) -> None:
        children.stop(self.proc, grace_s=20)
        self.log.close()


def _blob(host, repo, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = requests.post(f"http://{host}/v2/{repo}/blobs/uploads/", timeout=10)
    if r.status_code != 202:
        raise RuntimeError(f"blob upload refused: {r.status_code} {r.text[:200]}")
    loc = r.headers["Location"]
    loc = loc if loc.startswith("http") else f"http://{host}{loc}"
    r = requests.put(loc, params={"digest": digest}, data=data, timeout=10,
                     headers={"Content-Type": "application/octet-stream"})
    if r.status_code != 201:
        raise RuntimeError(f"registry refused: {r.status_code} {r.text[:200]}")
    return digest


def push_image(host, ref_repo, tag, marker: str) -> str:
    """A minimal OCI image (config + one layer) under repo:tag; returns the manifest digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                         "config": {"Labels": {"marker": marker}}}).encode()
    layer = f"layer {marker}".encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _blob(host, ref_repo, config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _blob(host, ref_repo, layer), "size": len(layer)}],
    }).encode()
    r = requests.put(f"http://{host}/v2/{ref_repo}/manifests/{tag}", data=manifest, timeout=10,
                     headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    if r.status_code != 201:
        raise RuntimeError(f"registry refused: {r.status_code} {r.text[:200]}")
    return "sha256:" + hashlib.sha256(manifest).hexdigest()
