"""Point the real huggingface_hub client (this process and its children) at the Hub stand-in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import HubServer


@dataclass(frozen=True)
class ClientEnv:
    """Where client_env pointed huggingface_hub: `env` holds the variables, for subprocesses."""

    endpoint: str
    home: Path
    cache_dir: Path
    token: str | None
    env: dict[str, str]


@contextmanager
def client_env(server: HubServer, home: str | Path, *, token: bool = True) -> Iterator[ClientEnv]:
    """Point huggingface_hub (this process and children) at `server`, with HF_HOME under `home`.

    Sets HF_ENDPOINT, HF_HOME, HF_HUB_CACHE (home/hub), HF_XET_CACHE, HF_TOKEN (the server's token,
    unless token=False) and disables telemetry/offline mode; then patches the copies huggingface_hub
    made at import: constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE (hf_hub_download builds
    URLs from it), the cache/token/home paths, and the endpoint of the module-level HfApi behind
    huggingface_hub.model_info & co. Everything is restored on exit.
    """
    import huggingface_hub.constants as constants
    import huggingface_hub.hf_api as hf_api

    home = Path(home)
    cache = home / "hub"
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        "HF_ENDPOINT": server.url,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(cache),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    if token:
        env["HF_TOKEN"] = server.token
    dropped = [] if token else ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]

    patches: list[tuple[Any, str, Any]] = [
        (constants, "ENDPOINT", server.url),
        (constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}"),
        (constants, "HF_HOME", str(home)),
        (constants, "HF_HUB_CACHE", str(cache)),
        (constants, "HF_XET_CACHE", str(home / "xet")),
        (constants, "HF_TOKEN_PATH", str(home / "token")),
        (constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens")),
        (constants, "AGENT_HARNESSES_PATH", str(home / ".agent_harnesses.json")),
        (constants, "HF_HUB_OFFLINE", False),
        (constants, "HF_HUB_DISABLE_TELEMETRY", True),
        (hf_api.api, "endpoint", server.url),
    ]
    try:
        import huggingface_hub.utils._cache_manager as cache_manager  # scan_cache_dir()'s default

        patches.append((cache_manager, "HF_HUB_CACHE", str(cache)))
    except ImportError:
        pass
    # Only what this client version has: older and newer ones lack some of these names.
    patches = [(obj, name, value) for obj, name, value in patches if hasattr(obj, name)]

    saved_env = {name: os.environ.get(name) for name in [*env, *dropped]}
    saved_attrs = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for name in dropped:
            os.environ.pop(name, None)
        os.environ.update(env)
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield ClientEnv(server.url, home, cache, server.token if token else None, env)
    finally:
        for obj, name, value in saved_attrs:
            setattr(obj, name, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
