"""The syscall filter (`workbench.sandbox.seccomp`): every denied family refused inside a real bwrap sandbox and in
the grading jail, the rest of the system untouched, and the harnesses' runtimes (Node, Bun) still starting.

Each attack runs as the sandboxed program would: Python's ``ctypes`` calling the raw syscall in the sandbox,
reporting the errno. Without the filter (main before it) every one of them but ``bpf`` succeeded or failed for
other reasons (``ptrace(ATTACH)`` of a sibling, ``process_vm_readv``, ``pidfd_getfd``, ``io_uring_setup``,
``userfaultfd``, ``keyctl``, ``perf_event_open``: all succeeded in a rollout sandbox on this host)."""

from __future__ import annotations

import errno
import json
import os
import platform
import subprocess

import pytest

from workbench.paths import harness_bin, tools_dir
from workbench.sandbox import DENIED, Sandbox, SandboxLimits, bwrap_available

pytestmark = [
    pytest.mark.skipif(not bwrap_available(), reason="bwrap is not installed (scripts/setup.sh installs it)"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the attacks name x86_64 syscall numbers"),
]

# x86_64 numbers (asm/unistd_64.h) of one syscall per denied family, and the arguments of a real attempt
ATTACKS = {
    "ptrace": (101, "PTRACE_ATTACH of a sibling"),
    "process_vm": (310, "process_vm_readv of a sibling"),
    "pidfd_getfd": (438, "pidfd_getfd of a sibling's fd"),
    "io_uring": (425, "io_uring_setup"),
    "userfaultfd": (323, "userfaultfd"),
    "keyring": (250, "keyctl(GET_KEYRING_ID)"),
    "perf_event_open": (298, "perf_event_open"),
    "bpf": (321, "bpf(MAP_CREATE)"),
    "mount": (165, "mount tmpfs"),
    "namespaces": (272, "unshare(CLONE_NEWNS)"),
}

PROBE = r"""
import ctypes, errno, json, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
sib = subprocess.Popen(["sleep", "30"])
pidfd = libc.syscall(434, sib.pid, 0)  # pidfd_open: allowed, the fd pidfd_getfd would use
buf = ctypes.create_string_buffer(64)
iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 64)
attr = ctypes.create_string_buffer(128)
calls = {
    "ptrace": (101, 16, sib.pid, 0, 0),
    "process_vm": (310, sib.pid, ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0),
    "pidfd_getfd": (438, pidfd, 0, 0),
    "io_uring": (425, 8, ctypes.addressof(attr)),
    "userfaultfd": (323, 0),
    "keyring": (250, 0, -3, 0),
    "perf_event_open": (298, ctypes.addressof(attr), 0, -1, -1, 0),
    "bpf": (321, 0, ctypes.addressof(attr), 72),
    "mount": (165, b"none", b"/tmp", b"tmpfs", 0, 0),
    "namespaces": (272, 0x00020000),
}
out = {}
for name, (nr, *args) in calls.items():
    ctypes.set_errno(0)
    r = libc.syscall(nr, *[ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args])
    out[name] = errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno())) if r < 0 else "ALLOWED"
ctypes.set_errno(0)
out["getppid"] = "ALLOWED" if libc.syscall(110) > 0 else "refused"
open("still-writable.txt", "w").write("ok")
out["write"] = "ALLOWED"
sib.kill()
print(json.dumps(out))
"""


def _expected() -> dict[str, str]:
    return {name: errno.errorcode[err] for name, (_, err) in DENIED.items()} | {
        "getppid": "ALLOWED",
        "write": "ALLOWED",
    }


def test_every_denied_family_is_refused_in_a_sandbox_and_the_rest_works(base):
    assert set(ATTACKS) == set(DENIED)
    with Sandbox.create({}, isolation="bwrap", base_dir=base) as sb:
        code, out = sb.run(["python3", "-c", PROBE], timeout_s=60)
        assert code == 0, out
        assert json.loads(out.strip().splitlines()[-1]) == _expected()
        assert (sb.workspace / "still-writable.txt").read_text() == "ok"


def test_the_graded_code_runs_under_the_same_filter(tmp_path):
    from workbench.verify.jail import Jail
    from workbench.verify.jail_host import resolve
    from workbench.tasks import Limits

    host, use_bwrap = resolve("bwrap")
    (tmp_path / "solution").mkdir()
    (tmp_path / "solution" / "solution.py").write_text("x = 1\n")
    with Jail(Limits(time_s=30, deadline_s=60), host, bwrap=use_bwrap) as jail:
        jail.copy_in(tmp_path / "solution")
        proc = jail.spawn([jail.python, "-c", PROBE], subprocess.DEVNULL)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-500:]
    assert json.loads(out.decode().strip().splitlines()[-1]) == _expected()


@pytest.mark.parametrize("name", ["opencode", "claude"])
def test_node_and_bun_harnesses_still_start_under_the_filter(base, name):
    """io_uring is refused with ENOSYS, as on a kernel without it: libuv (Node) and Bun take their fallback."""
    try:
        binary = harness_bin(name)
    except FileNotFoundError:
        pytest.skip(f"{name} is not installed (scripts/setup.sh installs it)")
    limits = SandboxLimits(wall_s=120)
    with Sandbox.create({}, isolation="bwrap", base_dir=base, limits=limits, ro_paths=[tools_dir()]) as sb:
        code, out = sb.run([str(binary), "--version"], timeout_s=120)
    assert code == 0 and out.strip(), out[-500:]


def test_the_filter_is_built_by_libseccomp_for_this_machine():
    from workbench.sandbox.seccomp import bpf_program, filter_fd

    program = bpf_program()
    assert len(program) % 8 == 0 and len(program) > 8 * len(ATTACKS)  # sock_filter instructions, 8 bytes each
    fd = filter_fd()
    try:
        assert os.get_inheritable(fd) and os.read(fd, len(program) + 1) == program
    finally:
        os.close(fd)


# ------------------------------------------------------------------------ bind sources, walked as root walks them


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's folder needs root to make")
def test_a_bind_source_below_another_users_folder_is_refused_even_when_it_looks_harmless(base):
    """The swapped-symlink attack: a harness folder named for ro_paths sits below a folder another user owns; that
    user replaces it with a link to answers root can read. Refused by owner, before and after the swap."""
    from workbench.sandbox import SandboxError, check_bind_source

    theirs = base / "theirs"
    (theirs / "tools").mkdir(parents=True)
    os.chown(theirs, 54321, 54321)
    with pytest.raises(SandboxError, match=r"theirs is owned by uid 54321, neither root nor the runner"):
        Sandbox.create({}, isolation="bwrap", base_dir=base, ro_paths=[theirs / "tools"])
    secret = base / "answers"
    secret.mkdir()
    (theirs / "tools").rmdir()
    (theirs / "tools").symlink_to(secret)  # the swap
    os.lchown(theirs / "tools", 54321, 54321)
    with pytest.raises(SandboxError, match="owned by uid 54321"):
        check_bind_source(theirs / "tools")
    # a root-owned link on the way is followed and checked (as /lib -> usr/lib is)
    mine = base / "mine"
    mine.symlink_to(secret)
    check_bind_source(mine)
    (secret / "sub").mkdir()
    os.chown(secret / "sub", 54321, 54321)
    with pytest.raises(SandboxError, match=r"answers/sub is owned by uid 54321"):
        check_bind_source(mine / "sub")
    with pytest.raises(SandboxError, match="No such file"):
        check_bind_source(base / "missing")
