"""The host side of a sandbox's one way out: a Unix socket relayed to one TCP endpoint.

A bubblewrap sandbox has no network but its own loopback (`workbench.sandbox.session`). Whatever it may
reach (the capture proxy's agent routes) it reaches through a Unix socket in the sandbox folder,
bind-mounted into it; `_init` forwards the harness's TCP connections to it, and this relay
carries each connection on to the endpoint's host and port. So from inside a sandbox:

- the engine, the proxy's control traffic (the admin key) and every other port of the host are not
  reachable, and the loopback it can sniff carries only its own traffic;
- at most `max_connections` connections at a time: a sandbox holding slow connections open starves
  only itself, never the other rollouts (a 1-byte-per-10-s client used to hold the proxy's sockets);
- only the sandbox's forwarder (`_init`, which relays the harness's connections and no
  other process's) is relayed. The first process to connect is pinned by its pid (``SO_PEERCRED``,
  as the host sees it) and start time: the forwarder, whose control connection comes before the
  command it runs starts (answered with `ACK`). A connection from any other process, e.g. the agent
  connecting to the socket itself, is closed unforwarded and counted (`Relay.foreign`), as are the
  connections the forwarder refused inside (one `REFUSED` byte each on its control connection:
  `Relay.reported`). So one command per sandbox reaches the endpoint: the first one started.

One asyncio loop in a daemon thread serves every relay of the process.

    relay = open_relay(Path("/tmp/wb-sbx-.../sock/proxy"), "127.0.0.1", 8100)
    ...                                   # the sandbox connects to that path
    relay.close()                         # stops listening, cuts open connections, removes the socket
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Relay", "open_relay", "ACK", "REFUSED"]

ACK = b"K"  # to the forwarder, on its control connection: pinned (`_init` spells both alike)
REFUSED = b"R"  # from the forwarder: one connection refused inside, not the harness's

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or not _loop.is_running():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, daemon=True, name="sandbox-relay").start()
            ready.wait()
            _loop = loop
        return _loop


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


@dataclass
class Relay:
    """One sandbox's socket and its live connections."""

    path: Path
    host: str
    port: int
    max_connections: int
    refused: int = 0  # connections refused over the cap
    served: int = 0
    foreign: int = 0  # connections from a process other than the forwarder, refused
    reported: int = 0  # connections the forwarder refused inside (not from the harness's process)
    _forwarder: tuple[int, str] | None = None  # (host pid, start time) of the first process to connect
    _server: asyncio.AbstractServer | None = None
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _control: asyncio.Task | None = None

    @property
    def refused_model_connections(self) -> int:
        """Connections to the endpoint from a process other than the harness's, refused (both counts)."""
        return self.foreign + self.reported

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()  # the server runs each handler as a task
        peer = _peer(writer)
        if self._forwarder is None and peer is not None and task is not None:
            self._forwarder, self._control = peer, task
            await self._serve_control(reader, writer)
            return
        if peer is None or peer != self._forwarder:
            self.foreign += 1
            writer.close()
            return
        if task is None or len(self._tasks) >= self.max_connections:
            self.refused += 1
            writer.close()
            return
        self._tasks.add(task)
        self.served += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            sock = up_writer.get_extra_info("socket")
            if sock is not None:  # relay each piece at once (Nagle would hold small writes up to 40 ms)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            self._tasks.discard(task)
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._tasks.discard(task)
            for w in (writer, up_writer):
                w.close()

    async def _serve_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(ACK)
            await writer.drain()
            while data := await reader.read(4096):
                self.reported += data.count(REFUSED)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        """Stop listening, cut the open connections, remove the socket. Safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            loop = _event_loop()

            async def shut() -> None:
                server.close()
                for t in [*self._tasks, *([self._control] if self._control is not None else [])]:
                    t.cancel()

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shut(), loop).result(5)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _peer(writer: asyncio.StreamWriter) -> tuple[int, str] | None:
    """The connecting process as (pid, start time): ``SO_PEERCRED`` gives its pid in our pid namespace,
    /proc/PID/stat's field 22 tells it from a later process given the same pid. None when it is gone."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        with open(f"/proc/{pid}/stat") as f:
            return pid, f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, struct.error):
        return None


def open_relay(path: Path, host: str, port: int, *, max_connections: int = 16) -> Relay:
    """Listen on the Unix socket `path` (mode 0666: the sandbox's uid connects) and relay each
    connection to ``host:port``."""
    relay = Relay(path, host, port, max_connections)
    loop = _event_loop()

    async def start() -> asyncio.AbstractServer:
        server = await asyncio.start_unix_server(relay._handle, path=str(path))
        os.chmod(path, 0o666)
        return server

    relay._server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    return relay
