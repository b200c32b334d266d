"""The shape of the code, checked: imports go one way along the data flow, no cycles, short functions.

The layers follow DESIGN's flow: config → data (sources, decode) → augment → dataset → loader →
step → monitors → measure → trials → sweep → analysis → results (and the adaptive search, which
reads measured rows to plan the next trial) → runner → report → commands.
Shared records (the version, the schema, the preset and model registries, the machine snapshot,
the confounders) sit below all of them. A module may import its own layer and those below.
A new module must be placed here: the test fails on a module it does not know.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeprof"
LAYERS = {
    0: ["_version", "schema", "presets", "models", "confounders", "env", "calibrate"],
    1: ["config"],
    2: ["data", "data.sources", "data.sources.base", "data.sources.files", "data.sources.memory",
        "data.sources.shards", "data.sources.throttled", "data.sources.url", "data.decode", "data.synthetic",
        "data.cache", "data.check"],
    3: ["augment"],
    4: ["data.dataset", "data.prepare"],
    5: ["loader"],
    6: ["step"],
    7: ["monitors", "noise", "reference"],
    8: ["measure"],
    9: ["trials.spec", "trials.columns", "trials.skeleton", "trials.kinds", "trials", "trials.watchdog"],
    10: ["distributed", "sweep", "batchsize"],
    11: ["analysis.bounds", "analysis.advice", "analysis.storage", "analysis.verdict", "analysis.scaling", "analysis"],
    12: ["results", "search", "compare", "resume"],
    13: ["runner", "merge"],
    14: ["report", "report.summary", "report.console", "report.doctor", "report.figures", "report.html",
         "report.comparison"],
    15: ["sizing", "validate", "bench", "cli", "", "__main__"],
}
LAYER = {m: n for n, mods in LAYERS.items() for m in mods}


def modules() -> dict[str, ast.Module]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(f.read_text())
    return out


def imports(name: str, tree: ast.Module, is_package: bool) -> set[str]:
    """pipeprof modules imported anywhere in the module (function-level imports included)."""
    pkg = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg[:len(pkg) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            targets = [".".join(base)] if node.module else [".".join(base + [a.name]) for a in node.names]
            found.update(targets)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeprof"):
            found.add(node.module.removeprefix("pipeprof").lstrip("."))
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("pipeprof").lstrip(".") for a in node.names
                         if a.name.split(".")[0] == "pipeprof")
    return {t for t in found if t in LAYER or t == ""}


def graph() -> dict[str, set[str]]:
    trees = modules()
    packages = {str(p.relative_to(PACKAGE).parent).replace("/", ".").replace(".", "", 0)
                for p in PACKAGE.rglob("__init__.py")}
    return {name: imports(name, tree, (name or ".") in packages or name == "") - {name}
            for name, tree in trees.items()}


def test_every_module_has_a_layer():
    assert sorted(set(modules()) - set(LAYER)) == []


def test_imports_never_go_up_a_layer():
    up = [f"{m} (layer {LAYER[m]}) imports {d} (layer {LAYER[d]})"
          for m, deps in graph().items() for d in deps if LAYER[d] > LAYER[m]]
    assert up == []


def test_no_import_cycle():
    g, state, cycles = graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for dep in g.get(node, ()):
            if state.get(dep) == "open":
                cycles.append(path + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for node in g:
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_functions_are_short():
    long = [(f"{f.relative_to(PACKAGE)}:{n.lineno} {n.name}", n.end_lineno - n.lineno + 1)
            for f in PACKAGE.rglob("*.py") for n in ast.walk(ast.parse(f.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 >= 45]
    assert long == []
