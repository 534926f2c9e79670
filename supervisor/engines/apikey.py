"""The server's API key: on by default, never in argv, logs or status.

`server.api_key` names where the key comes from: "env:NAME", "file:/path",
or "none" (an open server, said out loud in the config). When the named
environment variable is unset the supervisor generates a key and stores it in
the volume (mode 0600) so it survives restarts; the log says where it is,
never what it is. The engine receives it through a 0600 file
(`--api-key-file`), because argv is readable by every user in /proc.

A full disk: the engine's key file is rewritten only when the key changed (a reload onto a full
disk keeps the one there), atomically (a failed write leaves the old key, never a truncated file);
a key that cannot be generated into the volume, or written where the engine reads it, is a
problem naming the file, the error and the fix (FAILED on /status, not an exit: PID 1 stays up),
with no temp or empty file left behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError
from ..process.statefile import write_atomic
from ..validate import Problem


@dataclass(frozen=True)
class ApiKey:
    value: str | None          # None = no authentication (api_key = "none")
    origin: str                # "env:KILN_API_KEY", "generated: /workspace/kiln/api-key", ...

    def __repr__(self) -> str:  # never print the value, even by accident
        return f"ApiKey(origin={self.origin!r}, set={self.value is not None})"


def _create_once(path: Path, value: str) -> str:
    """Store `value` at `path` unless another process got there first; the stored key either way.
    Serverless workers sharing a volume start together, and one endpoint must serve one key: the
    key is written whole beside the path, then linked into place, which fails if it exists.
    Raises OSError when it cannot be stored (a full disk), leaving no file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_new(tmp, value, os.O_TRUNC)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:                  # a filesystem without hard links: the file itself, exclusively
            try:
                _write_new(path, value, os.O_EXCL)
            except FileExistsError:
                pass
    finally:
        tmp.unlink(missing_ok=True)
    stored = path.read_text(encoding="utf-8").strip()
    return stored or value


def _write_new(path: Path, value: str, flag: int) -> None:
    """`value` in a new 0600 file; a write that fails removes the file it created (an empty key
    file would be read as the key)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flag, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(value + "\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def resolve(spec: str, state_dir: Path, env: Mapping[str, str]) -> ApiKey:
    if spec == "none":
        return ApiKey(None, "none (server.api_key = \"none\": the engine accepts every request)")
    kind, _, ref = spec.partition(":")
    if kind == "env":
        value = env.get(ref, "").strip()
        if value:
            return ApiKey(value, f"env:{ref}")
        stored = state_dir / "api-key"
        if stored.is_file() and (value := stored.read_text(encoding="utf-8").strip()):
            return ApiKey(value, f"stored: {stored} ({ref} unset)")
        import secrets   # only a first boot without a key pays for this import

        try:
            value = _create_once(stored, secrets.token_urlsafe(32))
        except OSError as e:
            raise ConfigError("api key", [Problem(
                "server.api_key", f"{ref} is not set, and the key generated instead cannot be stored at {stored} "
                f"({e.strerror or e}): set {ref} in the environment, or free space under state_dir ({state_dir}) "
                "and restart", spec)]) from None
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
    try:
        if path.read_text(encoding="utf-8") == key.value + "\n":
            return path                    # already there: nothing to write (a full disk costs nothing)
    except OSError:
        pass
    try:
        write_atomic(path, (key.value + "\n").encode("utf-8"), 0o600)
    except OSError as e:
        raise ConfigError("api key", [Problem(
            "server.api_key", f"the key cannot be written where the engine reads it, {path} ({e.strerror or e}): "
            f"free space under state_dir ({run_dir.parent}) and restart")]) from None
    return path
