"""The first process of a bubblewrap sandbox: opens the sandbox's one way out, then runs the command.

The sandbox has a network namespace of its own (loopback only), so the agent cannot reach the engine,
the proxy's control plane or anything else on the host; the one endpoint it may reach (the capture
proxy) is a Unix socket bind-mounted into it. Harnesses speak HTTP over TCP, so this process listens
on ``127.0.0.1:PORT`` inside the namespace and forwards every connection to that socket (where the
workbench's relay, `workbench.sandbox_net`, carries it to the proxy). Then it runs the command and
exits with its status (a signal death is re-raised, so bwrap reports 128 + N as without us).

    python -I -S _sandbox_init.py PORT SOCKET -- ARGV...     (bwrap runs this; standard library only)

It runs as the sandbox's uid, like the agent: an agent that kills it only cuts itself off.
"""

import os
import signal
import socket
import subprocess
import sys
import threading


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


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
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


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]
    argv = sys.argv[4:] if sys.argv[3] == "--" else sys.argv[3:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    child = subprocess.Popen(argv)
    code = child.wait()
    if code < 0:
        if code not in (-signal.SIGKILL, -signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
