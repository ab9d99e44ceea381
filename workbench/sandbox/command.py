"""The command line that runs one process in a sandbox: limits, the uid drop, and bwrap's namespaces.

Pure argv building (it starts nothing): `workbench.sandbox.session.Sandbox.command` calls `wrap` with its own
folders, and `Sandbox.spawn` runs the result. The layers, outermost first:

1. ``prlimit`` sets `SandboxLimits` (prlimit rather than preexec_fn: the proxy runs in threads of
   this process, and running Python between fork and exec is unsafe with threads);
2. ``setpriv`` drops to the sandbox's uid with no capability and none to regain (as root), or just
   sets no-new-privs (as a user);
3. ``bwrap`` mode: new user, pid, net, ipc, uts and cgroup namespaces, nested user namespaces
   refused; only /usr, a few files of /etc, `ro_paths` and the interpreter (read-only) and the
   sandbox's own folders are mounted; `_init` forwards the inside port to the relay's socket.
   As root (a fresh `uid`), bubblewrap runs twice: an outer one as root makes the namespaces other
   than the user one and every mount — it resolves each bind source with root's rights, so the
   project may live below a folder the sandbox uid cannot enter (root's 0700 home, a ``mktemp -d``)
   — then ``setpriv`` drops to the uid with no capability, and an inner bubblewrap, as that uid,
   adds the user namespace (``--disable-userns``: none nested) over the finished tree. Started as
   the uid, one bubblewrap would ``realpath()`` every source as the uid and fail there ("Can't find
   source path ...: Permission denied"). The sandbox uid gains nothing: it still holds no
   capability and sees nothing but what is mounted; mount points' parents are made 0755, empty.
   As a user (`uid` None), one bubblewrap, as today's user namespaces allow.
   ``none`` mode: `procs.die_with_us`'s watchdog instead (it kills the uid and the marked processes
   when we die; bwrap's --die-with-parent and pid namespace do that in bwrap mode).

    argv = wrap(["opencode", "run"], mode="bwrap", root=root, limits=SandboxLimits(), uid=uid,
                workspace=root / "ws", home=root / "home", tmp=root / "tmp", bin_dir=root / "bin",
                ro_paths=[], python="/usr/bin/python3")
"""

from __future__ import annotations

import os
from pathlib import Path

from workbench.procs import die_with_us, processes
from workbench.sandbox.spec import AGENT_HOME, AGENT_TMP, APP, MARKER_ENV, IsolationMode, SandboxLimits

__all__ = [
    "wrap",
    "limit_args",
    "drop_to",
    "outside_usr",
    "mount",
    "under",
    "system_dirs",
    "SOCKET_INSIDE",
    "INIT_INSIDE",
]

_INIT = Path(__file__).resolve().with_name("_init.py")
SOCKET_INSIDE = "/run/workbench/endpoint.sock"  # where the relay's Unix socket is mounted inside
INIT_INSIDE = "/run/workbench/init.py"
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


def mount(how: str, source: Path | str, bound: list[str], made: set[str], dest: Path | str | None = None) -> list[str]:
    """bwrap arguments mounting `source` at `dest` (default: the same path). Each missing parent is
    made first, empty and 0755: bwrap makes them 0700 and root's when it runs as root, locking the
    sandbox uid out of what lies below. Parents inside an earlier mount (`bound`) exist already;
    `made` holds the folders made so far. Both are updated."""
    target = str(dest or source)
    args: list[str] = []
    for parent in reversed(Path(target).parents):
        p = str(parent)
        if p != "/" and p not in made and not under(p, bound):
            args += ["--perms", "0755", "--dir", p]
            made.add(p)
    bound.append(target)
    return args + [how, str(source), target]


def under(path: str, roots: list[str]) -> bool:
    """Whether `path` is one of `roots` or lies below one."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


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
    seccomp_fd: int | None = None,
) -> list[str]:
    """`argv` wrapped for `mode`, `uid` and `limits`. `relay_socket` (bwrap): the endpoint's Unix
    socket on the host, forwarded to ``127.0.0.1:inside_port`` inside. `seccomp_fd` (bwrap): an inherited fd
    holding the syscall filter (`workbench.sandbox.seccomp`), loaded by the bubblewrap that executes the
    sandboxed process (the inner one as root), so every process of the sandbox runs under it."""
    if mode == "none":
        # The watchdog runs as us (it must be able to kill the sandbox uid); bwrap's
        # --die-with-parent and pid namespace do this below.
        inner = limit_args(limits, uid) + drop_to(uid)
        return die_with_us(inner + list(argv), marker=f"{MARKER_ENV}={root}", uid=uid)
    namespaces = [
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    user_ns = ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    if seccomp_fd is not None:
        user_ns += ["--seccomp", str(seccomp_fd)]
    mounts = _mounts(limits, workspace, home, tmp, bin_dir, [*ro_paths, *outside_usr(python)], relay_socket)
    init_python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else python
    start = (
        [init_python, "-I", "-S", INIT_INSIDE, str(inside_port), SOCKET_INSIDE, "--"]
        if relay_socket is not None
        else []
    )
    if uid is None:  # one bubblewrap, as us: it makes the user namespace and the mounts
        cmd = drop_to(None) + ["bwrap", *user_ns, *namespaces, *mounts, "--chdir", APP, "--"]
    else:  # outer bubblewrap as root (mounts), then the uid, then the user namespace over that tree
        inner = ["bwrap", *user_ns, "--die-with-parent", "--dev-bind", "/", "/", "--chdir", APP, "--"]
        cmd = ["bwrap", *namespaces, *mounts, "--chdir", APP, "--", *drop_to(uid), *inner]
    return limit_args(limits, uid) + cmd + start + list(argv)


def _mounts(
    limits: SandboxLimits,
    workspace: Path,
    home: Path,
    tmp: Path,
    bin_dir: Path,
    ro_paths: list[Path],
    relay_socket: Path | None,
) -> list[str]:
    """The sandbox's file system: /proc, /dev, /usr, /tmp, a few files of /etc, `ro_paths`, its own
    folders, the init script and the relay's socket."""
    bound, made = ["/usr"], {"/proc", "/dev", "/tmp"}
    args = ["--proc", "/proc", "--dev", "/dev", "--ro-bind", "/usr", "/usr"]
    # /tmp first (later mounts may lie below it): small, because a tmpfs is host memory;
    # TMPDIR points at tmp/, on disk, counted by over_quota.
    args += ["--perms", "1777", "--size", str(limits.file_size_mb << 20), "--tmpfs", "/tmp"]
    args += system_dirs(bound)
    for name in _ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for p in ro_paths:
        args += mount("--ro-bind", p, bound, made)
    args += mount("--bind", workspace, bound, made, APP) + mount("--bind", home, bound, made, AGENT_HOME)
    args += mount("--bind", tmp, bound, made, AGENT_TMP) + mount("--ro-bind", bin_dir, bound, made)
    args += mount("--ro-bind", _INIT, bound, made, INIT_INSIDE)
    if relay_socket is not None:
        args += mount("--bind", relay_socket, bound, made, SOCKET_INSIDE)
    return args


def system_dirs(bound: list[str]) -> list[str]:
    """/bin, /sbin, /lib... (symlinks into /usr on merged-/usr systems, else read-only binds) and an
    empty 0755 /etc for the few files bound into it (bwrap would make it 0700 as root)."""
    args = []
    for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        target = Path("/") / link
        if target.is_symlink():
            args += ["--symlink", os.readlink(target), f"/{link}"]
        elif target.is_dir():
            args += ["--ro-bind", str(target), str(target)]
            bound.append(str(target))
    return args + ["--perms", "0755", "--dir", "/etc"]
