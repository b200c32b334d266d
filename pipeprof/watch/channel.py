"""The channel between the watched processes and ``pipeprof watch``: JSON lines over a Unix socket.

Each watched process that builds or iterates a DataLoader connects once, at its first record, and
sends one JSON object per line, buffered and flushed about four times a second from the loop's step
boundary (one ``sendall`` per flush, not one per batch). The parent answers on the same connection
with commands (``tune``, ``measure``, ``resume``, ``off``); the child reads them only at a step
boundary, without blocking, except while it is paused for ``--tune``.

Stdlib only: :class:`Client` runs inside every watched process, loaded by file path before (and
without) pipeprof's package, which imports torch. A process forked from a connected one (a
DataLoader worker) never writes on its parent's connection: the client checks its pid.
"""

from __future__ import annotations

import json
import os
import queue
import selectors
import socket
import threading
from typing import Optional

ENV_SOCKET = "PIPEPROF_WATCH_SOCKET"  # where the parent listens; unset: the process is not watched
ENV_ROOT = "PIPEPROF_WATCH_ROOT"  # pipeprof's source root, for the pause's imports in the child


def encode(obj: dict) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def split_lines(buffer: bytes) -> tuple[list[dict], bytes]:
    """The whole JSON lines in ``buffer`` and the unfinished rest; a line that does not parse is dropped."""
    *lines, rest = buffer.split(b"\n")
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out, rest


class Client:
    """A watched process's end: buffered sends, commands read at step boundaries."""

    def __init__(self, path: str):
        self.path, self.pid = path, os.getpid()
        self.sock: Optional[socket.socket] = None
        self.dead = False
        self.buffer: list[bytes] = []
        self.inbox = b""

    def send(self, obj: dict) -> None:
        self.buffer.append(encode(obj))

    def flush(self) -> None:
        if not self.buffer or not self._ready():
            return
        data, self.buffer = b"".join(self.buffer), []
        try:
            self.sock.sendall(data)
        except OSError:  # the parent is gone: the job runs on unwatched
            self.dead = True

    def commands(self, wait_s: float = 0.0) -> list[dict]:
        """Commands the parent sent; ``wait_s`` > 0 blocks up to that long for the first one."""
        if not self._ready():
            return []
        try:
            self.sock.settimeout(wait_s if wait_s > 0 else None)
            chunk = self.sock.recv(65536) if wait_s > 0 else self.sock.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, socket.timeout):
            return []
        except OSError:
            self.dead = True
            return []
        finally:
            if self.sock is not None:
                self.sock.settimeout(None)
        if not chunk:  # the parent closed the connection
            self.dead = True
            return []
        found, self.inbox = split_lines(self.inbox + chunk)
        return found

    def _ready(self) -> bool:
        if os.getpid() != self.pid:  # a forked child (a DataLoader worker): not our connection
            self.dead, self.buffer = True, []
        if self.dead:
            return False
        if self.sock is None:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(self.path)
            except OSError:
                self.dead = True
                return False
        return True


class Server:
    """The parent's end: one thread accepts connections and queues ``(connection id, message)``."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, "watch.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(128)
        self.inbox: "queue.SimpleQueue[tuple[int, dict]]" = queue.SimpleQueue()
        self.conns: dict[int, socket.socket] = {}
        self._buffers: dict[int, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipeprof-watch-channel", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ, None)
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.1):
                if key.data is None:
                    conn, _ = self.listener.accept()
                    cid = len(self.conns) + 1
                    self.conns[cid], self._buffers[cid] = conn, b""
                    sel.register(conn, selectors.EVENT_READ, cid)
                else:
                    self._read(sel, key.fileobj, key.data)
        sel.close()

    def _read(self, sel, conn: socket.socket, cid: int) -> None:
        try:
            chunk = conn.recv(1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            sel.unregister(conn)
            self.inbox.put((cid, {"k": "closed"}))
            return
        found, self._buffers[cid] = split_lines(self._buffers[cid] + chunk)
        for msg in found:
            self.inbox.put((cid, msg))

    def send(self, cid: int, obj: dict) -> bool:
        try:
            self.conns[cid].sendall(encode(obj))
            return True
        except (OSError, KeyError):
            return False

    def drain(self) -> list[tuple[int, dict]]:
        out = []
        while True:
            try:
                out.append(self.inbox.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for conn in list(self.conns.values()) + [self.listener]:
            conn.close()
