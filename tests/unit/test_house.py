"""The house keeps its shape: where code lives says where it runs (issue 23, docs/architecture.md).

- no import cycle among Kiln's modules (imports inside functions count; `if TYPE_CHECKING:` ones do not)
- supervisor/ (what every image carries) imports no other Kiln package
- images/ (the workstation and CI) takes from supervisor/ only its named contracts (CONTRACTS)
- product code never imports kiln_dev/ or tests/; benches never import tests/
- supervisor's package __init__ files import nothing (the `run` path pays only for what the launch needs)
- at most a dozen modules loose at the top of supervisor/
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("supervisor", "images", "kiln_dev", "bench", "tests")

# What crosses from the image's package to the workstation's, each for one reason.
CONTRACTS = {
    "supervisor": "the version (image tags, labels)",
    "supervisor.config": "the deploy-config schema a target bakes and publish-config uploads",
    "supervisor.validate": "one error language for targets and deploy configs",
    "supervisor.errors": "the exception tree",
    "supervisor.redact": "the one redaction",
    "supervisor.fleet.record": "the fleet record: where pods report, staleness, canary assignment",
    "supervisor.hubclient": "the Hub token and what a Hub error means (publish, rollout, fleet-status)",
    "supervisor.reload.candidate": "what a published config must pass before it may replace a running one",
    "supervisor.engines.registry": "the engines' flag lint (publish-config lints before uploading)",
    "supervisor.runpod_env": "the Serverless worker's one failure line, which `endpoint up --wait` reads",
    "supervisor.serverless.failures": "the failure records' clear mark, which `endpoint failures --clear` sets "
                                      "on the endpoint and its workers read",
    "supervisor.plan.shape": "what a model's memory depends on, the same for `plan` and a booted pod's self-check",
    "supervisor.plan.memory": "the memory arithmetic `plan` predicts with and a booted pod checks",
    "supervisor.plan.fit": "per-card placement: resident or offloaded, the same rule before renting and after boot",
    "supervisor.model.gguf_layout": "the GGUF header reader, for `plan` from a prefix fetched by range",
    "supervisor.deploy_env": "the deploy config a deployment carries in its pods' environment (KILN_DEPLOY_CONFIG): "
                             "`up --config` writes it, the supervisor boots from it",
    "supervisor.cluster_env": "the variables naming a node's cluster and sealing its beats, which `cluster plan/up` sets and a FAILED "
                              "group's rank 0 reads to find its cluster",
    "supervisor.cluster.engine": "the flags a cluster node adds to the engine's argv, which `upgrade` lints against a new "
                                 "engine's flags before it changes a pinned version",
    "supervisor.cluster.node": "which engines can span nodes (SPANS_NODES), so `upgrade` lints cluster flags only where they apply",
}
LOOSE_MAX = 12


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


MODULES = _modules()


def _owner(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def imports_of(name: str) -> set[str]:
    """Kiln modules `name` imports, anywhere in the file (functions too), TYPE_CHECKING excluded."""
    f = MODULES[name]
    tree = ast.parse(f.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(filter(None, (_owner(a.name) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                full = f"{module}.{a.name}"
                owner = full if full in MODULES else _owner(module)
                if owner:
                    out.add(owner)
    out.discard(name)
    return out


GRAPH = {name: imports_of(name) for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:              # Tarjan, iterative enough for a few hundred modules
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _top(name: str) -> str:
    return name.split(".")[0]


def test_no_import_cycle_among_kiln_modules():
    assert cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function():
    # The check itself can fail: a -> b at module level, b -> a inside a function.
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_supervisor_imports_no_other_kiln_package():
    bad = {name: sorted(i for i in deps if _top(i) != "supervisor")
           for name, deps in GRAPH.items() if _top(name) == "supervisor"}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_workstation_takes_only_the_supervisors_contracts():
    bad = {name: sorted(i for i in deps if _top(i) == "supervisor" and i not in CONTRACTS)
           for name, deps in GRAPH.items() if _top(name) == "images" or name == "build"}
    assert {k: v for k, v in bad.items() if v} == {}, "add it to CONTRACTS with its reason, or move it"


def test_every_contract_is_used_and_exists():
    used = {i for name, deps in GRAPH.items() if _top(name) == "images" for i in deps}
    assert set(CONTRACTS) <= set(MODULES)
    assert set(CONTRACTS) - used == set(), "a contract nobody uses: drop it from CONTRACTS"


def test_product_code_never_imports_development_or_test_code():
    bad = {name: sorted(i for i in deps if _top(i) in ("kiln_dev", "tests"))
           for name, deps in GRAPH.items() if _top(name) in ("supervisor", "images")}
    assert {k: v for k, v in bad.items() if v} == {}
    bench = {name: sorted(i for i in deps if _top(i) == "tests")
             for name, deps in GRAPH.items() if _top(name) == "bench"}
    assert {k: v for k, v in bench.items() if v} == {}


@pytest.mark.parametrize("init", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "supervisor").rglob("__init__.py")))
def test_supervisor_package_inits_import_nothing(init):
    tree = ast.parse((ROOT / init).read_text(encoding="utf-8"))
    imports = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
               and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    assert imports == [], f"{init}: a package __init__ that imports makes every importer pay for it"
    assert ast.get_docstring(tree), f"{init}: say in its docstring which file holds which step"


def test_at_most_a_dozen_modules_loose_at_the_top_of_the_supervisor():
    loose = sorted(p.name for p in (ROOT / "supervisor").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(loose) <= LOOSE_MAX, loose


def test_no_two_test_files_share_a_basename():
    # pytest (rootdir imports, no __init__.py in tests/) collects one module per basename: a second
    # tests/*/test_x.py stops the whole run at collection.
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


# -- folders: one layer of one concept each, importing only downward (issue 35) ----------------------
# supervisor/: base -> decisions -> libraries -> shell -> __main__. A folder's imports (functions too,
# TYPE_CHECKING excluded) go to its own layer or below; among the libraries, no folder cycle.
SUPERVISOR_LAYERS = {
    "base": {"supervisor", "config", "validate", "errors", "failure", "redact", "hubclient", "runpod_env",
             "cluster_env", "deploy_env", "levers", "process"},
    "decisions": {"lifecycle"},
    "libraries": {"host", "model", "plan", "engines", "ladder", "selftest", "fleet", "reload", "serverless",
                  "cluster", "status", "router", "promptcache"},
    "shell": {"run"},
    "entry": {"__main__"},
}
LAYER_ORDER = list(SUPERVISOR_LAYERS)


def folder_of(name: str, pkg: str) -> str | None:
    parts = name.split(".")
    if parts[0] != pkg:
        return None
    return pkg if len(parts) == 1 else parts[1]


def folder_edges(pkg: str) -> dict[str, dict[str, list[str]]]:
    """{folder: {folder it imports: [module -> module, ...]}} for the top folders of one package."""
    edges: dict[str, dict[str, list[str]]] = {}
    for name, deps in GRAPH.items():
        a = folder_of(name, pkg)
        if a is None:
            continue
        for d in sorted(deps):
            b = folder_of(d, pkg)
            if b is not None and b != a:
                edges.setdefault(a, {}).setdefault(b, []).append(f"{name} -> {d}")
    return edges


def _edges_text(edges: dict[str, dict[str, list[str]]], within: set[str]) -> str:
    return "\n".join(f"  {a} -> {b}: {', '.join(via)}" for a in sorted(edges) for b, via in sorted(edges[a].items())
                     if a in within and b in within)


@pytest.mark.parametrize("pkg", ["supervisor", "images"])
def test_no_cycle_among_the_top_folders(pkg):
    edges = folder_edges(pkg)
    found = cycles({a: set(bs) for a, bs in edges.items()})
    assert found == [], "folders that import each other in a loop:\n" + "\n".join(
        _edges_text(edges, set(c)) for c in found)


def test_every_supervisor_folder_has_a_layer():
    top = {p.stem if p.is_file() else p.name for p in (ROOT / "supervisor").iterdir()
           if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists())}
    placed = set().union(*SUPERVISOR_LAYERS.values())
    assert top - placed == set(), "give it a layer in SUPERVISOR_LAYERS"
    assert placed - top - {"supervisor"} == set(), "a layer names a folder that is gone"


def test_supervisor_folders_import_only_their_layer_or_below():
    layer = {f: LAYER_ORDER.index(name) for name, fs in SUPERVISOR_LAYERS.items() for f in fs}
    up = {f"{a} ({LAYER_ORDER[layer[a]]}) -> {b} ({LAYER_ORDER[layer[b]]})": via
          for a, bs in folder_edges("supervisor").items() for b, via in bs.items()
          if a in layer and b in layer and layer[b] > layer[a]}
    assert up == {}


def test_the_decisions_do_no_io_and_start_no_thread():
    banned = {"threading", "subprocess", "socket", "os", "shutil", "requests", "urllib", "http"}
    bad = {}
    for f in sorted((ROOT / "supervisor" / "lifecycle").glob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for n in ast.walk(tree):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
                [n.module or ""] if isinstance(n, ast.ImportFrom) and not n.level else []
            hit = sorted(m for m in names if m.split(".")[0] in banned)
            if hit:
                bad.setdefault(f.name, []).extend(hit)
    assert bad == {}


def test_the_folder_check_itself_can_fail():
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert folder_of("supervisor.run.loop", "supervisor") == "run"
    assert folder_of("supervisor.config", "supervisor") == "config"


def test_the_loop_stays_a_loop():
    # Each effect's body lives in its own file of run/; the loop dispatches (issue 35: it grew 388 -> 594).
    lines = (ROOT / "supervisor" / "run" / "loop.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"run/loop.py has {lines} lines: move the work of an effect into its own file"


def test_the_architecture_docs_layer_map_is_the_one_this_test_holds():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert text.index("## The house: layers, then folders") < text.index("## Building an image")  # it opens the doc
    shown = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in SUPERVISOR_LAYERS and line.startswith("  "):
            shown[parts[0]] = {p.rstrip("/").removesuffix(".py") for p in parts[1:]}
    expected = {name: set(fs) - {"supervisor"} for name, fs in SUPERVISOR_LAYERS.items()}
    assert shown == expected


def test_one_free_port_helper_for_every_test():
    # kiln_dev.supervised.free_port never hands a port out twice; a helper of a test's own that binds
    # port 0 and returns the number after closing brings back the race it fixed (issue 35).
    bad = []
    for pkg in ("tests", "kiln_dev", "bench"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for fn in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if not isinstance(fn, ast.FunctionDef) or (f.name == "supervised.py" and fn.name == "free_port"):
                    continue
                src = ast.unparse(fn)
                binds_zero = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "bind"
                                 and c.args and isinstance(c.args[0], ast.Tuple) and ast.unparse(c.args[0].elts[-1]) == "0"
                                 for c in ast.walk(fn))
                returns_port = any(isinstance(r, ast.Return) and r.value is not None and "getsockname" in ast.unparse(r.value)
                                   for r in ast.walk(fn))
                if binds_zero and returns_port and "listen" not in src:
                    bad.append(f"{f.relative_to(ROOT)}:{fn.lineno} {fn.name}")
    assert bad == [], "use kiln_dev.supervised.free_port"
