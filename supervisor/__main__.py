"""`python -m supervisor`: PID 1 of every Kiln image.

    python -m supervisor --version
    python -m supervisor run [--config FILE] [--exit-on-failure]
    python -m supervisor check-config FILE [--flags HELP.txt] [--gpus N] [--strict] [--skip-binary]
    python -m supervisor check-model FILE [--engine-share DIR] [--draft FILE]
    python -m supervisor selftest --url http://host:port [--api-key-env NAME] [--family F] [--json OUT]

Nothing here imports images/ (publish-config and fleet-status are workstation commands: build.py).

`run` with a deploy config that does not validate stays up in FAILED and says why on /status
(run/boot_failure.py); `--exit-on-failure` exits 2 instead. No command ends in a traceback:
an error nothing foresaw is one line on stderr and exit 1 (KILN_TRACEBACK=1 adds the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from . import __version__

DEFAULT_CONFIG = "/etc/kiln/deploy.toml"
EXIT_INVALID = 2


def _run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--config", default=None,
                     help="deploy config (default: $KILN_DEPLOY_CONFIG, the config the deployment carries, "
                          f"else $KILN_CONFIG, else {DEFAULT_CONFIG}; deploy_env.py)")
    run.add_argument("--exit-on-failure", action="store_true",
                     default=os.environ.get("KILN_EXIT_ON_FAILURE", "") in ("1", "true"),
                     help="exit when FAILED instead of staying up to explain why on /status")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m supervisor", description="Kiln's in-image supervisor.")
    p.add_argument("--version", action="version", version=f"kiln-supervisor {__version__}")
    sub = p.add_subparsers(dest="command")
    _run_arguments(sub.add_parser("run", help="bring the server up and keep it honest (the image's entrypoint)"))
    chk = sub.add_parser("check-config", help="validate a deploy config (and lint its rungs); exit 0 or 2")
    chk.add_argument("file")
    chk.add_argument("--flags", help="the engine's --help output to lint rungs against "
                     "(default: the config's server.flag_snapshot when it exists)")
    chk.add_argument("--gpus", type=int, default=None, help="GPU count to check manual placements for")
    chk.add_argument("--strict", action="store_true",
                     help="exit 2 when something could not be checked here (no flag snapshot, --skip-binary)")
    chk.add_argument("--skip-binary", action="store_true",
                     help="do not require server.binary on this machine (a config for an image, checked elsewhere)")
    from .model import check as model_check
    model_check.add_parser(sub)
    from .selftest import cli as selftest_cli
    selftest_cli.add_parser(sub)
    return p


def check_config(path: str, flags: str | None, gpus: int | None, *, strict: bool = False,
                 skip_binary: bool = False) -> int:
    """Problems go to stderr (exit 2). `ok` goes to stdout and says what was not checked, so a
    script reading it cannot mistake an unchecked rung for a good one; --strict makes that exit 2."""
    from .engines import registry as engines
    from .config import load_config
    from .errors import ConfigError

    try:
        cfg = load_config(path)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_INVALID
    problems: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    unchecked: list[str] = []
    if flags and not Path(flags).is_file():
        problems.append(f"--flags {flags}: no such file (give the engine's --help output saved to a file)")
    try:
        engine = engines.get(cfg.engine)
    except KeyError as e:
        unchecked.append(f"rungs NOT linted: {e.args[0]}")
        engine = None
    if engine is not None:
        snap_path = Path(flags or cfg.server.flag_snapshot)
        snapshot = engine.load_snapshot(snap_path) if snap_path.is_file() else None
        if snapshot is None:
            unchecked.append(f"flags NOT checked: no flag snapshot at {snap_path} (pass --flags HELP.txt)")
        for i, rung in enumerate(cfg.ladder.rungs):
            problems += [str(x) for x in engine.lint_rung(cfg, i, rung, snapshot, gpu_count=gpus)]
            warnings += [str(x) for x in engine.lint_rung_warnings(cfg, i, rung, snapshot)]
            notes += _sampler_notes(cfg, i, rung, engine.sampler_overrides(cfg, rung, snapshot))
    if skip_binary:
        unchecked.append("engine binary NOT checked (--skip-binary)")
    elif not engines.binary_present(cfg.server.binary):
        problems.append(engines.missing_binary_message(cfg.server.binary, cfg.engine)
                        + " (or pass --skip-binary to check a config meant for an image)")
    if problems:
        print(f"deploy config {path}: {len(problems)} problem(s)", file=sys.stderr)
        for line in problems:
            print(f"  - {line}", file=sys.stderr)
        return EXIT_INVALID
    if strict and unchecked:
        print(f"deploy config {path}: not fully checked (--strict): {'; '.join(unchecked)}", file=sys.stderr)
        return EXIT_INVALID
    note = "".join(f"; {u}" for u in unchecked)
    print(f"{path}: ok (config hash {cfg.hash[:12]}, {len(cfg.ladder.rungs)} rung(s){note})")
    for w in warnings:               # runs, but costs speed (the field notes' measured slow-downs)
        print(f"  {w}")
    for n in notes:                  # what a rung changes of [sampler]: on purpose, but never silently
        print(f"  {n}")
    return 0


def _sampler_notes(cfg: Any, index: int, rung: Any, overrides: dict[str, str]) -> list[str]:
    """One line per rung that sets [sampler] defaults itself: which it replaces, and which still apply."""
    if not overrides:
        return []
    fields = ("temperature", "min_p", "top_p", "top_k", "repeat_penalty")
    replaced = ", ".join(f"{f} = {getattr(cfg.sampler, f)} with {overrides[f]}" for f in fields if f in overrides)
    kept = [f"{f} = {getattr(cfg.sampler, f)}" for f in fields
            if getattr(cfg.sampler, f) is not None and f not in overrides]
    rest = f"{', '.join(kept)} still apply" if kept else "no other [sampler] default is set"
    return [f"ladder.rungs[{index}] ({rung.name}): replaces [sampler] {replaced}; {rest}"]


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] == "run":
        # PID 1's path: parse `run` alone, so a boot imports none of the other commands (P1).
        run_parser = argparse.ArgumentParser(prog="python -m supervisor run")
        _run_arguments(run_parser)
        args = run_parser.parse_args(argv[1:])
        args.command = "run"
    else:
        args = _parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.file, args.flags, args.gpus, strict=args.strict, skip_binary=args.skip_binary)
    if args.command == "check-model":
        from .model import check as model_check
        return model_check.main(args)
    if args.command == "selftest":
        from .selftest import cli as selftest_cli
        return selftest_cli.main(args)
    if args.command in (None, "run"):
        from . import deploy_env
        from .config import load_config, parse_config
        from .errors import ConfigError
        from .run.logs import setup_logging
        from .run.timeline import process_start

        setup_logging()
        config, text = getattr(args, "config", None), None
        exit_on_failure = getattr(args, "exit_on_failure", False)
        try:
            config, text = deploy_env.choose(config, os.environ, DEFAULT_CONFIG)
            cfg = load_config(config) if text is None else parse_config(text, source=config)
        except ConfigError as e:
            config = config or deploy_env.SOURCE          # choose() refused the carried config itself
            from . import runpod_env as serverless

            if exit_on_failure:   # CI: say it and go
                print(e, file=sys.stderr)
                return EXIT_INVALID
            from .run import boot_failure
            if serverless.active(os.environ):
                # A Serverless worker logs the failure line every phase logs and answers 503 for its grace
                # ([serverless] exit_grace_s), so RunPod and `endpoint up --wait` see it UNHEALTHY with its
                # cause, then goes: released (no bill), and an endpoint that keeps producing such workers is
                # scaled down (runpod_env.py).
                boot_failure.serve(e, config, os.environ, serverless=True, text=text)
                return EXIT_INVALID
            # A pod's PID 1 stays up in FAILED to say why: an exit would restart the container into the
            # same failure, in a loop that bills (run/boot_failure.py).
            return boot_failure.serve(e, config, os.environ, text=text)
        # The model prefetch begins here, before the loop's imports ([startup] prefetch_at = "start", the
        # default; "preflight" leaves it to the loop): model/prefetch.py says what it bought and cost.
        from .model import prefetch

        early = prefetch.begin(cfg, os.environ)
        from .run.loop import Options, run

        return run(cfg, Options(exit_on_failure=exit_on_failure, process_start=process_start(), prefetch=early))
    return EXIT_INVALID


def main(argv: list[str] | None = None) -> int:
    """Every command's exit status; never a traceback: what is not a KilnError the command handles
    (a bug) is one line on stderr, the traceback only with KILN_TRACEBACK=1."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the last net under every command
        return _unexpected("python -m supervisor", e)


def _unexpected(prog: str, e: BaseException) -> int:
    """One line for an error nothing foresaw (secrets masked), and exit 1; KILN_TRACEBACK=1 adds the traceback."""
    import traceback

    from .redact import redact

    secrets = [os.environ.get(k) for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "RUNPOD_API_KEY", "KILN_API_KEY")]
    if os.environ.get("KILN_TRACEBACK", "") in ("1", "true"):
        print(redact(traceback.format_exc(), secrets), file=sys.stderr, end="")
    print(redact(f"{prog}: unexpected {type(e).__name__}: {e} (a bug in Kiln: please report it; "
                 "KILN_TRACEBACK=1 prints where it happened)", secrets), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
