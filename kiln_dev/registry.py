"""A real OCI registry (Debian's docker-registry, the CNCF distribution server 2.x) on loopback,
with its storage in a temp dir: stands for Docker Hub / ghcr.io in the push and lock tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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
