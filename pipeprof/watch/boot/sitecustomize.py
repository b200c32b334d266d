"""pipeprof watch's bootstrap, imported by every Python process of the watched job.

``pipeprof watch`` puts this folder first on ``PYTHONPATH``, so Python's ``site`` imports this module
as ``sitecustomize`` at start-up (as ``opentelemetry-instrument`` and ``ddtrace-run`` do). It loads
the hook by file path (not through pipeprof's package, which imports torch) and installs it when the
watch's socket is in the environment; then it runs the ``sitecustomize`` the environment had before
(the next one on ``sys.path``), so a job that ships its own keeps it. This folder holds nothing else:
whatever is here can be imported by the user's code.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _install_hook(here: str) -> None:
    if not os.environ.get("PIPEPROF_WATCH_SOCKET"):
        return
    watch = os.path.dirname(here)
    try:
        _load("_pipeprof_watch_channel", os.path.join(watch, "channel.py"))
        _load("_pipeprof_watch_hook", os.path.join(watch, "hook.py")).install()
    except Exception as exc:  # never stop the user's program: it runs unwatched, and says why once
        sys.stderr.write(f"pipeprof watch: hook not installed in pid {os.getpid()}: {type(exc).__name__}: {exc}\n")


def _chain(here: str) -> None:
    """Run the next ``sitecustomize`` on sys.path after this folder, as Python would have without us.
    Its errors propagate to ``site``, which reports them as it always does."""
    entries = [os.path.abspath(p or os.getcwd()) for p in sys.path]
    rest = sys.path[entries.index(here) + 1 :] if here in entries else list(sys.path)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.origin is None or os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_pipeprof_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


_HERE = os.path.dirname(os.path.abspath(__file__))
_install_hook(_HERE)
_chain(_HERE)
