"""What a published config cannot change: what the supervisor reads only at boot.

A change to one of these would not take effect now; it would be saved as the last good config and
take effect at the next container start, unseen. [runpod] api_url is where the pod's RunPod key
goes: a change to [runpod] alone was judged "unchanged" (the config hash leaves it out), saved, and
on the next terminal failure the key went where it said (issue 24). So such a change is rejected by
name, and a config booted from the reload book gets the boot's values back.

    problems += boot_only_changes(tomllib.loads(text), running_cfg, env)   # a candidate
    cfg = keep_boot_only(cfg, running_cfg)                                # the config as it will run
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..config import BOOT_ONLY, ENV_OVERRIDES, DeployConfig
from ..runpod_env import volume_state_dir


def boot_only_changes(raw: Mapping[str, Any], running: DeployConfig, env: Mapping[str, str]) -> list[str]:
    """What a published config (its TOML, `raw`) changes of what the running supervisor read at boot:
    one message per table, naming it, the keys and where to change them instead. Read from the TOML
    itself, so a change is named even when the rest of the file does not validate. A key an
    ENV_OVERRIDES variable sets is never a change: the environment wins in both. [runpod] api_url
    is named whatever the environment says: it is where the key goes."""
    from_env = {path for name, (path, _) in ENV_OVERRIDES.items() if name in env}
    if running.serverless.active and running.state_dir == volume_state_dir(running.serverless.volume):
        from_env.add("state_dir")       # a Serverless worker's state is on the endpoint's volume
    out = []
    for name, why in BOOT_ONLY.items():
        *parents, leaf = name.split(".")
        table: Any = raw
        for part in parents:
            table = table.get(part) if isinstance(table, dict) else None
        if not isinstance(table, dict) or leaf not in table or name in from_env:
            continue                    # not said (or the environment says): the running value stays
        mine, theirs = _at(running, name), table[leaf]
        if dataclasses.is_dataclass(mine) and isinstance(theirs, dict):
            known = dataclasses.asdict(mine)
            changed = [f"{k}: running {known[k]!r}, published {v!r}" for k, v in theirs.items()
                       if k in known and f"{name}.{k}" not in from_env and not _same(known[k], v)]
            shown = f"[{name}]"         # unknown keys: the schema says so
        else:
            changed = [] if _same(mine, theirs) else [f"running {mine!r}, published {theirs!r}"]
            shown = name
        if changed:
            out.append(f"{shown}: cannot be changed by a published config ({why}; {'; '.join(changed)}). Change it "
                       f"in the image's config (/etc/kiln/deploy.toml) or the pod's environment instead, or leave "
                       f"it out of the published config")
    return out


def keep_boot_only(cfg: DeployConfig, boot: DeployConfig) -> DeployConfig:
    """`cfg` with what the supervisor reads only at boot put back as `boot` has it."""
    for name in BOOT_ONLY:
        *parents, leaf = name.split(".")
        if parents:
            (table,) = parents
            cfg = dataclasses.replace(cfg, **{table: dataclasses.replace(getattr(cfg, table),
                                                                         **{leaf: _at(boot, name)})})
        else:
            cfg = dataclasses.replace(cfg, **{leaf: _at(boot, name)})
    return cfg


def _at(cfg: DeployConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _same(mine: Any, theirs: Any) -> bool:
    if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)) \
            and not isinstance(mine, bool) and not isinstance(theirs, bool):
        return float(mine) == float(theirs)
    if isinstance(mine, tuple) and isinstance(theirs, list):
        return list(mine) == theirs
    return type(mine) is type(theirs) and mine == theirs
