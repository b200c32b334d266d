"""Renderers: they format a stored Run; they never measure or analyse.

Modules: ``console`` (text and markdown), ``html`` (report.html), ``figures`` (matplotlib SVGs),
``summary`` (the answer's sentences from stored figures), ``comparison`` (``pipeprof compare``),
``doctor`` (``pipeprof doctor``), ``workstation`` (``pipeprof size``'s table and sentences), ``offload``
(``pipeprof size --offload``'s basis lines and table), ``trackers``
(a run written to TensorBoard, MLflow or W&B: ``pipeprof report RUN --to ...``).

May import: the nouns, ``results`` and ``analysis``' stored records; never ``measure`` or ``orchestrate``.

A renderer is ``render(run) -> str``. To add one, write it in a module here and add one entry
to :data:`RENDERERS` (``pipeprof report RUN --format NAME`` then offers it).
"""

from __future__ import annotations

import importlib

#: format name -> "module:function" of a ``render(run) -> str`` (imported when asked for)
RENDERERS = {
    "text": "pipeprof.report.console:render_text",
    "markdown": "pipeprof.report.console:render_markdown",
    "html": "pipeprof.report.html:render_html",
}


def render(run, fmt: str = "text") -> str:
    """The run formatted by the renderer named ``fmt``; ValueError names the formats there are."""
    if fmt not in RENDERERS:
        raise ValueError(f"unknown report format {fmt!r}; available: {', '.join(RENDERERS)}")
    module, _, name = RENDERERS[fmt].partition(":")
    return getattr(importlib.import_module(module), name)(run)
