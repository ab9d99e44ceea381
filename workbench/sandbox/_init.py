"""The first process of a bubblewrap sandbox: opens the sandbox's one way out, then runs the command.

The sandbox has a network namespace of its own (loopback only), so the agent cannot reach the engine,
the proxy's control plane or anything else on the host; the one endpoint it may reach (the capture
proxy) is a Unix socket bind-mounted into it. Harnesses speak HTTP over TCP, so this process listens
on ``127.0.0.1:PORT`` inside the namespace and forwards every connection to that socket (where the
workbench's relay, `workbench.sandbox.net`, carries it to the proxy). Then it runs the command and
exits with its status (a signal death is re-raised, so bwrap reports 128 + N as without us).

    python -I -S _init.py PORT SOCKET -- ARGV...     (bwrap runs this; standard library only)

Only the harness's own process reaches the endpoint. The agent's shell inherits the harness's
environment (opencode's config, with the rollout's key, is in it), and a call it made itself would be
recorded and trained as the harness's. So:

- the first process to connect is pinned (its /proc/PID, held open): the harness, since nothing the
  agent runs exists before the harness's first model call has been answered. A later connection is
  forwarded only when its socket is among that process's open files: the kernel names the client's
  end by its address (sock_diag), and its ``socket:[INODE]`` is looked for in ``/proc/PID/fd``. Any
  other connection is closed unforwarded, and reported to the relay;
- the relay, in turn, relays only this process's connections (its first, the control connection
  opened before the command starts, pins it: `net`), so connecting to the socket directly
  gets the agent nothing either;
- this process makes itself non-dumpable first, so the agent (same uid, no capability) can neither
  ptrace it nor open its ``/proc/PID/fd`` to borrow its connections.

It runs as the sandbox's uid, like the agent: an agent that kills it only cuts itself off.
"""

import ctypes
import os
import signal
import socket
import struct
import subprocess
import sys
import threading

_PR_SET_DUMPABLE = 4
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST = 4, 20, 1
ACK = b"K"  # the relay's answer on the control connection: this process is the sandbox's forwarder
REFUSED = b"R"  # one byte per refused connection, on the control connection


def _undumpable() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _client_inode(nl: socket.socket, client: tuple[str, int], server: tuple[str, int]) -> int:
    """The inode of the client's end of the TCP connection client -> server, 0 when none is found (an IPv6
    socket, one closed meanwhile): such a connection is refused. The kernel's sock_diag (`nl`) is asked for
    exactly that connection: one request, whatever the number of sockets in the namespace (reading
    /proc/net/tcp with 1,000 sockets took 23 ms on the loaded 2-core host, and the agent can open that many)."""
    ids = struct.pack("!HH4s12x4s12x", client[1], server[1], socket.inet_aton(client[0]), socket.inet_aton(server[0]))
    req = struct.pack("=BBBxI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + ids
    req += struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)  # any interface, no cookie
    head = struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    try:
        nl.send(head + req)
        answer = nl.recv(8192)
        if struct.unpack_from("=H", answer, 4)[0] != _SOCK_DIAG_BY_FAMILY:  # NLMSG_ERROR: no such socket
            return 0
        return struct.unpack_from("=I", answer, 84)[0]  # inet_diag_msg's idiag_inode, after its header
    except (OSError, struct.error):
        return 0


def _holds(proc: int, link: str) -> bool:
    """Whether the process whose /proc/PID directory is open as `proc` has `link` among its open files. Once
    that process is gone, nothing can be looked up in its directory, whatever process gets its pid next."""
    try:
        fds = os.open("fd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc)
    except OSError:  # gone, or not ours to read
        return False
    try:
        for name in os.listdir(fds):
            try:
                if os.readlink(name, dir_fd=fds) == link:
                    return True
            except OSError:  # closed meanwhile
                pass
    finally:
        os.close(fds)
    return False


class _Guard:
    """Which connections come from the harness: see the module docstring."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
        self.pinned: int | None = None  # the harness's /proc/PID, open (it names that process, not its pid)

    def allows(self, client: tuple[str, int]) -> bool:
        inode = _client_inode(self.nl, client, self.server)
        if not inode:
            return False
        link = f"socket:[{inode}]"
        if self.pinned is not None:
            return _holds(self.pinned, link)
        holders = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue
            if _holds(proc, link):
                holders.append(proc)
            else:
                os.close(proc)
        if len(holders) == 1:
            self.pinned = holders[0]
            return True
        for proc in holders:
            os.close(proc)
        return False


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _serve(listener: socket.socket, path: str, control: socket.socket) -> None:
    guard = _Guard(listener.getsockname())
    told = False
    while True:
        client, peer = listener.accept()
        try:
            allowed = guard.allows(peer)
        except Exception:  # this loop must outlive any surprise, and a connection it cannot check is refused
            allowed = False
        if not allowed:
            client.close()
            try:
                control.sendall(REFUSED)
            except OSError:
                pass
            if not told:  # once: a harness calling from another process would fail here, visibly
                told = True
                print(
                    "workbench sandbox: refused a connection to the endpoint from a process other than the harness's",
                    file=sys.stderr,
                    flush=True,
                )
            continue
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # relay each piece at once (no 40 ms Nagle stall)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _control(path: str) -> socket.socket:
    """The control connection, opened before the command starts: the relay pins this process by it."""
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        control.settimeout(10)
        control.connect(path)
        ack = control.recv(1)
        control.settimeout(None)
    except OSError:
        ack = b""
    if ack != ACK:
        print(
            "workbench sandbox: the endpoint's relay did not take this process as the sandbox's forwarder (only the first command a sandbox starts reaches its endpoint)",
            file=sys.stderr,
            flush=True,
        )
    return control


# What this init says, exit code 127 (the shell's "command not found"), when the command it was given cannot start: a
# harness binary the sandbox cannot see is the set-up's failure, never the agent's (`workbench.rollout` reads it).
CANNOT_START = "workbench sandbox: the command could not start: "


def main() -> None:
    _undumpable()
    port, path = int(sys.argv[1]), sys.argv[2]
    argv = sys.argv[4:] if sys.argv[3] == "--" else sys.argv[3:]
    control = _control(path)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener, path, control), daemon=True).start()
    try:
        child = subprocess.Popen(argv)
    except OSError as exc:
        print(f"{CANNOT_START}{argv[0] if argv else '(none)'}: {exc.strerror}", file=sys.stderr, flush=True)
        sys.exit(127)
    code = child.wait()
    if code < 0:
        if code not in (-signal.SIGKILL, -signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
