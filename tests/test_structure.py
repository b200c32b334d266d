"""The shape of the code, checked: imports go one way along the data flow, no cycles, short functions.

The layers follow DESIGN's flow, folder by folder: the nouns (config, presets, models, env) → data/
(sources, decode, augment, dataset) → measure/ (loader, step, monitors, windows) → trials/ →
orchestrate/ (sweep, launcher) → analysis/ → results and the planners that read measured rows
(search, resume) → the runner → report/ → checks/ and the command line.
Shared records (the version, the schema, the preset and model registries, the machine snapshot,
the confounders) sit below all of them. A module may import its own layer and those below;
``importlib.import_module("pipeprof.x")`` of a constant name counts as an import of ``x``.
A new module must be placed here: the test fails on a module it does not know.
"""

import ast
import functools
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeprof"
LAYERS = {
    # the nouns every layer may use: versions, schema, registries of presets and models, the machine
    0: [
        "_version",
        "stats",
        "schema",
        "actions",
        "answer",
        "presets",
        "models",
        "env",
        "measure.confounders",
        "checks.calibrate",
    ],
    1: ["config"],
    # data/: where samples come from and how they become tensors
    2: [
        "data",
        "data.sources",
        "data.sources.base",
        "data.sources.files",
        "data.sources.memory",
        "data.sources.shards",
        "data.sources.throttled",
        "data.sources.url",
        "data.decode",
        "data.synthetic",
        "data.cache",
        "data.check",
        "data.user_samples",
        "data.gpu_decode",
        "data.gpu_kernels",
    ],
    3: ["data.augment", "data.gpu_augment"],
    4: [
        "data.dataset",
        "data.prepare",
        "data.encoded",
        "data.user_pipeline",
        "data.user_gpu_pipeline",
        "data.user_actions",
        "data.ray_engine",
    ],
    # measure/: the instruments
    5: ["measure", "measure.windows", "measure.loader"],
    6: ["measure.step"],
    7: ["measure.monitors", "measure.noise", "measure.reference", "measure.decoders"],
    # trials/: one steady-state measurement each
    9: [
        "trials.spec",
        "trials.columns",
        "trials.device_side",
        "trials.skeleton",
        "trials.kinds",
        "trials",
        "trials.watchdog",
        "trials.action_trial",
        "trials.variants",
        "trials.heap",
        "trials.ray_trials",
    ],
    # orchestrate/ (running trials) below analysis/ (reading rows), then the planners that read rows
    10: ["orchestrate", "orchestrate.distributed", "orchestrate.sweep", "orchestrate.batchsize", "orchestrate.limits"],
    11: [
        "analysis.bounds",
        "analysis.advice",
        "analysis.storage",
        "analysis.verdict",
        "analysis.scaling",
        "analysis.confidence",
        "analysis.failures",
        "analysis.compare",
        "analysis.guard",
        "analysis.workstation",
        "analysis.gains",
        "analysis.offload",
        "analysis",
    ],
    12: ["results", "orchestrate.search", "orchestrate.resume", "orchestrate.action_trials"],
    13: ["orchestrate.runner", "orchestrate.merge"],
    # report/: renderers only
    14: [
        "report",
        "report.summary",
        "report.console",
        "report.doctor",
        "report.figures",
        "report.html",
        "report.comparison",
        "report.trackers",
        "report.workstation",
        "report.offload",
    ],
    # watch/: observing a user's own command (hook and channel run inside it and import nothing of pipeprof)
    14.5: [
        "watch",
        "watch.boot.sitecustomize",
        "watch.channel",
        "watch.hook",
        "watch.sites",
        "watch.pause",
        "watch.pause_actions",
        "watch.records",
        "watch.procs",
        "watch.tune",
        "watch.framework_snippets",
        "watch.answer",
        "watch.folder",
        "watch.live",
        "watch.page",
        "watch.session",
    ],
    # checks/ and the command line
    15: [
        "checks",
        "checks.sizing",
        "checks.validate",
        "checks.bench",
        "checks.watch_overhead",
        "checks.action_known",
        "checks.regress",
        "checks.offload_check",
        "cli_args",
        "cli_checks",
        "cli",
        "",
        "__main__",
    ],
}
# The role folders, each of whose __init__ says what lives there and what it may import.
# checks.calibrate (workloads of known cost, named by import path in configs) and measure.confounders
# (the thread policy the step and the workers share) sit with the shared records at layer 0.
FOLDERS = ["data", "measure", "trials", "orchestrate", "analysis", "report", "checks", "watch"]
LAYER = {m: n for n, mods in LAYERS.items() for m in mods}


@functools.cache  # parsed once for the whole module: the tests only read the trees
def modules() -> dict[str, ast.Module]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(f.read_text())
    return out


def _import_module_names(tree: ast.Module) -> set[str]:
    """The names ``importlib.import_module`` goes by in the module: ``importlib.import_module`` (and an alias of
    importlib's), and ``import_module`` itself where it is imported from importlib."""
    names = {"importlib.import_module"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {f"{a.asname}.import_module" for a in node.names if a.name == "importlib" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "importlib" and not node.level:
            names |= {a.asname or a.name for a in node.names if a.name == "import_module"}
    return names


def _imported_by_call(node: ast.AST, callers: set[str]) -> str | None:
    """The module a call ``importlib.import_module("pipeprof.x")`` imports (a string constant naming a pipeprof
    module), as a name of LAYER; None for any other node (a computed name cannot be read)."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    target = node.args[0].value
    if not (isinstance(target, str) and target.split(".")[0] == "pipeprof" and ast.unparse(node.func) in callers):
        return None
    return target.removeprefix("pipeprof").lstrip(".")


def imports(name: str, tree: ast.Module, is_package: bool) -> set[str]:
    """pipeprof modules imported anywhere in the module (function-level imports included), by an import
    statement or by ``importlib.import_module`` of a constant name."""
    pkg = name.split(".") if is_package else name.split(".")[:-1]
    found, callers = set(), _import_module_names(tree)
    for node in ast.walk(tree):
        called = _imported_by_call(node, callers)
        if called is not None:
            found.add(called)
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = pkg[: len(pkg) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            targets = [".".join(base)] if node.module else [".".join(base + [a.name]) for a in node.names]
            found.update(targets)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pipeprof":
            base = node.module.removeprefix("pipeprof").lstrip(".")
            subs = [f"{base}.{a.name}".lstrip(".") for a in node.names]  # from pipeprof.x import module
            found.update([s for s in subs if s in LAYER] or [base])
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("pipeprof").lstrip(".") for a in node.names if a.name.split(".")[0] == "pipeprof"
            )
    return {t for t in found if t in LAYER or t == ""}


def graph() -> dict[str, set[str]]:
    trees = modules()
    packages = {
        str(p.relative_to(PACKAGE).parent).replace("/", ".").replace(".", "", 0) for p in PACKAGE.rglob("__init__.py")
    }
    return {name: imports(name, tree, (name or ".") in packages or name == "") - {name} for name, tree in trees.items()}


def test_every_module_has_a_layer():
    assert sorted(set(modules()) - set(LAYER)) == []


def test_every_folder_says_what_lives_there():
    """Each role folder's __init__ has a docstring naming its modules and what it may import."""
    missing = []
    for folder in FOLDERS:
        doc = ast.get_docstring(modules()[folder]) or ""
        names = {p.stem for p in (PACKAGE / folder).glob("*.py") if p.stem != "__init__"}
        names |= {p.name for p in (PACKAGE / folder).iterdir() if (p / "__init__.py").exists()}
        missing += [f"{folder}: {n}" for n in sorted(names) if f"``{n}" not in doc]
        missing += [f"{folder}: no 'May import'"] * ("May import" not in doc)
    assert missing == []


def test_the_wheel_lists_every_package():
    """pyproject.toml names the wheel's packages (a find directive cannot map the top-level augmentations/ into
    it): every folder of pipeprof/ that holds Python files, and the presets."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    setup = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {".".join(("pipeprof", *f.parent.relative_to(PACKAGE).parts)) for f in PACKAGE.rglob("*.py")}
    assert sorted(setup["packages"]) == sorted(tree | {"pipeprof.augmentations"})
    assert setup["package-dir"] == {"pipeprof.augmentations": "augmentations"}


def test_readme_map_matches_the_tree():
    """The README's map names every role folder that exists, and no folder that does not."""
    readme = (PACKAGE.parent / "README.md").read_text()
    tree = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    mapped = set(re.findall(r"^  (\w+)/ ", readme, flags=re.M))
    assert tree == mapped


def test_imports_never_go_up_a_layer():
    up = [
        f"{m} (layer {LAYER[m]}) imports {d} (layer {LAYER[d]})"
        for m, deps in graph().items()
        for d in deps
        if LAYER[d] > LAYER[m]
    ]
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


MAX_STATEMENTS = 40  # statements in one function, nested ones included
MAX_LINES = 75  # lines as the formatter lays them out (each argument of a long call on a line of its own)


def statements(fn: ast.AST) -> int:
    """A function's statements, nested included (not the def itself): what it does, however it is laid out."""
    return sum(isinstance(n, ast.stmt) for n in ast.walk(fn)) - 1


def test_functions_are_short():
    """Short by what they do (statements), not only by lines: ``ruff format`` puts each argument of a long call
    on a line of its own, so a line count measures the formatter as much as the function."""
    long = [
        (f"{f.relative_to(PACKAGE)}:{n.lineno} {n.name}", statements(n), n.end_lineno - n.lineno + 1)
        for f in PACKAGE.rglob("*.py")
        for n in ast.walk(ast.parse(f.read_text()))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (statements(n) >= MAX_STATEMENTS or n.end_lineno - n.lineno + 1 >= MAX_LINES)
    ]
    assert long == []
