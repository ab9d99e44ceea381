"""The part of a Harbor task's ``environment/Dockerfile`` that can run here: the files it copies into /app.

We run the agent on the host's own tools in bubblewrap, not in the image the Dockerfile builds. So
the Dockerfile is read, never built: what it copies from its build context into ``/app`` becomes the
task's starting files, the steps that only install what the host already has are accepted, and
anything else is refused with the line and the instruction that cannot be honoured.

    files = starting_files(Path("task/environment"))     # {"src/app.py": "...", ...}; HarborError if refused

Honoured: one ``FROM`` (the image is not pulled: the host's /usr stands in for it); ``WORKDIR /app``
(any other working directory is refused: the agent works in /app); ``COPY``/``ADD`` of files and
folders of the build context (globs, ``.dockerignore`` names and patterns, ``--chown``/``--chmod``/
``--link`` accepted, file modes not kept) to /app or below it; ``RUN`` made only of ``apt-get
install`` of packages dpkg says are installed here, ``pip install`` of distributions the agent's and
the grader's interpreters both have (version pins not checked), ``apt-get update``/``clean``,
``rm -rf /var/lib/apt/lists/*``, ``mkdir -p /app``, ``chmod`` under /app, ``true``; ``ENV`` of
`HARMLESS_ENV` only. Ignored: ``ARG``, ``LABEL``, ``MAINTAINER``, ``CMD``, ``ENTRYPOINT``,
``EXPOSE``, ``USER`` (the agent always runs as a fresh unprivileged uid), ``STOPSIGNAL``,
``HEALTHCHECK``. Refused: everything else (other ``RUN`` steps, multi-stage builds, ``COPY
--from``, ``ADD`` of URLs or archives, heredocs, other ``ENV``, ``VOLUME``, ``SHELL``, ``ONBUILD``).
"""

from __future__ import annotations

import ast
import fnmatch
import glob
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

__all__ = [
    "HARMLESS_ENV",
    "MAX_BYTES",
    "MAX_FILES",
    "HarborError",
    "list_tree",
    "read_text",
    "read_text_tree",
    "starting_files",
]

APP = PurePosixPath("/app")
# Variables that only tune an image build or a Python's chatter: accepted and not set (the agent's
# environment is built from scratch by the sandbox).
HARMLESS_ENV = (
    "DEBIAN_FRONTEND",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "PIP_NO_CACHE_DIR",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "PIP_ROOT_USER_ACTION",
    "TZ",
    "LANG",
    "LC_ALL",
    "TERM",
)
_IGNORED = ("ARG", "LABEL", "MAINTAINER", "CMD", "ENTRYPOINT", "EXPOSE", "USER", "STOPSIGNAL", "HEALTHCHECK")
# A task is held in memory and written (as JSON) into every rollout folder: starting files, tests
# and solution are each bounded to 2,000 files and 16 MiB, well above a repository task (~20 files).
MAX_FILES = 2000
MAX_BYTES = 16 << 20
_ARCHIVE = re.compile(r"\.(tar|tgz|tar\.gz|tar\.bz2|tbz2|tar\.xz|txz|tar\.zst)$")
_AGENT_PYTHON = "/usr/bin/python3"  # what `python` is in the agent's sandbox (workbench.sandbox.session's default)


class HarborError(ValueError):
    """A Harbor task folder this loader refuses; the message names the file and the field or line."""


def list_tree(root: Path, what: str, skip: tuple[str, ...] = ()) -> dict[str, Path]:
    """Every entry under ``root`` that is not a folder (files, links, special files), by POSIX path
    relative to it, ``__pycache__`` folders left out; at most `MAX_FILES`. Nothing is read: `read_text` refuses what
    cannot be a task file."""
    out: dict[str, Path] = {}
    for top, dirs, names in os.walk(root):
        # Bytecode caches: Python writes them beside any task code it ran (the oracle run by hand, a test import);
        # they are no task file, and binary: reading one would refuse the whole task.
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            path = Path(top, name)
            rel = path.relative_to(root).as_posix()
            if rel in skip:
                continue
            if len(out) >= MAX_FILES:
                raise HarborError(f"{what}: more than {MAX_FILES} files")
            out[rel] = path
    return out


def read_text(path: Path, shown: str) -> str:
    """One task file as text: a regular file in UTF-8 (links, special and binary files refused)."""
    if path.is_symlink() or not path.is_file():
        raise HarborError(f"{shown}: only regular files are supported (a link or special file)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise HarborError(f"{shown}: not UTF-8 text (binary files are not supported)") from None


def read_text_tree(root: Path, what: str, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under ``root`` as text (`read_text`), within `MAX_FILES` / `MAX_BYTES`."""
    out = {rel: read_text(path, f"{what}/{rel}") for rel, path in list_tree(root, what, skip).items()}
    _check_bytes(out, what)
    return out


def _check_bytes(files: dict[str, str], what: str) -> None:
    if sum(len(text.encode()) for text in files.values()) > MAX_BYTES:
        raise HarborError(f"{what}: more than {MAX_BYTES >> 20} MiB")


def starting_files(env_dir: Path) -> dict[str, str]:
    """The files ``env_dir/Dockerfile`` puts under /app, relative to /app. No Dockerfile: none."""
    dockerfile = env_dir / "Dockerfile"
    for compose in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml"):
        if (env_dir / compose).exists():
            raise HarborError(f"environment/{compose}: multi-container environments are not supported")
    if not dockerfile.is_file():
        return {}
    ignore = _dockerignore(env_dir)
    context = {
        rel: path
        for rel, path in list_tree(env_dir, "environment", skip=(".dockerignore",)).items()
        if not _ignored(rel, ignore)
    }
    files: dict[str, str] = {}
    workdir, froms = PurePosixPath("/"), 0
    for lineno, op, rest in _instructions(dockerfile.read_text(encoding="utf-8")):
        where = f"environment/Dockerfile line {lineno}"
        if op == "FROM":
            froms += 1
            if froms > 1:
                raise HarborError(f"{where}: a second FROM (multi-stage builds are not supported)")
        elif op == "WORKDIR":
            workdir = PurePosixPath(os.path.normpath(str(workdir / rest.strip().strip('"'))))
            if workdir != APP:
                raise HarborError(f"{where}: WORKDIR {workdir}: the agent works in /app here, nowhere else")
        elif op in ("COPY", "ADD"):
            _copy(op, rest, workdir, env_dir, context, files, where)
        elif op == "RUN":
            _check_run(rest, where)
        elif op == "ENV":
            names = _env_names(rest)
            bad = [n for n in names if n not in HARMLESS_ENV]
            if bad:
                raise HarborError(
                    f"{where}: ENV {', '.join(bad)}: the agent's environment is built from scratch "
                    f"here (accepted: {', '.join(HARMLESS_ENV)})"
                )
        elif op not in _IGNORED:
            raise HarborError(f"{where}: {op} is not supported")
    _check_bytes(files, "the files the Dockerfile copies")
    return files


def _instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        op, _, rest = buf.strip().partition(" ")
        if "<<" in rest and re.search(r"<<-?\s*['\"]?[A-Za-z_]+", rest):
            raise HarborError(f"environment/Dockerfile line {start}: heredocs are not supported")
        out.append((start, op.upper(), rest.strip()))
        buf = ""
    return out


def _dockerignore(env_dir: Path) -> list[str]:
    path = env_dir / ".dockerignore"
    if not path.exists():
        return []
    patterns = [
        ln.strip()
        for ln in path.read_text(encoding="utf-8").splitlines()
        if ln.strip() and not ln.strip().startswith("#")
    ]
    if any(p.startswith("!") for p in patterns):
        raise HarborError("environment/.dockerignore: exceptions (!PATTERN) are not supported")
    return [p.strip("/") for p in patterns]


def _ignored(rel: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or rel.startswith(p + "/") for p in patterns)


def _copy(
    op: str,
    rest: str,
    workdir: PurePosixPath,
    env_dir: Path,
    context: dict[str, Path],
    files: dict[str, str],
    where: str,
) -> None:
    args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    flags = [a for a in args if a.startswith("--")]
    args = [a for a in args if not a.startswith("--")]
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name not in ("--chown", "--chmod", "--link"):
            raise HarborError(f"{where}: {op} {name} is not supported")
    if len(args) < 2:
        raise HarborError(f"{where}: {op} needs a source and a destination")
    *sources, dest = args
    target = PurePosixPath(os.path.normpath(str(workdir / dest)))
    if target != APP and APP not in target.parents:
        raise HarborError(f"{where}: {op} to {target}: only files under /app reach the agent's workspace")
    into_dir = dest.endswith("/") or len(sources) > 1 or target == APP
    for src in sources:
        if op == "ADD" and (re.match(r"[a-z]+://", src) or src.startswith("git@")):
            raise HarborError(f"{where}: ADD {src}: remote sources are not supported (no network)")
        if op == "ADD" and _ARCHIVE.search(src):
            raise HarborError(f"{where}: ADD {src}: ADD unpacks archives; not supported (use COPY of files)")
        norm = os.path.normpath(src).lstrip("/")
        if norm.startswith(".."):
            raise HarborError(f"{where}: {op} {src}: outside the build context (environment/)")
        norm = "" if norm == "." else norm
        matched = [m for m in context if _matches(m, norm)]
        if not matched:
            raise HarborError(f"{where}: {op} {src}: no such file in environment/")
        for rel in matched:
            inner = _inner(rel, norm)
            if inner is None:  # the source is this file itself
                path = target / PurePosixPath(rel).name if into_dir else target
            else:
                path = target / inner
            files[str(path.relative_to(APP))] = read_text(context[rel], f"environment/{rel}")


def _matches(rel: str, pattern: str) -> bool:
    """Whether context file ``rel`` is ``pattern`` (a file), lies under it (a folder), or under a glob match."""
    if not pattern:
        return True
    if not glob.has_magic(pattern):
        return rel == pattern or rel.startswith(pattern + "/")
    parts = rel.split("/")
    return any(fnmatch.fnmatchcase("/".join(parts[:k]), pattern) for k in range(1, len(parts) + 1))


def _inner(rel: str, pattern: str) -> str | None:
    """The path of ``rel`` inside the matched source folder, or None when the source is the file itself."""
    if not pattern:
        return rel
    parts = rel.split("/")
    for k in range(1, len(parts) + 1):
        head = "/".join(parts[:k])
        if head == pattern or (glob.has_magic(pattern) and fnmatch.fnmatchcase(head, pattern)):
            return "/".join(parts[k:]) or None
    return None


def _env_names(rest: str) -> list[str]:
    if "=" not in rest.split()[0]:
        return [rest.split()[0]]  # legacy form: ENV NAME value
    return [tok.split("=", 1)[0] for tok in shlex.split(rest)]


def _check_run(rest: str, where: str) -> None:
    if rest.startswith("["):
        raise HarborError(f"{where}: RUN in exec form is not supported")
    if re.search(r"[|<>`]|\$\(", rest):
        raise HarborError(f"{where}: RUN {rest[:60]!r}: pipes, redirections and substitutions are not run here")
    for command in re.split(r"&&|;|\|\|", rest):
        words = shlex.split(command)
        if not words or _harmless(words):
            continue
        if words[:2] in (["apt-get", "install"], ["apt", "install"]):
            _check_apt([w for w in words[2:] if not w.startswith("-")], where)
        elif (pkgs := _pip_packages(words)) is not None:
            _check_pip(pkgs, where)
        else:
            raise HarborError(
                f"{where}: RUN {' '.join(words)[:80]!r}: build steps are not run here (only installs "
                "of packages this host already has are accepted)"
            )


def _harmless(words: list[str]) -> bool:
    if words[:2] in (["apt-get", "update"], ["apt-get", "clean"], ["apt", "update"]) or words == ["true"]:
        return True
    if words == ["rm", "-rf", "/var/lib/apt/lists/*"] or words in (["mkdir", "-p", "/app"], ["mkdir", "/app"]):
        return True
    # Modes are not kept (the starting files are text): chmod of the workspace is accepted as a no-op.
    return words[0] == "chmod" and all(w.startswith(("-", "+", "/app", "u+", "a+")) or w.isdigit() for w in words[1:])


def _pip_packages(words: list[str]) -> list[str] | None:
    for head in (
        ["pip", "install"],
        ["pip3", "install"],
        ["python", "-m", "pip", "install"],
        ["python3", "-m", "pip", "install"],
        ["uv", "pip", "install"],
    ):
        if words[: len(head)] == head:
            rest = words[len(head) :]
            if "-r" in rest or "--requirement" in rest or "-e" in rest:
                raise HarborError(
                    f"pip install {' '.join(rest)}: requirement files and editable installs are not supported"
                )
            return [w for w in rest if not w.startswith("-")]
    return None


def _check_apt(packages: list[str], where: str) -> None:
    dpkg = shutil.which("dpkg-query")
    missing = []
    for pkg in packages:
        name = pkg.split("=", 1)[0]
        if dpkg is None:
            missing.append(name)
            continue
        got = subprocess.run(
            [dpkg, "-W", "-f=${Status}", name], capture_output=True, text=True, timeout=30, check=False
        )
        if "install ok installed" not in got.stdout:
            missing.append(name)
    if missing:
        raise HarborError(
            f"{where}: apt-get install {' '.join(missing)}: not installed on this host (nothing is "
            "installed at load time: install them on the host, or drop them)"
        )


def _check_pip(packages: list[str], where: str) -> None:
    names = [re.split(r"[\[<>=!~; ]", p, maxsplit=1)[0] for p in packages]
    missing = [n for n in names if not _have_here(n)]
    agent = _agent_distributions(names)
    missing += [n for n in names if n not in missing and n not in agent]
    if missing:
        raise HarborError(
            f"{where}: pip install {' '.join(missing)}: not installed for both the agent's python "
            f"({_AGENT_PYTHON}) and the grader's; nothing is installed at load time"
        )


def _have_here(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _agent_distributions(names: list[str]) -> set[str]:
    """Which of ``names`` the sandbox's interpreter has installed: its sys.path (``python -I -m site``
    prints it) searched from here for their metadata."""
    if not Path(_AGENT_PYTHON).exists():
        return set()
    shown = subprocess.run(
        [_AGENT_PYTHON, "-I", "-m", "site"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    paths = [
        ast.literal_eval(line.strip().rstrip(","))
        for line in shown.split("sys.path = [", 1)[-1].split("]", 1)[0].splitlines()
        if line.strip()
    ]
    return {n for n in names if next(iter(importlib.metadata.distributions(name=n, path=paths)), None) is not None}
