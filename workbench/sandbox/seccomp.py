"""The sandboxes' syscall filter: a seccomp BPF program, built by libseccomp, that bubblewrap loads (``--seccomp FD``)
just before it executes the sandboxed process, and that every process below it inherits.

Why: inside a sandbox the agent's processes run as the same uid as the harness that runs them. Without a filter
they could ``ptrace`` the harness (this host has no Yama), read its memory (``process_vm_readv``), take its
connected socket (``pidfd_getfd``) and reach the model around the proxy's "only the harness" rule; and kernel
surfaces that sandboxes have no use for (io_uring, userfaultfd, keyrings, perf, bpf, mounts, namespaces) stay
reachable. Denied here, each with an errno a program can handle (`DENIED`): ``EPERM``, or ``ENOSYS`` for io_uring
so that libuv (Node harnesses) and Bun take their fallback as on a kernel without it. Everything else is allowed:
a deny list, not an allow list, since thirteen harnesses and the code they write need the rest.

The program is built with libseccomp (the system's ``libseccomp2`` through ``pyseccomp``'s ctypes bindings, never
hand-assembled) once per process, for this machine's architecture, and handed to bwrap in a memory file:

    fd = filter_fd()            # an fd holding the BPF program (os.memfd); pass it to the child, then close it
    argv = ["bwrap", "--seccomp", str(fd), ...]
    with passed_filter(bwrap) as fd: Popen(argv, pass_fds=(fd,) if fd is not None else ())   # the same, closed
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import tempfile
from collections.abc import Iterator

__all__ = ["DENIED", "bpf_program", "filter_fd", "passed_filter"]

# syscall families denied -> the errno they return
DENIED: dict[str, tuple[tuple[str, ...], int]] = {
    "ptrace": (("ptrace",), errno.EPERM),
    "process_vm": (("process_vm_readv", "process_vm_writev"), errno.EPERM),
    "pidfd_getfd": (("pidfd_getfd",), errno.EPERM),
    "io_uring": (("io_uring_setup", "io_uring_enter", "io_uring_register"), errno.ENOSYS),
    "userfaultfd": (("userfaultfd",), errno.EPERM),
    "keyring": (("keyctl", "add_key", "request_key"), errno.EPERM),
    "perf_event_open": (("perf_event_open",), errno.EPERM),
    "bpf": (("bpf",), errno.EPERM),
    "mount": (
        ("mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick")
        + ("mount_setattr",),
        errno.EPERM,
    ),
    "namespaces": (("unshare", "setns"), errno.EPERM),
}


@functools.cache
def bpf_program() -> bytes:
    """The filter as a BPF program for this machine's architecture (libseccomp's ``export_bpf``)."""
    import pyseccomp as seccomp

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for names, err in DENIED.values():
        for name in names:
            f.add_rule(seccomp.ERRNO(err), name)
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


@contextlib.contextmanager
def passed_filter(enabled: bool) -> Iterator[int | None]:
    """`filter_fd` for the child started inside the block (None when not `enabled`: plain mode), closed after."""
    fd = filter_fd() if enabled else None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def filter_fd() -> int:
    """A new file descriptor (inheritable, at offset 0) holding `bpf_program`; the caller closes it once the child
    that reads it has started."""
    fd = os.memfd_create("workbench-seccomp", 0)  # no MFD_CLOEXEC: bwrap, exec'd below, reads it
    os.write(fd, bpf_program())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd
