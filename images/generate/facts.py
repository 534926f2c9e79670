"""The engine facts generator: reads a pinned llama.cpp source tree, writes images/engine-facts/.

What the facts are and how a build uses them: images/build/engine_facts.py. Where each fact
comes from in the source tree:

  architectures  gguf-py/gguf/constants.py MODEL_ARCH_NAMES, kept where src/llama-model.cpp's
                 llama_model_mapping() constructs a model for it (a name with no loader is
                 "unsupported" at load time, so it is not known);
  tensor names   gguf-py's MODEL_TENSORS[arch] -> TENSOR_NAMES, united with every tn(LLM_TENSOR_*)
                 the architecture's C++ loader (src/models/*.cpp load_arch_tensors, and the generic
                 pass in llama_model_base::load_tensors) creates, named by src/llama-arch.cpp's
                 LLM_TENSOR_NAMES: the union, so an omission in either list never refuses a file
                 the engine loads;
  tensor types   gguf-py's GGML_QUANT_SIZES (where each tensor's data ends: truncation);
  required keys  ml.get_key / get_arr / get_key_or_arr calls without `required = false` that run
                 unconditionally (top level of llama_model_base::load_hparams and of the
                 architecture's load_arch_hparams, before any early return), plus the
                 `if (!ml.get_X(KEY, ..., false)) { throw std::runtime_error("...") }` pattern,
                 with the engine's own message (DFlash's target_layers is read exactly that way:
                 `ml.get_arr(LLM_KV_TARGET_LAYERS, target_layer_ids, false)`, an array).

The source is each sdist llama.cpp target's pinned sdist, fetched once into Kiln's cache
(images/binaries/obtain.py fetch_source, verified by its locked sha256) and extracted beside it.

    python build.py generate --only engine-facts           # (re)write the facts of every sdist target
    python build.py generate --check --only engine-facts   # exit 1 when a committed file drifted
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from ..binaries.obtain import fetch_source
from ..pins.lock import load_lock, pins_for
from ..target import Target, load_target, target_names
from ..build.engine_facts import SCHEMA, FactsError, facts_path, render

GENERATED_BY = "python build.py generate (images/generate/facts.py)"


def _data_member(m: tarfile.TarInfo) -> bool:
    """What tarfile's "data" filter keeps: a file or folder (or a link) with a relative name inside."""
    name = m.name.replace("\\", "/")
    safe = not name.startswith("/") and ".." not in name.split("/")
    link_ok = not (m.issym() or m.islnk()) or (not m.linkname.startswith("/") and ".." not in m.linkname.split("/"))
    return safe and link_ok and (m.isfile() or m.isdir() or m.issym() or m.islnk())


def source_tree(target: Target, pins: dict) -> Path:
    """The sdist's llama.cpp/ tree, extracted once beside the verified sdist in Kiln's cache."""
    sdist = fetch_source(target, pins)
    tree = sdist.parent / "tree"
    if not (tree / ".complete").is_file():
        # Extracted aside and renamed into place: a concurrent caller sees all of it or none.
        tmp = Path(tempfile.mkdtemp(dir=sdist.parent, prefix=".tree-"))
        try:
            with tarfile.open(sdist) as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(tmp, filter="data")
                else:                 # CPython before 3.11.4 (Debian 12's 3.11.2): the sdist is verified by sha256
                    tar.extractall(tmp, members=[m for m in tar.getmembers() if _data_member(m)])
            (tmp / ".complete").write_text("", encoding="utf-8")
            if tree.exists() and not (tree / ".complete").is_file():
                shutil.rmtree(tree)                  # an older, interrupted extraction
            try:
                os.replace(tmp, tree)
            except OSError:
                pass                                 # another caller's complete tree won the race
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    found = sorted(tree.glob("*/llama.cpp"))
    if not found:
        raise FactsError(f"{sdist.name} has no llama.cpp/ directory")
    return found[0]


# -- C++ reading: just enough to find calls and their nesting ---------------------------------
_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.S)


def _blank(text: str) -> str:
    """Comments and literals replaced by spaces of the same length: braces in them never count."""
    def rep(m: re.Match[str]) -> str:
        s = m.group(0)
        if s.startswith('"'):
            return '"' + " " * (len(s) - 2) + '"'
        return re.sub(r"[^\n]", " ", s)
    return _COMMENT_OR_STRING.sub(rep, text)


def _match_close(blank: str, open_at: int) -> int:
    pairs = {"{": "}", "(": ")"}
    opener, closer = blank[open_at], pairs[blank[open_at]]
    depth = 0
    for i in range(open_at, len(blank)):
        if blank[i] == opener:
            depth += 1
        elif blank[i] == closer:
            depth -= 1
            if depth == 0:
                return i
    raise FactsError(f"unbalanced {opener!r}")


def _definitions(text: str) -> dict[str, tuple[str, str]]:
    """Every function defined in a C++ file: qualified name -> (original body, blanked body)."""
    blank = _blank(text)
    out: dict[str, tuple[str, str]] = {}
    for m in re.finditer(r"(?<![\w:.>])((?:\w+::)*\w+)\s*\(", blank):
        if m.group(1) in out or m.group(1) in ("if", "for", "while", "switch", "return", "sizeof"):
            continue
        try:
            close_args = _match_close(blank, m.end() - 1)
        except FactsError:
            continue
        head = re.match(r"\s*(?:const\s*)?(?:override\s*)?\{", blank[close_args + 1:])
        if not head:
            continue                                 # a call or a declaration, not a definition
        open_body = close_args + 1 + head.end() - 1
        end = _match_close(blank, open_body)
        out[m.group(1)] = (text[open_body + 1:end], blank[open_body + 1:end])
    return out


def _split_args(body: str, blank: str) -> list[str]:
    """Top-level comma-separated arguments (split on the blanked text, returned from the original)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(blank):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(body[start:i].strip())
            start = i + 1
    if body[start:].strip():
        out.append(body[start:].strip())
    return out


_CALL = re.compile(r"\bml\s*(?:\.|->)\s*(get_key_or_arr|get_key|get_arr)\s*\(")
_THROWS = re.compile(r'\{\s*throw\s+std::runtime_error\(\s*"((?:[^"\\]|\\.)*)"\s*\)')
_ARCH_TERM = re.compile(r"^\s*(?:hparams\.vocab_only|(?:ml\.get_arch\(\)|arch)\s*==\s*(LLM_ARCH_\w+))\s*$")


def _required_reads(body: str, blank: str) -> tuple[list[dict[str, str]], list[str]]:
    """Reads in a function body that run unconditionally and throw when the key is missing.

    Returns (reads, excluded_archs): each read is {kv, call, message?}; excluded_archs are those an
    early `if (vocab_only || arch == X) return;` sends away before the reads after it."""
    reads: list[dict[str, str]] = []
    excluded: list[str] = []
    brace = paren = 0
    i = 0
    while i < len(blank):
        ch = blank[i]
        if ch == "{":
            brace += 1
        elif ch == "}":
            brace -= 1
        elif ch == "(":
            paren += 1
        elif ch == ")":
            paren -= 1
        if blank.startswith("return", i) and _is_word(blank, i, "return"):
            if brace == 0:
                break                                  # the rest of the function never runs
            # A nested return: the reads after it are conditional, unless the condition only
            # names architectures (llama_model_base::load_hparams: vocab_only || arch == CLIP).
            archs = _guard_archs(blank, i)
            if archs is None:
                break
            excluded += archs
        m = _CALL.match(blank, i) if blank[i] == "m" else None
        if m and brace == 0:
            open_at = m.end() - 1
            close = _match_close(blank, open_at)
            args = _split_args(body[open_at + 1:close], blank[open_at + 1:close])
            call = m.group(1)
            kv = args[0] if args else ""
            if kv.startswith("LLM_KV_"):
                flags = args[2:] if call != "get_key_or_arr" else [a for a in args[2:] if a in ("true", "false", "0", "1")]
                optional = any(a in ("false", "0") for a in flags)
                if paren == 0 and not optional:
                    reads.append({"kv": kv, "call": call})
                elif paren > 0 and optional:
                    # `if (!ml.get_X(KEY, ..., false)) { throw std::runtime_error("msg"); }`
                    before = blank[:i].rstrip()
                    after = body[close + 1:]
                    tail = re.match(r"\s*\)\s*", after)
                    thrown = _THROWS.match(after, tail.end()) if tail else None
                    if before.endswith("!") and re.search(r"\bif\s*\(\s*!$", before) and thrown:
                        reads.append({"kv": kv, "call": call, "message": thrown.group(1)})
            i = close + 1
            continue
        i += 1
    return reads, excluded


def _is_word(text: str, i: int, word: str) -> bool:
    end = i + len(word)
    return (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) and \
        (end >= len(text) or not (text[end].isalnum() or text[end] == "_"))


def _guard_archs(blank: str, return_at: int) -> list[str] | None:
    """The architectures named by the if-condition right before a nested `return`, when it names
    nothing else; None for any other condition."""
    head = blank[:return_at].rstrip()
    if not head.endswith("{"):
        return None
    cond_end = head[:-1].rstrip()
    if not cond_end.endswith(")"):
        return None
    depth, j = 0, len(cond_end) - 1
    while j >= 0:
        depth += cond_end[j] == ")"
        depth -= cond_end[j] == "("
        if depth == 0:
            break
        j -= 1
    if not re.search(r"\bif\s*$", cond_end[:j]):
        return None
    archs: list[str] = []
    for term in cond_end[j + 1:-1].split("||"):
        m = _ARCH_TERM.match(term)
        if not m:
            return None
        if m.group(1):
            archs.append(m.group(1))
    return archs


def _tensor_refs(body: str) -> set[str]:
    return set(re.findall(r"\btn\(\s*(LLM_TENSOR_\w+)", body))


def _table(text: str, name: str, key_prefix: str) -> dict[str, str]:
    m = re.search(rf"\b{name}\s*=\s*\{{", text)
    if not m:
        raise FactsError(f"src/llama-arch.cpp has no {name} table")
    end = _match_close(_blank(text), m.end() - 1)
    return dict(re.findall(rf'\{{\s*({key_prefix}\w+)\s*,\s*"([^"]*)"\s*\}}', text[m.end():end]))


def _cpp_tensor_template(fmt: str) -> str:
    """'blk.%d.attn_q' -> 'blk.{bid}.attn_q' (the second %d, where there is one, is {xid})."""
    out = fmt.replace("%d", "{bid}", 1)
    return out.replace("%d", "{xid}", 1)


# -- the facts ---------------------------------------------------------------------------------
def _load_constants(tree: Path) -> ModuleType:
    path = tree / "gguf-py" / "gguf" / "constants.py"
    if not path.is_file():
        raise FactsError(f"{path} does not exist")
    spec = importlib.util.spec_from_file_location("kiln_pinned_gguf_constants", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module       # dataclasses/enums in it look themselves up by module name
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module


def _model_classes(mapping_body: str) -> dict[str, str]:
    """LLM_ARCH_* -> the llama_model_* class llama_model_mapping() constructs for it."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for m in re.finditer(r"case\s+(LLM_ARCH_\w+)\s*:|return\s+new\s+(llama_model_\w+)\b", mapping_body):
        if m.group(1):
            pending.append(m.group(1))
        else:
            for arch in pending:
                out[arch] = m.group(2)
            pending = []
    return out


def _bases(models_h: str) -> dict[str, str]:
    return dict(re.findall(r"struct\s+(llama_model_\w+)\s*(?:final\s*)?:\s*public\s+(llama_model_\w+)", models_h))


def _method_bodies(defs: dict[str, tuple[str, str]], cls: str, method: str,
                   bases: dict[str, str]) -> Iterator[tuple[str, str]]:
    """The method's body in cls, else in the nearest base class that has one."""
    seen = set()
    while cls and cls not in seen and cls != "llama_model_base":
        seen.add(cls)
        if f"{cls}::{method}" in defs:
            yield defs[f"{cls}::{method}"]
            return
        cls = bases.get(cls, "")


def extract(tree: Path, *, source: str) -> dict[str, Any]:
    """The facts of the llama.cpp tree at `tree` (the directory holding src/ and gguf-py/)."""
    c = _load_constants(tree)
    arch_cpp = (tree / "src" / "llama-arch.cpp").read_text(encoding="utf-8")
    model_cpp = (tree / "src" / "llama-model.cpp").read_text(encoding="utf-8")
    models_h = (tree / "src" / "models" / "models.h").read_text(encoding="utf-8")
    defs: dict[str, tuple[str, str]] = {}
    for p in sorted((tree / "src" / "models").glob("*.cpp")):
        for name, body in _definitions(p.read_text(encoding="utf-8")).items():
            defs.setdefault(name, body)
    model_defs = _definitions(model_cpp)

    cpp_archs = _table(arch_cpp, "LLM_ARCH_NAMES", "LLM_ARCH_")
    kv_names = _table(arch_cpp, "LLM_KV_NAMES", "LLM_KV_")
    cpp_tensors = {k: _cpp_tensor_template(v) for k, v in _table(arch_cpp, "LLM_TENSOR_NAMES", "LLM_TENSOR_").items()}

    mapping = model_defs.get("llama_model_mapping")
    if mapping is None:
        raise FactsError("src/llama-model.cpp has no llama_model_mapping()")
    classes = _model_classes(mapping[0])
    bases = _bases(models_h)

    generic = model_defs.get("llama_model_base::load_hparams")
    gen_tensors = model_defs.get("llama_model_base::load_tensors")
    if generic is None or gen_tensors is None:
        raise FactsError("src/llama-model.cpp has no llama_model_base::load_hparams / load_tensors")
    generic_reads, generic_excluded = _required_reads(*generic)
    generic_tensor_refs = _tensor_refs(gen_tensors[0])

    py_names = {a: n for a, n in c.MODEL_ARCH_NAMES.items()}
    py_by_name = {n: a for a, n in py_names.items()}
    archs: dict[str, Any] = {}
    for enum_name, arch in sorted(cpp_archs.items(), key=lambda kv: kv[1]):
        cls = classes.get(enum_name)
        if cls is None:
            continue                                   # named, but the engine builds no model for it
        tensors: set[str] = set()
        py_arch = py_by_name.get(arch)
        if py_arch is not None:
            tensors |= {c.TENSOR_NAMES[t] for t in c.MODEL_TENSORS.get(py_arch, ()) if t in c.TENSOR_NAMES}
        refs = set(generic_tensor_refs)
        for body, _ in _method_bodies(defs, cls, "load_arch_tensors", bases):
            refs |= _tensor_refs(body)
        tensors |= {cpp_tensors[r] for r in refs if r in cpp_tensors}
        reads = [] if enum_name in generic_excluded else list(generic_reads)
        for body, blank in _method_bodies(defs, cls, "load_arch_hparams", bases):
            reads += _required_reads(body, blank)[0]
        required = []
        for r in reads:
            if r["kv"] not in kv_names:
                continue
            key = kv_names[r["kv"]].replace("%s", arch)
            entry = {"key": key, "read": r["call"]}
            if "message" in r:
                entry["message"] = r["message"]
            if entry not in required:
                required.append(entry)
        archs[arch] = {"tensors": sorted(tensors), "required_keys": required}
    if not archs:
        raise FactsError("no architecture found: the source layout is not the one this reader knows")
    # Tensor types and their block sizes (gguf-py GGML_QUANT_SIZES): where each tensor's data ends.
    types = {str(int(t)): {"name": t.name, "block": b, "bytes": n} for t, (b, n) in c.GGML_QUANT_SIZES.items()}
    return {"schema": SCHEMA, "engine": "llama.cpp", "source": source,
            "generated_by": GENERATED_BY,
            "architectures": archs, "ggml_types": types}


def source_label(target: Target, pins: dict) -> str:
    return f"sdist:{target.source.filename}@sha256:{pins['source.sha256'].value}"


def generated() -> dict[Path, str]:
    """Every committed facts file, as the pinned sources say it should read."""
    lock = load_lock()
    out: dict[Path, str] = {}
    for name in target_names():
        target = load_target(name)
        path = facts_path(target)
        if path is None or path in out:
            continue
        pins = pins_for(target, lock)
        out[path] = render(extract(source_tree(target, pins), source=source_label(target, pins)))
    return out

