"""`lock`: resolve a target's pins into images/lock.toml."""

from __future__ import annotations

import argparse

from . import command as opt
from .command import Command


def _lock_arguments(p: argparse.ArgumentParser) -> None:
    opt.target(p)
    p.add_argument("--patch-file", action="append", metavar="NAME=PATH",
                   help="your copy of a patch the target names: its sha256 becomes the pin (repeatable)")


def _lock(args: argparse.Namespace) -> int:
    from ..pins import closure as closure_file
    from ..pins import lock as lockfile
    from ..pins import resolve
    from ..pins.lock import load_lock, missing, pins_for, refresh, save_lock
    from ..target import load_target

    target = load_target(args.target)
    patch_files = opt.parse_patch_files(args.patch_file)
    lock = load_lock()
    closures: dict[str, str] = {}
    report = refresh(target, lock, resolvers=resolve.default_resolvers(closure_files=closures),
                     patch_files=patch_files)
    for line in report:
        print(line, flush=True)
    wrote = save_lock(lock)
    closure_pin = lock.get(target.name, {}).get("engine.closure")
    for name, text in closures.items():     # the file the lock's pin names, once the lock says so
        if closure_pin is not None and closure_pin.value == closure_file.digest(text):
            path = closure_file.CLOSURES_DIR / name
            if closure_file.write(path, text):
                print(f"wrote {path}")
    unresolved = missing(target, pins_for(target, lock))
    path = lockfile.LOCK_PATH
    done = f"wrote {path}" if wrote else f"left {path} unchanged (no pin changed)"
    print(f"{done}: {len(unresolved)} pin(s) of {target.name} unresolved")
    return 0 if not unresolved else 1


COMMANDS = (
    Command("lock", "resolve a target's pins into images/lock.toml (needs the network)", _lock, _lock_arguments,
            description="Resolve the target's pins (registry digests, git commit, sha256s) into images/lock.toml;\n"
            "for a wheel engine also its hash-locked closure (images/closures/, the file's sha256 pinned).\n"
            "A pin that cannot be resolved keeps its old value; a file in which nothing changed is left as it "
            "was.\nExit 1 while a pin of the target is unresolved."),
)
