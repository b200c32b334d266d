"""Where the user built a DataLoader: the first frame of their own code, the library frame beside it, and the
knob as they set it (the argument of their own call; the command-line option that argument comes from; for a
framework that builds the loader from its own settings, :data:`FRAMEWORKS`, that setting: the HF Trainer's
``dataloader_num_workers`` in ``TrainingArguments`` or ``--dataloader_num_workers``).

Frameworks build or re-build the loader inside themselves (timm's ``create_loader``, Lightning adding its
sampler, Accelerate's ``prepare``, the HF Trainer's ``get_train_dataloader``): a line inside an installed
package is one the user cannot change, so the loader is named by the user's frame that led to it.

Stdlib only: this module is loaded by file path in a watched process, beside ``hook.py``. The functions that
read text (:func:`call_argument`, :func:`option_for`) are pure.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
import sys
import sysconfig
from typing import NamedTuple

_PIPEPROF = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the pipeprof package


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(os.path.abspath(r) + os.sep for r in roots if r))


LIBRARY_ROOTS = _library_roots()


def is_library(file: str, roots: tuple[str, ...] = LIBRARY_ROOTS) -> bool:
    """True for a file the user does not write: installed packages (site-packages, dist-packages, the
    interpreter's sysconfig paths), the standard library, frozen modules, pipeprof itself."""
    if not file or file.startswith("<"):
        return True
    path = os.path.abspath(file)
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    if path.startswith(_PIPEPROF + os.sep):
        return True
    return any(path.startswith(r) for r in roots)


def user_frame(frame, skip=lambda f: False):
    """(user's frame, library frame beside it): walking out from ``frame``, the first frame whose file is not a
    library's (:func:`is_library`) nor one ``skip`` rejects; the library frame is the innermost frame outside
    ``skip`` (the line that called DataLoader), None where that is the user's own. (None, None) when no frame
    is the user's."""
    library = None
    while frame is not None:
        if not skip(frame):
            file = frame.f_code.co_filename
            if not is_library(file):
                return frame, library
            if library is None:
                library = frame
        frame = frame.f_back
    return None, library


class Framework(NamedTuple):
    """A framework that builds the DataLoader from its own settings: the class the user sets them in
    (``holder``), the attribute of the library frame's ``self`` that holds them (``attr``), and each DataLoader
    keyword's field there (``fields``)."""

    holder: str
    attr: str
    fields: dict


#: the library file a framework builds its DataLoader in (as its path ends) -> its settings. To add one: the file
#: whose frame is the library frame (:func:`user_frame`'s second) and the fields its DataLoader call reads.
FRAMEWORKS = {
    "transformers/trainer.py": Framework(  # Trainer._get_dataloader: DataLoader(dataset, **dataloader_params)
        "TrainingArguments",
        "args",
        {
            "num_workers": "dataloader_num_workers",
            "pin_memory": "dataloader_pin_memory",
            "persistent_workers": "dataloader_persistent_workers",
            "prefetch_factor": "dataloader_prefetch_factor",
            "in_order": "dataloader_in_order",
            "drop_last": "dataloader_drop_last",
        },
    ),
}


def framework(file: str | None) -> Framework | None:
    """The framework whose DataLoader is built in ``file`` (a path, or ``path:line``), or None."""
    path = re.sub(r":\d+$", "", file or "").replace(os.sep, "/")
    return next((f for k, f in FRAMEWORKS.items() if path.endswith("/" + k)), None)


def _tree(source: str):
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def call_argument(source: str, line: int, names: tuple[str, ...] = ("num_workers", "workers")):
    """(argument's expression as written, the call's first line, the keyword) for the call at ``line`` of
    ``source`` that passes one of ``names`` as a keyword: the innermost call spanning ``line`` that does (a call
    written over several lines counts on each of them). None where no such call spans the line or the source
    does not parse."""
    tree = _tree(source)
    best = None
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.Call) or not (node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        for kw in node.keywords:
            found = (ast.unparse(kw.value), kw.arg) if kw.arg in names else _splatted(tree, node, kw, names)
            if found is not None:
                span = (node.end_lineno or node.lineno) - node.lineno
                if best is None or span < best[0]:
                    best = (span, found[0], node.lineno, found[1])
    return None if best is None else best[1:]


def _splatted(tree, call: ast.Call, kw: ast.keyword, names: tuple[str, ...]):
    """(expression, keyword) where ``kw`` is ``**name`` and ``name`` was last assigned before the call a
    ``dict(num_workers=…)`` or ``{"num_workers": …}`` holding one of ``names`` (timm's train.py passes its loader
    arguments as ``**common_loader_kwargs``); None otherwise."""
    if kw.arg is not None or not isinstance(kw.value, ast.Name):
        return None
    found = None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and node.lineno < call.lineno):
            continue
        if not any(isinstance(t, ast.Name) and t.id == kw.value.id for t in node.targets):
            continue
        v = node.value
        pairs = []
        if isinstance(v, ast.Call) and _callee(v) == "dict":
            pairs = [(k.arg, k.value) for k in v.keywords if k.arg]
        elif isinstance(v, ast.Dict):
            pairs = [(k.value, x) for k, x in zip(v.keys, v.values) if isinstance(k, ast.Constant)]
        hit = next(((ast.unparse(x), k) for k, x in pairs if k in names), None)
        if hit is not None and (found is None or node.lineno > found[0]):
            found = (node.lineno, hit)
    return None if found is None else found[1]


def keyword_calls(source: str, holder: str, keyword: str) -> list[tuple[str | None, int, bool]]:
    """The calls of ``source`` that pass ``keyword`` or are calls of ``holder`` (``TrainingArguments(...)``), in
    line order: (the keyword's expression as written, or None where the call does not pass it; the call's first
    line; whether it is a call of ``holder``). Empty where the source does not parse."""
    tree = _tree(source)
    out = []
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Call):
            arg = next((ast.unparse(k.value) for k in node.keywords if k.arg == keyword), None)
            if arg is not None or _callee(node) == holder:
                out.append((arg, node.lineno, _callee(node) == holder))
    return sorted(out, key=lambda c: c[1])


def option_for(expression: str, parsers) -> dict | None:
    """The command-line option whose value ``expression`` reads (``args.workers`` -> the action of dest
    ``workers``), from argparse parsers: {"dest", "flags", "flag"}, where ``flag`` is the one to write (the
    short form where there is one, as ``-j``). None where the expression is not ``NAME.DEST`` or no parser has
    that dest."""
    head, dot, dest = expression.rpartition(".")
    if not dot or not dest.isidentifier() or not head.replace(".", "").isidentifier():
        return None
    return option_of(dest, parsers)


def option_of(dest: str, parsers) -> dict | None:
    """The command-line option of destination ``dest`` (``dataloader_num_workers``: HfArgumentParser's
    ``--dataloader_num_workers``), as :func:`option_for` gives it; None where no parser has it."""
    for parser in parsers:
        for action in getattr(parser, "_actions", ()):
            if action.dest == dest and action.option_strings:
                flags = list(action.option_strings)
                short = [f for f in flags if not f.startswith("--")]
                return {"dest": dest, "flags": "/".join(flags), "flag": (short or flags)[0]}
    return None


def _parsers(frame) -> list:
    """The argparse parsers the user's code can see: in the frame's globals and locals and its callers'."""
    argparse = sys.modules.get("argparse")
    if argparse is None:
        return []
    found, seen = [], set()
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            for value in list(scope.values()):
                if isinstance(value, argparse.ArgumentParser) and id(value) not in seen:
                    seen.add(id(value))
                    found.append(value)
        frame = frame.f_back
    if not found:  # a parser built in a function that has returned (timm's train.py keeps it global)
        import gc
        import warnings

        # the job's output stays its own: isinstance on a deprecated module attribute (torch's reduce_op) warns
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = [o for o in gc.get_objects() if type(o) is argparse.ArgumentParser or _parser(o, argparse)]
    return found


def _parser(o, argparse) -> bool:
    try:
        return isinstance(o, argparse.ArgumentParser)
    except Exception:  # an object whose __class__ lookup raises (a lazy proxy): not a parser
        return False


def describe(frame, library) -> dict:
    """What the run folder records of a loader's site, from the user's frame and the library frame beside it:
    ``path``/``line`` (the user's), ``library_site`` (file:line inside the library, or None), ``knob`` (the
    argument as the user wrote it, e.g. ``args.workers``, and the line its call starts on), ``option``
    (the command-line option, :func:`option_for`, with ``value`` as parsed)."""
    file, line = frame.f_code.co_filename, frame.f_lineno
    out = {
        "path": file,
        "line": line,
        "library_site": None if library is None else f"{library.f_code.co_filename}:{library.f_lineno}",
        "knob": None,
        "option": None,
    }
    source = "".join(linecache.getlines(file, frame.f_globals))
    known = framework(library.f_code.co_filename) if library is not None else None
    if known is not None:  # the framework built it from its own settings: the knob is that setting
        return out | framework_knob(known, source, frame, library)
    found = call_argument(source, line) if source else None
    if found is None:
        return out
    expression, start, keyword = found
    out["knob"] = {"expression": expression, "keyword": keyword, "call_line": start}
    option = option_for(expression, _parsers(frame))
    if option is not None:
        head = expression.rpartition(".")[0]
        namespace = frame.f_locals.get(head, frame.f_globals.get(head))
        option["value"] = getattr(namespace, option["dest"], None)
        out["option"] = option
    return out


def framework_knob(fw: Framework, source: str, frame, library) -> dict:
    """``knob`` and ``option`` (as :func:`describe` records them) of a loader a framework built from its settings;
    the value the framework holds is the library frame's ``self.<attr>`` (``Trainer.args``)."""
    keyword = fw.fields["num_workers"]
    parsers = _parsers(frame)
    found = knob_source(keyword_calls(source, fw.holder, keyword) if source else [], option_of(keyword, parsers))
    knob = found | {"keyword": keyword, "holder": fw.holder}
    option = option_for(knob["expression"], parsers) if knob["expression"] else option_of(keyword, parsers)
    if option is not None:
        option["value"] = getattr(getattr(library.f_locals.get("self"), fw.attr, None), keyword, None)
    return {"knob": knob, "option": option}


def knob_source(calls: list[tuple[str | None, int, bool]], option: dict | None) -> dict:
    """Where the user sets a framework's workers field (``dataloader_num_workers``), from their file's calls
    (:func:`keyword_calls`) and the command-line option of the field's name (HfArgumentParser's, or None):
    {"expression", "call_line"}. In this order: the class's own call that passes it (``TrainingArguments(...,
    dataloader_num_workers=args.workers)``); the command line, where a parser has the option (a call passing it
    elsewhere, ``parser.set_defaults``, is then only its default); another call passing it (a dict handed on);
    the class's call that leaves it at its default (the expression None)."""
    own = [(e, line) for e, line, mine in calls if mine and e is not None]
    passing = [(e, line) for e, line, mine in calls if e is not None]
    bare = [(e, line) for e, line, mine in calls if mine]
    if own:
        expression, line = own[0]
    elif option is not None:
        expression, line = None, None
    else:
        expression, line = (passing or bare or [(None, None)])[0]
    return {"expression": expression, "call_line": line}


def knob_words(loader: dict, current: int, pick: int) -> str | None:
    """The change in the user's terms: the command-line option where the count comes from one
    (``-j 4 -> -j 14``), else the argument of their own call, or the framework's field in the class that holds
    it (``dataloader_num_workers=2 -> dataloader_num_workers=4 in TrainingArguments(...)``); None where neither
    was read."""
    option, knob = loader.get("option"), loader.get("knob") or {}
    holder, keyword, was = knob.get("holder"), knob.get("keyword"), knob.get("expression")
    if option:
        sets = f"{keyword}={was}" if was else f"{keyword} of {holder}"
        return f"{option['flag']} {current} -> {option['flag']} {pick} (the option {option['flags']} sets {sets})"
    if holder:
        if was is None:
            return f"add {keyword}={pick} to {holder}(...) (now {current}, its default)"
        now = f"{keyword}={was}" + ("" if was == str(current) else f" (now {current})")
        return f"{now} -> {keyword}={pick} in {holder}(...)"
    if knob and was not in (None, str(current)):
        return f"{keyword}={was} (now {current}) -> {keyword}={pick}"
    return None


def knob_line(loader: dict) -> int | None:
    """The line of the user's file to change: their call that writes the framework's field where it is written
    elsewhere than the site (``TrainingArguments(...)`` beside ``trainer.train()``), else the site's."""
    knob = loader.get("knob") or {}
    if knob.get("holder") and knob.get("call_line") and not loader.get("option"):
        return knob["call_line"]
    return loader.get("line")


def knob_name(loader: dict, keyword: str = "num_workers") -> tuple[str, str]:
    """(the field the user writes for a DataLoader ``keyword``, the class they write it in): the framework's
    (``dataloader_persistent_workers``, ``TrainingArguments``) where one built the loader, else the keyword in
    ``DataLoader``."""
    known = framework(loader.get("library_site"))
    if known is not None and keyword in known.fields:
        return known.fields[keyword], known.holder
    return keyword, "DataLoader"


# the frames of a traceback as Python prints it (a DataLoader re-raises a worker's exception with its traceback
# as this text inside the message, after "Original Traceback (most recent call last):")
_TB_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$', re.M)
_ORIGINAL = "Original Traceback (most recent call last):"


def exception_facts(kind: str, message: str, frames: list[tuple[str, int]]) -> dict:
    """What the user reads of their own exception: its type, its message whole, and their innermost frame
    (``file:line``, never an installed package's or pipeprof's). ``frames``: the (file, line) of the traceback
    that reached the process, outermost first. Where the message carries a worker's traceback (the DataLoader
    re-raises a worker's exception in the main process), the worker's frames come after the main process's and
    the user's own message is the last line of that traceback."""
    own = message
    if _ORIGINAL in message:
        inner = message.split(_ORIGINAL, 1)[1]
        frames = frames + [(m["file"], int(m["line"])) for m in _TB_FRAME.finditer(inner)]
        last = [x for x in inner.strip().splitlines() if x.strip()]
        if last and not last[-1].startswith(" "):
            own = last[-1].split(": ", 1)[1] if last[-1].startswith(f"{kind}: ") else last[-1]
    mine = [f for f in frames if not is_library(f[0])]
    where = (mine or frames)[-1] if frames else None
    return {
        "type": kind,
        "message": own,
        "where": f"{where[0]}:{where[1]}" if where else None,
        "raised_at": f"{frames[-1][0]}:{frames[-1][1]}" if frames else None,
        "text": message if own != message else None,  # the whole text with the worker's traceback, kept
    }
