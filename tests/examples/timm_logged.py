"""timm's train.py, unchanged, with its log lines stamped by the wall clock (``time.time()``, the monitor's clock).

    python timm_logged.py PATH/TO/train.py ARGS...

Only the format of the log changes: timm's ``setup_default_logging`` runs as before, then every handler it set
writes ``<epoch seconds> <message>``. train.py runs as ``__main__`` from its own file (runpy), so the watch's
site is train.py's own line and its argparse options are the script's. The stamps let a window of the watch be
compared with the log's own rate over the same seconds (tests/examples/timm_gpu_plan.sh)."""

import logging
import runpy
import sys

import timm.utils

_setup = timm.utils.setup_default_logging


def _stamped(*args, **kwargs):
    _setup(*args, **kwargs)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter("%(created).3f %(message)s"))


timm.utils.setup_default_logging = _stamped

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
