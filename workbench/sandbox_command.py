"""The command line that runs one process in a sandbox: limits, the uid drop, and bwrap's namespaces.

Pure argv building (it starts nothing): `workbench.sandbox.Sandbox.command` calls `wrap` with its own
folders, and `Sandbox.spawn` runs the result. The layers, outermost first:

1. ``prlimit`` sets `SandboxLimits` (prlimit rather than preexec_fn: the proxy runs in threads of
   this process, and running Python between fork and exec is unsafe with threads);
2. ``setpriv`` drops to the sandbox's uid with no capability and none to regain (as root), or just
   sets no-new-privs (as a user);
3. ``bwrap`` mode: new user, pid, net, ipc, uts and cgroup namespaces, nested user namespaces
   refused; only /usr, a few files of /etc, `ro_paths` and the interpreter (read-only) and the
   sandbox's own folders are mounted; `_sandbox_init` forwards the inside port to the relay's socket.
   ``none`` mode: `procs.die_with_us`'s watchdog instead (it kills the uid and the marked processes
   when we die; bwrap's --die-with-parent and pid namespace do that in bwrap mode).

    argv = wrap(["opencode", "run"], mode="bwrap", root=root, limits=SandboxLimits(), uid=uid,
                workspace=root / "ws", home=root / "home", tmp=root / "tmp", bin_dir=root / "bin",
                ro_paths=[], python="/usr/bin/python3")
"""

from __future__ import annotations

import os
from pathlib import Path

from .procs import die_with_us, processes
from .sandbox_spec import AGENT_HOME, AGENT_TMP, APP, MARKER_ENV, IsolationMode, SandboxLimits

__all__ = ["wrap", "limit_args", "drop_to", "outside_usr", "SOCKET_INSIDE"]

_INIT = Path(__file__).resolve().with_name("_sandbox_init.py")
SOCKET_INSIDE = "/run/workbench/endpoint.sock"  # where the relay's Unix socket is mounted inside
# /etc entries a harness needs (dynamic loader, users, name resolution, TLS roots, time zone); the
# rest of /etc stays out.
_ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "localtime",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "gitconfig",
    "mime.types",
)


def limit_args(limits: SandboxLimits, uid: int | None) -> list[str]:
    """`prlimit` flags for `limits` (why prlimit: see the module docstring)."""
    mb = 1024 * 1024
    # RLIMIT_NPROC counts the real uid's processes: exact for a fresh uid; our own uid already runs some.
    nproc = limits.nproc if uid is not None else limits.nproc + sum(1 for p in processes() if p.uid == os.getuid())
    return [
        "prlimit",
        f"--cpu={limits.cpu_s}",
        f"--as={limits.memory_mb * mb}",
        f"--fsize={limits.file_size_mb * mb}",
        f"--nproc={nproc}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
    ]


def drop_to(uid: int | None) -> list[str]:
    """setpriv to `uid` with no capabilities (and none to regain): only no-new-privs when we are not root."""
    if uid is None:
        return ["setpriv", "--no-new-privs", "--"]
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def outside_usr(python: str) -> list[Path]:
    """The interpreter's installation when it is not under /usr (pyenv, a venv elsewhere)."""
    real = Path(os.path.realpath(python))
    return [] if str(real).startswith("/usr/") else [real.parent.parent]


def wrap(
    argv: list[str],
    *,
    mode: IsolationMode,
    root: Path,
    limits: SandboxLimits,
    uid: int | None,
    workspace: Path,
    home: Path,
    tmp: Path,
    bin_dir: Path,
    ro_paths: list[Path],
    python: str,
    relay_socket: Path | None = None,
    inside_port: int = 0,
) -> list[str]:
    """`argv` wrapped for `mode`, `uid` and `limits`. `relay_socket` (bwrap): the endpoint's Unix
    socket on the host, forwarded to ``127.0.0.1:inside_port`` inside."""
    if mode == "none":
        # The watchdog runs as us (it must be able to kill the sandbox uid); bwrap's
        # --die-with-parent and pid namespace do this below.
        inner = limit_args(limits, uid) + drop_to(uid) + list(argv)
        return die_with_us(inner, marker=f"{MARKER_ENV}={root}", uid=uid)
    cmd = (
        limit_args(limits, uid)
        + drop_to(uid)
        + [
            "bwrap",
            "--unshare-user",
            "--disable-userns",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--cap-drop",
            "ALL",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--ro-bind",
            "/usr",
            "/usr",
            # /tmp first (later mounts may lie below it): small, because a tmpfs is host memory;
            # TMPDIR points at tmp/, on disk, counted by over_quota.
            "--perms",
            "1777",
            "--size",
            str(limits.file_size_mb << 20),
            "--tmpfs",
            "/tmp",
        ]
    )
    for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged-/usr Debian: symlinks
        target = Path("/") / link
        if target.is_symlink():
            cmd += ["--symlink", os.readlink(target), f"/{link}"]
        elif target.is_dir():
            cmd += ["--ro-bind", str(target), str(target)]
    for name in _ETC:
        cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for p in [*ro_paths, *outside_usr(python)]:
        cmd += ["--ro-bind", str(p), str(p)]
    cmd += ["--bind", str(workspace), APP, "--bind", str(home), AGENT_HOME, "--bind", str(tmp), AGENT_TMP]
    cmd += ["--ro-bind", str(bin_dir), str(bin_dir), "--ro-bind", str(_INIT), "/run/workbench/init.py"]
    init_python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else python
    if relay_socket is not None:
        cmd += [
            "--bind",
            str(relay_socket),
            SOCKET_INSIDE,
            "--chdir",
            APP,
            "--",
            init_python,
            "-I",
            "-S",
            "/run/workbench/init.py",
            str(inside_port),
            SOCKET_INSIDE,
            "--",
        ]
    else:
        cmd += ["--chdir", APP, "--"]
    return cmd + list(argv)
