"""The server's API key: on by default, never in argv, logs or status.

`server.api_key` names where the key comes from: "env:NAME", "file:/path",
or "none" (an open server, said out loud in the config). When the named
environment variable is unset the supervisor generates a key and stores it in
the volume (mode 0600) so it survives restarts; the log says where it is,
never what it is. The engine receives it through a 0600 file
(`--api-key-file`), because argv is readable by every user in /proc.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError
from ..validate import Problem


@dataclass(frozen=True)
class ApiKey:
    value: str | None          # None = no authentication (api_key = "none")
    origin: str                # "env:KILN_API_KEY", "generated: /workspace/kiln/api-key", ...

    def __repr__(self) -> str:  # never print the value, even by accident
        return f"ApiKey(origin={self.origin!r}, set={self.value is not None})"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o600)


def _create_once(path: Path, value: str) -> str:
    """Store `value` at `path` unless another process got there first; the stored key either way.
    Serverless workers sharing a volume start together, and one endpoint must serve one key: the
    key is written whole beside the path, then linked into place, which fails if it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _write_private(tmp, value + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError:                      # a filesystem without hard links: the file itself, exclusively
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(value + "\n")
    finally:
        tmp.unlink(missing_ok=True)
    stored = path.read_text(encoding="utf-8").strip()
    return stored or value


def resolve(spec: str, state_dir: Path, env: Mapping[str, str]) -> ApiKey:
    if spec == "none":
        return ApiKey(None, "none (server.api_key = \"none\": the engine accepts every request)")
    kind, _, ref = spec.partition(":")
    if kind == "env":
        value = env.get(ref, "").strip()
        if value:
            return ApiKey(value, f"env:{ref}")
        stored = state_dir / "api-key"
        if stored.is_file():
            return ApiKey(stored.read_text(encoding="utf-8").strip(), f"stored: {stored} ({ref} unset)")
        import secrets   # only a first boot without a key pays for this import

        value = _create_once(stored, secrets.token_urlsafe(32))
        return ApiKey(value, f"generated: {stored} ({ref} unset)")
    if kind == "file":
        try:
            value = Path(ref).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError("api key", [Problem("server.api_key", f"cannot read the key file: {e.strerror}",
                                                  spec)]) from None
        if not value:
            raise ConfigError("api key", [Problem("server.api_key", "the key file is empty", spec)])
        return ApiKey(value, spec)
    raise ConfigError("api key", [Problem("server.api_key", "has an unknown form", spec,
                                          '"env:NAME", "file:/path", "none"')])


def engine_key_file(key: ApiKey, run_dir: Path) -> Path | None:
    """Write the key where only the engine (same user) can read it."""
    if key.value is None:
        return None
    path = run_dir / "engine-api-key"
    _write_private(path, key.value + "\n")
    return path
