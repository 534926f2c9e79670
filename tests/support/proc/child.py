"""Stand-in server: prints `ready (pid: N)` and `signal: NAME` for every signal it receives.

Options (all optional):
  --say TEXT        print TEXT before ready (repeatable; used for redaction canaries)
  --lines N         print `line 0` .. `line N-1` before ready (with the --say lines, one write)
  --raw HEX         first write these raw bytes plus a newline (invalid UTF-8 tests)
  --ignore-term     report SIGTERM but keep running (only SIGKILL stops it)
  --burst BYTES     after ready, write about BYTES of 100-character lines at once, then `burst done`
  --ticks N         after ready, print `tick 0` .. `tick N-1`, each its own flushed write
  --tick-ms MS      between two ticks (default 20): a serving engine's lines, one by one
  --exit CODE       exit with CODE right after ready (and the ticks)
  --die SIG         kill itself with signal number SIG right after ready
SIGTERM otherwise re-raises with the default action, so the parent sees death by signal 15.
"""

import argparse
import os
import signal
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--say", action="append", default=[])
    ap.add_argument("--lines", type=int, default=0)
    ap.add_argument("--raw")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--burst", type=int, default=0)
    ap.add_argument("--ticks", type=int, default=0)
    ap.add_argument("--tick-ms", type=float, default=20.0)
    ap.add_argument("--exit", type=int)
    ap.add_argument("--die", type=int)
    args = ap.parse_args()

    def on_signal(signum: int, frame: object) -> None:
        print(f"signal: {signal.Signals(signum).name}", flush=True)
        if signum == signal.SIGTERM and not args.ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, on_signal)

    if args.raw:
        sys.stdout.buffer.write(bytes.fromhex(args.raw) + b"\n")
        sys.stdout.buffer.flush()
    # One write for all of them, as an engine's buffered log does: a reader gets several lines a
    # read even where PYTHONUNBUFFERED is set (CI's environment) and the reader keeps up.
    sys.stdout.write("".join(f"{text}\n" for text in [*args.say, *(f"line {i}" for i in range(args.lines))]))
    print(f"ready (pid: {os.getpid()})", flush=True)
    if args.burst:
        line = "b" * 99 + "\n"
        for _ in range(args.burst // 100):
            sys.stdout.write(line)
        print("burst done", flush=True)
    for i in range(args.ticks):
        time.sleep(args.tick_ms / 1000)   # the pacing is the scenario: lines that come one by one
        print(f"tick {i}", flush=True)

    if args.exit is not None:
        sys.exit(args.exit)
    if args.die is not None:
        if args.die != signal.SIGKILL:  # SIGKILL cannot be handled, so needs no reset
            signal.signal(args.die, signal.SIG_DFL)
        os.kill(os.getpid(), args.die)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
