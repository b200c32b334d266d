"""Sources deliver a sample's encoded bytes and its label.

Each kind is one module with one ``Source`` subclass; ``REGISTRY`` maps the
config's ``source`` name to ``"module:Class"`` so heavy client libraries are
imported only when used. To add a source: write ``sources/NAME.py`` with a
``Source`` subclass and add it here.
"""

from __future__ import annotations

import importlib

from .base import Source, SourceError

REGISTRY: dict[str, str] = {
    "files": "files:FileSource",
    "memory": "memory:MemorySource",
    "shards": "shards:ShardSource",
    "url": "url:UrlSource",
    "throttled": "throttled:ThrottledSource",
}


def source_class(kind: str) -> type[Source]:
    if kind not in REGISTRY:
        raise ValueError(f"unknown source {kind!r}; allowed: {', '.join(REGISTRY)}")
    module, _, cls = REGISTRY[kind].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


__all__ = ["REGISTRY", "Source", "SourceError", "source_class"]
