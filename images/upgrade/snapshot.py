"""The flag snapshot of an engine version that no image has yet: made the way the image build makes
it, from the engine's own parser, and cached by version so a second `upgrade` is quick.

    ~/.cache/kiln/upgrade/<package>-<version>/      ($KILN_CACHE_DIR/upgrade/...)
        serve-help-all.txt | llama-server-help.txt   the snapshot (what a later run reads)
        venv/                                        vLLM: the scratch venv it was printed in (kept)

vLLM: images/scripts/vllm-flag-snapshot.py (vLLM's CPU platform pinned, so its parser prints without
a GPU) in a light scratch venv: the version's hash-locked closure installed `--no-deps` without the
GPU packages (nvidia-*, cuda-*, torch, triton, flashinfer, ...) and with a CPU torch. The real parser
needs none of them to print; the research for issue 27 measured that recipe (61 packages, 7 s) giving
the full install's `--help=all` byte for byte. What the parser still imports is installed from the
closure, one missing module at a time. A CPU torch: --cpu-torch SPEC, else a `torch-*+cpu` wheel in
pip's find-links, else download.pytorch.org's CPU index.

The router (smg): the version's wheel and its dependencies installed from the index into a scratch
directory (`pip install --target`, binary wheels only: smg is a Rust binary in an abi3 wheel, no GPU
needed), its `smg launch --help` printed by that copy (the console script's `smg.cli:main`).

llama.cpp: the sdist compiled with the target's own recipe (`build.py compile`'s cache, keyed by the
source's sha256), its `llama-server --help`. Compiling takes minutes (8 on two cores for a CPU
build); parsing common/arg.cpp by hand would be quicker and wrong wherever the code builds its help
text, which the compiled binary prints as it is.

A given file (`upgrade --snapshot VERSION=FILE`, e.g. a committed help fixture) is used as it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator, Mapping

from supervisor.errors import KilnError

from ..pins import closure as closure_file
from ..pins.lock import Pin
from ..binaries import obtain
from ..paths import VLLM_SNAPSHOT_SCRIPT
from ..target import Target

HELP_MARK = {"vllm": "--max-model-len", "llamacpp": "--ctx-size", "router": "--policy"}
SNAPSHOT_FILE = {"vllm": "serve-help-all.txt", "llamacpp": "llama-server-help.txt", "router": "smg-launch-help.txt"}
# What the parser never imports and the image pays gigabytes for: left out of the light venv.
HEAVY = re.compile(r"^(nvidia-|cuda-|torch$|torchvision$|torchaudio$|triton$|tokenspeed-|flashinfer|humming-|nccl|"
                   r"xformers|cupy|deep-?gemm|opencv|quack-kernels|tilelang|pynvvideocodec)")
# import name -> distribution, where they differ (the rest: the name with _ as -)
MODULE_DIST = {"yaml": "pyyaml", "zmq": "pyzmq", "cv2": "opencv-python-headless", "PIL": "pillow",
               "google": "protobuf", "cpuinfo": "py-cpuinfo", "multipart": "python-multipart",
               "dateutil": "python-dateutil", "attr": "attrs", "pynvml": "nvidia-ml-py",
               "openai_harmony": "oss-harmony", "tvm_ffi": "apache-tvm-ffi", "jwt": "pyjwt",
               "sklearn": "scikit-learn", "opentelemetry": "opentelemetry-api"}
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
ROUNDS = 16

Log = Callable[[str], None]


class SnapshotFailed(KilnError):
    """The engine's parser could not be made to print its flags (the message has the reason and its tail)."""


def cache_root() -> Path:
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln") / "upgrade"


def slot(package: str, version: str) -> Path:
    return cache_root() / f"{package}-{version}"


def cached(engine: str, package: str, version: str) -> Path | None:
    path = slot(package, version) / SNAPSHOT_FILE[engine]
    try:
        return path if HELP_MARK[engine] in path.read_text(encoding="utf-8", errors="replace") else None
    except OSError:
        return None


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def snapshot(target: Target, pins: Mapping[str, Pin], *, closure_text: str | None = None,
             python: str | None = None, cpu_torch: str | None = None, log: Log = _stderr) -> tuple[Path, str]:
    """(the snapshot file, how it was had: cached | made) for the target's engine at its source version."""
    src = target.source
    assert src.package and src.version
    have = cached(target.engine, src.package, src.version)
    if have is not None:
        return have, "cached"
    out = slot(src.package, src.version) / SNAPSHOT_FILE[target.engine]
    out.parent.mkdir(parents=True, exist_ok=True)
    if target.engine == "vllm":
        if not closure_text:
            raise SnapshotFailed(f"{src.package} {src.version}: no closure to build a scratch venv from")
        text = _vllm_help(out.parent / "venv", src.package, src.version, closure_text,
                          python or sys.executable, cpu_torch, log)
    elif target.engine == "router":
        text = _router_help(out.parent / "site", src.package, src.version, log)
    else:
        text = _llama_help(target, pins, log)
    if HELP_MARK[target.engine] not in text:
        raise SnapshotFailed(f"{src.package} {src.version}: the help printed lacks {HELP_MARK[target.engine]}: "
                             "not a flag snapshot")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out, "made"


# -- the router (smg) ----------------------------------------------------------------------------------
_SMG_HELP = "import sys; sys.argv = ['smg', 'launch', '--help']; from smg.cli import main; main()"


def _router_help(site: Path, package: str, version: str, log: Log) -> str:
    """`smg launch --help` of `package==version`, installed (with its dependencies) under `site`."""
    if not (site / package).is_dir():
        _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--only-binary=:all:",
              "--target", str(site), f"{package}=={version}"], log,
             what=f"installing {package} {version} for its parser")
    env = {**os.environ, "PYTHONPATH": str(site), "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-s", "-c", _SMG_HELP], capture_output=True, text=True,
                       env=env, check=False)
    if r.returncode != 0:
        raise SnapshotFailed(f"{package} {version}: `smg launch --help` exited {r.returncode}: {_tail(r.stderr)}")
    return r.stdout


# -- vLLM ---------------------------------------------------------------------------------------------
def _run(argv: list[str], log: Log, *, what: str, check: bool = True) -> subprocess.CompletedProcess:
    log(f"upgrade: {what}: {shlex.join(argv[:6])}{' …' if len(argv) > 6 else ''}")
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        raise SnapshotFailed(f"{what} failed (exit {r.returncode}): {_tail(r.stderr or r.stdout)}")
    return r


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _pip(venv: Path) -> list[str]:
    return [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-q"]


def find_links() -> list[Path]:
    """Directories pip takes wheels from on this machine (PIP_FIND_LINKS, pip's config)."""
    dirs = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
        dirs += [w for line in out.splitlines() if "find-links" in line
                 for w in line.split("=", 1)[1].strip().strip("'\"").split()]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return [Path(d.removeprefix("file://")) for d in dict.fromkeys(dirs) if d and not d.startswith("http")]


def _cpu_torch(venv: Path, spec: str | None, log: Log) -> list[str]:
    """The pip arguments that install a CPU torch into the venv."""
    if spec:
        return [spec]
    tag = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True).stdout.strip()
    local = sorted((w for d in find_links() if d.is_dir() for w in d.glob(f"torch-*+cpu-{tag}-*.whl")),
                   key=lambda p: p.name)
    if local:
        log(f"upgrade: a CPU torch from pip's find-links: {local[-1]}")
        return [str(local[-1])]
    return ["--index-url", CPU_TORCH_INDEX, "torch"]


def _install_skipping(venv: Path, reqs: list[str], log: Log) -> None:
    """pip install --no-deps every requirement, each at the closure's version where that has a wheel for
    the venv's Python, else at the newest that has (the closure was walked for the image's 3.12:
    networkx 3.7 needs >= 3.12, and torch imports networkx while the parser loads), else not at all."""
    reqs = list(reqs)
    while reqs:
        r = _run(_pip(venv) + reqs, log, what=f"{len(reqs)} packages", check=False)
        if r.returncode == 0:
            return
        m = re.search(r"No matching distribution found for (\S+)", r.stderr)
        if not m or m.group(1) not in reqs:
            raise SnapshotFailed(f"pip install into {venv} failed: {_tail(r.stderr)}")
        req = m.group(1)
        name = req.split("==", 1)[0]
        reqs[reqs.index(req)] = name
        if name == req:
            reqs.remove(name)
            log(f"upgrade: skipped {name}: no wheel for this Python at all")
        else:
            log(f"upgrade: {req} has no wheel for this Python: the newest that has instead")


def _vllm_help(venv: Path, package: str, version: str, closure_text: str, python: str,
               cpu_torch: str | None, log: Log) -> str:
    pinned = closure_file.pinned(closure_text)
    if package not in pinned:
        raise SnapshotFailed(f"the closure does not hold {package} itself")
    ready = venv / ".kiln-light-closure"          # written last: a venv cut short is built again
    if not ready.is_file():
        _run([python, "-m", "venv", "--clear", str(venv)], log, what="a scratch venv")
        _run(_pip(venv) + _cpu_torch(venv, cpu_torch, log), log, what="a CPU torch")
        light = [f"{n}=={v}" for n, (v, _) in sorted(pinned.items()) if not HEAVY.match(n)]
        log(f"upgrade: {len(light)} of the closure's {len(pinned)} packages, --no-deps (the GPU ones left out)")
        _install_skipping(venv, light, log)
        ready.write_text(closure_file.digest(closure_text) + "\n", encoding="utf-8")
    installed: set[str] = set()
    for _ in range(ROUNDS):
        r = subprocess.run([str(venv / "bin" / "python"), str(VLLM_SNAPSHOT_SCRIPT)], capture_output=True,
                           text=True, check=False, env={**os.environ, "VLLM_CONFIGURE_LOGGING": "0"})
        if r.returncode == 0 and HELP_MARK["vllm"] in r.stdout:
            return r.stdout
        m = re.findall(r"No module named '([^'.]+)", r.stderr)
        module = m[-1] if m else None
        dist = MODULE_DIST.get(module or "", (module or "").replace("_", "-").lower())
        if not module or dist not in pinned or dist in installed:
            raise SnapshotFailed(f"vllm-flag-snapshot.py failed (exit {r.returncode}) in {venv}: {_tail(r.stderr)}")
        log(f"upgrade: the parser imports {module}: installing {dist}=={pinned[dist][0]} from the closure")
        _install_skipping(venv, [f"{dist}=={pinned[dist][0]}"], log)
        installed.add(dist)
    raise SnapshotFailed(f"vllm-flag-snapshot.py still fails after {ROUNDS} rounds in {venv}")


# -- llama.cpp ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 pointed at 2 for a while: a child process's output goes there too."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _llama_help(target: Target, pins: Mapping[str, Pin], log: Log) -> str:
    log(f"upgrade: compiling llama-server from {target.source.filename} (cached by its sha256; minutes)")
    with _stdout_to_stderr():       # the compile's output is progress, not the report on stdout
        prefix, _ = obtain.host_compile(target, dict(pins))
    help_file = prefix / "share" / "kiln" / "llama-server.help.txt"
    try:
        return help_file.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise SnapshotFailed(f"the compile wrote no flag snapshot at {help_file} ({e.strerror})") from None

