"""Bind sources checked as root walks them: a path bwrap mounts into a sandbox must not be one a user could have
redirected.

As root, the outer bubblewrap resolves every ``--ro-bind`` source with root's rights (`workbench.sandbox.command`).
A source below a folder some other user owns could be swapped for a symlink to anything root can read (task data,
the engine's key, another rollout) between the time it was named and the time bwrap binds it. So each source is
walked from ``/`` one component at a time with ``O_PATH | O_NOFOLLOW``: every component, and every symlink met on
the way (followed by hand, at most 40), must be owned by root or by the runner (this process's uid). Anything
else is refused, naming the component and its owner.

    check_bind_source(Path("/work/project/tools"))     # SandboxError when a component is someone else's
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from workbench.sandbox.spec import SandboxError

__all__ = ["check_bind_source"]

_MAX_LINKS = 40  # as the kernel's own limit on symlinks in one lookup


def check_bind_source(path: Path | str, runner_uid: int | None = None) -> None:
    """SandboxError unless every component of `path` (and of each symlink on the way) is owned by root or by
    `runner_uid` (default: this process's uid)."""
    allowed = {0, os.getuid() if runner_uid is None else runner_uid}
    todo = list(Path(os.path.abspath(path)).parts[1:])
    done: list[str] = []
    links = 0
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        while todo:
            name = todo.pop(0)
            if name == "..":
                done = done[:-1]
                os.close(fd)
                fd = os.open("/" + "/".join(done), os.O_PATH | os.O_DIRECTORY)
                continue
            try:
                nfd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise SandboxError(f"bind source {path}: /{'/'.join([*done, name])}: {exc.strerror}") from None
            st = os.fstat(nfd)
            here = "/" + "/".join([*done, name])
            if st.st_uid not in allowed:
                os.close(nfd)
                raise SandboxError(
                    f"bind source {path}: {here} is owned by uid {st.st_uid}, neither root nor the runner: refused "
                    "(root binds it, so a folder another user controls could point the sandbox at anything)"
                )
            if stat.S_ISLNK(st.st_mode):
                os.close(nfd)
                links += 1
                if links > _MAX_LINKS:
                    raise SandboxError(f"bind source {path}: more than {_MAX_LINKS} symlinks")
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    done = []
                    os.close(fd)
                    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
                todo = [p for p in Path(target).parts if p not in ("/", ".")] + todo
                continue
            os.close(fd)
            fd, done = nfd, [*done, name]
    finally:
        os.close(fd)
