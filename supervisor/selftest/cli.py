"""`python -m supervisor selftest --url URL`: the selftest against any OpenAI-compatible server.

Exit 0 when it passed, 1 when it failed, 2 on bad usage or when the server cannot be reached at
all (nothing listening, no such host: a script must not read that as a quality failure).
The table goes to stdout, progress to stderr, the full report to --json. The API key is read
from an environment variable (--api-key-env), never from the command line, where `ps` shows it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from ..config import SelftestSpec

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
# The [selftest] fields the options are checked as, and the option each one came from.
OPTION_OF = {"probes": "--family", "tools": "--tools", "decode_tokens": "--decode-tokens",
             "min_decode_tok_s": "--min-decode-tok-s", "prefill_tokens": "--prefill-tokens",
             "min_prefill_tok_s": "--min-prefill-tok-s", "request_wall_s": "--request-wall-s",
             "min_probe_pass": "--min-probe-pass", "timeout_s": "--timeout-s"}


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    d = SelftestSpec()
    p = sub.add_parser("selftest", help="probe an OpenAI-compatible server and measure it; "
                       "exit 0 pass, 1 fail, 2 unreachable or bad usage",
                       description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8080 (a /v1 suffix is fine)")
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the API key")
    p.add_argument("--family", default="generic", help="probe set (model family), default generic")
    p.add_argument("--engine", choices=("auto", "llamacpp", "vllm", "openai"), default="auto",
                   help="auto: llama.cpp when GET /props answers like llama-server, else plain OpenAI")
    p.add_argument("--json", metavar="OUT", help="write the full report here")
    p.add_argument("--tools", action="store_true", help="the server serves tool calls: probe them (fatal)")
    p.add_argument("--decode-tokens", type=int, default=d.decode_tokens, help=f"default {d.decode_tokens}; 0 skips")
    p.add_argument("--min-decode-tok-s", type=float, default=d.min_decode_tok_s, help="floor; 0 = report only")
    p.add_argument("--prefill-tokens", type=int, default=d.prefill_tokens, help=f"default {d.prefill_tokens}; 0 skips")
    p.add_argument("--min-prefill-tok-s", type=float, default=d.min_prefill_tok_s, help="floor; 0 = report only")
    p.add_argument("--request-wall-s", type=float, default=d.request_wall_s,
                   help=f"no request longer than this, default {d.request_wall_s:g} (RunPod's proxy cuts at ~125)")
    p.add_argument("--min-probe-pass", type=float, default=d.min_probe_pass,
                   help=f"share of scored probes that must pass, default {d.min_probe_pass:g}")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s, help=f"the whole selftest, default {d.timeout_s:g}")
    p.add_argument("--gate", action="store_true",
                   help="run it as a Serverless worker's cold start does: probes at once, measurements sized to "
                        "the floors (default: the full selftest)")
    return p


def main(args: argparse.Namespace) -> int:
    from ..config import parse_config
    from ..errors import ConfigError
    from .client import Client, ClientError, RequestCancelled
    from .runner import run_selftest

    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            print(f"--api-key-env {args.api_key_env}: the variable is unset or empty", file=sys.stderr)
            return EXIT_USAGE
    # Validate the numbers with the deploy config's own rules: one language for every problem.
    table = {"probes": args.family, "tools": args.tools, "decode_tokens": args.decode_tokens,
             "min_decode_tok_s": args.min_decode_tok_s, "prefill_tokens": args.prefill_tokens,
             "min_prefill_tok_s": args.min_prefill_tok_s, "request_wall_s": args.request_wall_s,
             "min_probe_pass": args.min_probe_pass, "timeout_s": args.timeout_s}
    toml = "[model]\nsource = \"/x\"\n[ladder]\n[[ladder.rungs]]\nname = \"x\"\n[selftest]\n" + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in table.items())
    try:
        spec = parse_config(toml, source="command line", env={}).selftest
    except ConfigError as e:
        print(f"selftest: {len(e.problems)} bad option(s)", file=sys.stderr)
        for p in e.problems:
            field = p.path.removeprefix("selftest.")
            print(f"  - {dataclasses.replace(p, path=OPTION_OF.get(field, field))}", file=sys.stderr)
        return EXIT_USAGE
    # Where the report goes is checked before the run: a run of minutes must not end in a traceback.
    json_problem = _json_out_problem(args.json) if args.json else None
    if json_problem:
        print(f"--json {args.json}: {json_problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        client = Client(args.url, key, timeout_s=spec.request_wall_s,
                        engine=None if args.engine == "auto" else args.engine)
    except ValueError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    try:
        client.reach(min(10.0, spec.timeout_s))
    except ClientError as e:
        print(f"cannot reach the server at {client.url}: {e}", file=sys.stderr)   # no userinfo in it
        return EXIT_USAGE
    try:
        report = run_selftest(client, spec, family=args.family, log=lambda m: print(m, file=sys.stderr),
                              gate=getattr(args, "gate", False))
    except RequestCancelled:
        return EXIT_FAIL
    except KeyboardInterrupt:
        client.abort()
        return 130
    print(report.table())
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
        except OSError as e:         # checked before the run; a disk may still fill up meanwhile
            print(f"--json {args.json}: the report cannot be written ({e.strerror or e}); the table above is "
                  f"the result ({'passed' if report.passed else 'FAILED'})", file=sys.stderr)
            return EXIT_USAGE
    return EXIT_PASS if report.passed else EXIT_FAIL


def _json_out_problem(out: str) -> str | None:
    """Why the report could not be written to `out`, or None."""
    path = Path(out)
    if path.is_dir():
        return "is a directory: name a file (e.g. selftest.json) in it"
    parent = path.absolute().parent
    if not parent.is_dir():
        return f"the directory {parent} does not exist: create it first, or name a file in a directory that does"
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"cannot be written by this user ({path if path.exists() else parent} is not writable)"
    return None
