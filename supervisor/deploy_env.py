"""A deploy config that travels with the deployment: KILN_DEPLOY_CONFIG.

An image bakes one default config (/etc/kiln/deploy.toml, and profiles beside it). Any other model is
served by the same image with a config that `pods up --config FILE` (also `endpoint up`, `cluster up`)
puts in the pod's environment as KILN_DEPLOY_CONFIG: the file's bytes in base64, nothing else. It
reaches the pod without a rebuild and survives a restart (a pod's environment is kept with the pod);
it never holds a secret (a deploy config names where a key comes from, never the key).

Which config a boot runs, first match:
    `run --config FILE`            given on the command line
    KILN_DEPLOY_CONFIG             what the deployment carries
    KILN_CONFIG                    a file in the image (a baked profile)
    /etc/kiln/deploy.toml          the image's default
KILN_DEPLOY_CONFIG and KILN_CONFIG together is a mistake said on /status, never a silent choice.
"""

from __future__ import annotations

import base64
import binascii
from typing import Mapping

from .errors import ConfigError, Problem

ENV = "KILN_DEPLOY_CONFIG"
SOURCE = f"env {ENV}"            # the config's name on /status and in every error
MAX_BYTES = 64 * 1024             # a deploy config is a few KiB; more is not one
_SHOWN = 40                       # characters of a bad value shown in an error


def encode(text: str) -> str:
    """The value `up` puts in the pod's environment for a config file's text."""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def decode(value: str) -> str:
    """The config text KILN_DEPLOY_CONFIG carries; ConfigError naming the variable when it is not one."""
    field = f"{ENV} (from env {ENV})"
    shown = value[:_SHOWN] + ("..." if len(value) > _SHOWN else "")
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(SOURCE, [Problem(field, "is not base64 (the deploy config's bytes, as `pods up --config` "
                                                  "writes them)", shown)]) from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(SOURCE, [Problem(field, f"holds {len(raw)} bytes: a deploy config is at most {MAX_BYTES}",
                                           shown)])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(SOURCE, [Problem(field, "does not decode to UTF-8 text (a deploy config is a TOML file)",
                                           shown)]) from None


def choose(explicit: str | None, env: Mapping[str, str], default: str) -> tuple[str, str | None]:
    """(the config's name, its text when it comes from the environment, else None: read the file).
    ConfigError when KILN_DEPLOY_CONFIG cannot be used, or is set beside KILN_CONFIG."""
    if explicit:
        return explicit, None
    carried = env.get(ENV)
    if carried is not None and carried.strip():
        if env.get("KILN_CONFIG"):
            raise ConfigError(SOURCE, [Problem(f"{ENV} (from env {ENV})",
                                               f"is set beside KILN_CONFIG={env['KILN_CONFIG']}: which config runs "
                                               "would be a guess; unset one of them (a deployment's --config "
                                               "replaces the image's profiles)")])
        return SOURCE, decode(carried)
    return env.get("KILN_CONFIG") or default, None
