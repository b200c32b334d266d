"""Objects read over the network through fsspec: ``http(s)://``, ``s3://`` (with s3fs), ...

Training from an object store or a web server is a common way to be I/O-bound
without ever touching a local disk: each sample is a request whose latency,
not bandwidth, usually sets the pace. This source makes one request per sample
so the profiler sees exactly that.

The list of objects comes from an index (``relative/path label [size]`` per
line, paths relative to ``base_url``); :func:`write_index` makes one for an
ImageFolder tree so ``python -m http.server`` over that folder serves a dataset.
Every request has a timeout and a bounded number of retries: a dead server
must end a trial with a :class:`SourceError`, never hang it.
"""

from __future__ import annotations

import errno
import os
import time
import weakref
from pathlib import Path
from urllib.parse import quote

from .base import Source, SourceError, file_kind, parse_index  # noqa: F401 - parse_index re-exported
from .files import scan_image_folder

INDEX_NAME = "index.txt"
RETRY_BACKOFF_S = 0.1  # first pause between attempts; doubles each retry

# Filesystems this module created. A forked worker inherits them (and any not yet
# garbage-collected), but their client sessions belong to the parent's event-loop
# thread, which does not exist in the child: finalizing one there blocks in
# fsspec's close_session (it waits on the dead loop), and closing its sockets would
# unregister them from the epoll instance the parent shares. So a child keeps them
# alive, untouched, until it exits (DataLoader workers leave via os._exit).
# Keyed by id: filesystems compare equal when made with equal arguments, so a set would keep one.
_CREATED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_INHERITED: list = []


def _keep_inherited() -> None:
    _INHERITED.extend(_CREATED.values())
    _CREATED.clear()


os.register_at_fork(after_in_child=_keep_inherited)


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def _fs_kwargs(protocol: str, timeout_s: float) -> dict:
    """Per-protocol options that put a time limit on every request."""
    if protocol in ("http", "https"):
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=timeout_s)}}
    if protocol in ("s3", "s3a"):
        # botocore's own retries would multiply ours; we retry ourselves
        return {
            "config_kwargs": {"connect_timeout": timeout_s, "read_timeout": timeout_s, "retries": {"max_attempts": 1}}
        }
    return {}


def _status(exc: BaseException) -> int | None:
    """HTTP status carried by an aiohttp/fsspec error, if any."""
    if isinstance(exc, FileNotFoundError):
        return 404
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return status if isinstance(status, int) else None


def _refused(exc: BaseException) -> bool:
    while exc is not None:
        os_error = getattr(exc, "os_error", None)  # aiohttp.ClientConnectorError wraps the OSError
        if isinstance(exc, ConnectionRefusedError) or getattr(os_error, "errno", None) == errno.ECONNREFUSED:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _retryable(exc: BaseException) -> bool:
    """Transient failures only: a missing object or a denied request will not improve."""
    status = _status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return not isinstance(exc, (PermissionError, ImportError, ValueError))


def _explain(exc: BaseException, timeout_s: float) -> str:
    status = _status(exc)
    if status == 404:
        return "not found (HTTP 404)"
    if status is not None:
        return f"HTTP {status}"
    if _refused(exc):
        return "connection refused"
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError since 3.11
        return f"timed out after {timeout_s:g} s"
    return f"{type(exc).__name__}: {exc}"


class UrlSource(Source):
    kind = "url"

    def __init__(self, base_url: str, index=None, timeout_s: float = 10.0, retries: int = 2):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got timeout_s={timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got retries={retries}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.retries = float(timeout_s), int(retries)
        self._pid, self._fs_cache = None, {}
        entries = self._load_index(index)
        self.urls = [self._join(path) for path, _, _ in entries]
        self.labels = [label for _, label, _ in entries]
        self._sizes = [size for _, _, size in entries]

    # -- per-process filesystem objects ------------------------------------

    def __getstate__(self):
        # an fsspec filesystem holds a client session bound to this process's event loop
        return {**self.__dict__, "_pid": None, "_fs_cache": {}}

    def _fs(self, url: str):
        if self._pid != os.getpid():  # new (forked) process: sessions are not shareable
            self._pid, self._fs_cache = os.getpid(), {}
        protocol = _protocol(url)
        if protocol not in self._fs_cache:
            import fsspec

            try:
                fs = fsspec.filesystem(protocol, skip_instance_cache=True, **_fs_kwargs(protocol, self.timeout_s))
            except ImportError as exc:
                raise SourceError(f"{protocol}:// needs an extra package ({url}): {exc}") from exc
            _CREATED[id(fs)] = fs
            self._fs_cache[protocol] = fs
        return self._fs_cache[protocol]

    def _call(self, what: str, url: str):
        """``fs.<what>(url)`` with bounded retries; any failure becomes a SourceError naming the URL."""
        why = file_kind(url.split("://", 1)[-1]) if _protocol(url) == "file" else None
        if why is not None:  # a local path that is not a regular file: opening a FIFO would wait forever
            raise SourceError(f"cannot {'read' if what == 'cat_file' else what} {url}: {why}")
        for attempt in range(self.retries + 1):
            try:
                return getattr(self._fs(url), what)(url)
            except SourceError:
                raise
            except Exception as exc:  # noqa: BLE001 - client libraries raise many types
                if attempt == self.retries or not _retryable(exc):
                    raise SourceError(
                        f"cannot {'read' if what == 'cat_file' else what} {url}: {_explain(exc, self.timeout_s)}"
                    ) from exc
                time.sleep(RETRY_BACKOFF_S * 2**attempt)

    # -- index ---------------------------------------------------------------

    def _join(self, path: str) -> str:
        return path if "://" in path else f"{self.base_url}/{path.lstrip('/')}"

    def _load_index(self, index) -> list[tuple[str, int, int | None]]:
        if index is None:
            index = INDEX_NAME
        if isinstance(index, (str, os.PathLike)):
            url = self._join(str(index))
            return parse_index(self._call("cat_file", url).decode("utf-8"), url)
        entries = [(str(e[0]), int(e[1]), int(e[2]) if len(e) > 2 else None) for e in index]
        if not entries:
            raise SourceError(f"empty index for {self.base_url}")
        return entries

    # -- Source interface ----------------------------------------------------

    def __len__(self) -> int:
        return len(self.urls)

    def read(self, index: int) -> bytes:
        return self._call("cat_file", self.urls[index])

    def where(self, index: int) -> str:
        return self.urls[index]

    def label(self, index: int) -> int:
        return self.labels[index]

    def nbytes(self, index: int) -> int:
        """From the index's size column; else one metadata request (HEAD), remembered."""
        if self._sizes[index] is None:
            self._sizes[index] = int(self._call("size", self.urls[index]))
        return self._sizes[index]

    def describe(self) -> dict:
        return {**super().describe(), "location": self.base_url, "timeout_s": self.timeout_s, "retries": self.retries}


def write_index(folder: str | os.PathLike) -> Path:
    """Write ``folder/index.txt`` (``relative/path label size``, paths URL-quoted) for an ImageFolder tree."""
    root = Path(folder)
    paths, labels, _ = scan_image_folder(root)
    lines = [
        f"{quote(Path(p).relative_to(root).as_posix())} {label} {os.path.getsize(p)}" for p, label in zip(paths, labels)
    ]
    out = root / INDEX_NAME
    out.write_text("\n".join(lines) + "\n")
    return out
