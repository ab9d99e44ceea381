"""Harbor task folders as tasks: ``harbor:PATH`` (one task folder, or a folder of them) and ``repo-tasks``.

A Harbor task folder (https://harborframework.com/docs/tasks) holds ``instruction.md`` (what the agent
gets), ``task.toml`` (timeouts, resources, metadata), ``environment/`` (a Dockerfile and its build
context: the starting state), ``tests/`` (held out; ``tests/test.sh`` writes ``/logs/verifier/reward.txt``
or ``reward.json``) and optionally ``solution/solve.sh`` (the oracle). We run it on the host's tools in
bubblewrap instead of a container: what can run that way loads, the rest is refused (`HarborError`,
a ValueError naming the file and the field).

    from workbench.tasks import load_task, load_tasks
    load_tasks("harbor:/data/my-tasks")          # every task folder in it (refused ones skipped, warned)
    load_task("harbor:/data/my-tasks/fix-bug")   # one; its id is this spec
    load_tasks("repo-tasks")                     # the repository tasks shipped in workbench/data/repo_tasks
    load_task("repo-tasks/inventory-fix")

    workbench harbor check PATH                  # oracle -> 1.0 and the untouched start -> 0 (workbench.verify.harbor)

What a task becomes: ``instruction`` = instruction.md; ``files`` = what the Dockerfile copies into /app
(`workbench.tasks.dockerfile` says which instructions are honoured); ``test_kind`` = ``"harbor"`` with
one held-out test ``{"tests": {path: text}, "executable": [...], "env": {...}, "solution": {...},
"solution_executable": [...], "solution_env": {...}}`` (never in the agent's sandbox; `workbench.verify`
mounts the tests at /tests for grading only).

task.toml, field by field. Honoured: ``verifier.timeout_sec`` -> `Limits.time_s` (the deadline of the
whole verification is 60 s more, for the copy); ``verifier.env`` and ``solution.env`` (literal values;
``${VAR}`` templates, which Harbor fills from the host, are refused: the host's secrets stay out);
``agent.timeout_sec`` -> ``Task.agent_timeout_s`` (the rollout's wall clock, where wired);
``environment.memory_mb`` (or the older ``memory = "4G"``) -> `Limits.memory_mb`, which is RLIMIT_AS
per grading process (stricter than a container's total); ``metadata.workbench.verifier`` -> ``Task.verifier``
(a verifier hook, ``module:function`` or ``PATH.py:function`` relative to the task folder, run instead of
test.sh). Accepted, without effect: ``schema_version``/``version``, ``task.*``, other ``metadata``,
``source``, ``verifier.user``/``agent.user`` (always a fresh unprivileged uid), ``environment.cpus``
(the host's cores are shared), ``storage_mb``/``storage`` (the graded copy is bounded by
`Limits.workspace_mb`), ``build_timeout_sec`` (nothing is built), ``gpu_types`` when ``gpus = 0``.
Refused: ``environment.gpus`` > 0, ``docker_image``, ``allow_internet = true``, ``network_mode`` other
than ``"no-network"`` and ``allowed_hosts`` (in any section: neither the agent nor the tests have a
network here), non-empty ``environment.env``/``mcp_servers``, ``skills_dir``, ``healthcheck``, multi-step
tasks (``steps``), unknown fields; a ``tests/test.sh`` (missing, or) that installs or downloads
(apt-get/pip/uv/curl/wget/npm/git clone: the grading jail has no network), ``tests/test.bat``; binary
files, links, more than 2,000 files or 16 MiB in environment/, tests/ or solution/.
"""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path
from typing import Any

from workbench.tasks.dockerfile import HarborError, read_text_tree, starting_files
from workbench.tasks.record import Limits, Task
from workbench.paths import DATA

__all__ = [
    "REPO_TASKS",
    "HarborError",
    "is_task_folder",
    "load_harbor_task",
    "load_harbor_tasks",
    "load_spec",
    "load_specs",
]

REPO_TASKS = DATA / "repo_tasks"
_DEADLINE_MARGIN_S = 60.0  # copy + start-up on top of test.sh's own timeout (a 5,000-file copy takes ~2 s)
# Commands in a test.sh that need the network: Terminal-Bench 2's scripts fetch uv and pytest with curl.
_NETWORK = re.compile(
    r"\b(apt-get\s+install|apt\s+install|apk\s+add|yum\s+install|dnf\s+install|pip3?\s+install|"
    r"-m\s+pip\s+install|uvx?|curl|wget|npm\s+(install|i|ci)|git\s+clone)\b"
)
_RESERVED_ENV = ("PATH", "HOME", "TMPDIR")
_NETWORK_OK = (None, "no-network")
# Fields per section: honoured or accepted without effect (the module docstring says which is which).
_KNOWN = {
    "": {"schema_version", "version", "task", "metadata", "verifier", "agent", "environment", "solution", "source"},
    "verifier": {"timeout_sec", "env", "user", "network_mode", "allowed_hosts"},
    "agent": {"timeout_sec", "user", "network_mode", "allowed_hosts"},
    "environment": {
        "build_timeout_sec",
        "docker_image",
        "cpus",
        "memory_mb",
        "storage_mb",
        "gpus",
        "gpu_types",
        "allow_internet",
        "network_mode",
        "allowed_hosts",
        "mcp_servers",
        "env",
        "skills_dir",
        "healthcheck",
        "memory",
        "storage",
    },
    "solution": {"env"},
}


def is_task_folder(path: Path) -> bool:
    return (path / "task.toml").is_file() and (path / "instruction.md").is_file()


def load_spec(spec: str, limits: Limits | None = None) -> Task:
    """One task: ``harbor:PATH`` (a task folder) or ``repo-tasks/NAME``."""
    if spec.startswith("repo-tasks/"):
        name = spec[len("repo-tasks/") :]
        if not is_task_folder(REPO_TASKS / name):
            raise ValueError(
                f"unknown task {spec!r}: the repository tasks are "
                f"{', '.join(p.name for p in _task_folders(REPO_TASKS))}"
            )
        return load_harbor_task(REPO_TASKS / name, task_id=spec, limits=limits)
    path = _path(spec)
    if not is_task_folder(path):
        found = _task_folders(path)
        raise ValueError(
            f"{spec!r} is not a task folder (task.toml + instruction.md)"
            + (
                f"; it holds {len(found)} of them: name one (harbor:{path}/{found[0].name}) or use load_tasks"
                if found
                else ""
            )
        )
    return load_harbor_task(path, limits=limits)


def load_specs(spec: str, limits: Limits | None = None) -> list[Task]:
    """Tasks of ``harbor:PATH`` (a task folder or a folder of them) or ``repo-tasks``. A refused task in a
    folder of many is skipped with a warning giving its reason; none usable is an error."""
    if spec == "repo-tasks":
        return load_harbor_tasks(REPO_TASKS, id_prefix="repo-tasks/", limits=limits)
    path = _path(spec)
    if is_task_folder(path):
        return [load_harbor_task(path, limits=limits)]
    return load_harbor_tasks(path, limits=limits)


def load_harbor_tasks(folder: Path, *, id_prefix: str | None = None, limits: Limits | None = None) -> list[Task]:
    folders = _task_folders(folder)
    if not folders:
        raise ValueError(f"no Harbor task folders (task.toml + instruction.md) in {folder}")
    tasks, refused = [], []
    for path in folders:
        try:
            tasks.append(
                load_harbor_task(path, task_id=f"{id_prefix}{path.name}" if id_prefix else None, limits=limits)
            )
        except HarborError as exc:
            refused.append(f"{path.name}: {exc}")
    if refused and not tasks:
        raise HarborError(f"{folder}: every task was refused: " + "; ".join(refused))
    if refused:
        warnings.warn(f"{folder}: skipped {len(refused)} of {len(folders)} tasks: " + "; ".join(refused), stacklevel=3)
    return tasks


def load_harbor_task(path: Path, *, task_id: str | None = None, limits: Limits | None = None) -> Task:
    """One Harbor task folder as a `Task` (`HarborError` naming the file and field when refused).
    ``limits`` replaces what task.toml says about grading limits."""
    path = Path(path).expanduser().resolve()
    if not is_task_folder(path):
        raise HarborError(f"{path}: not a Harbor task folder (needs task.toml and instruction.md)")
    try:
        config = tomllib.loads((path / "task.toml").read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise HarborError(f"{path.name}/task.toml: not TOML: {exc}") from None
    _check_fields(config)
    env, verifier, agent = config.get("environment", {}), config.get("verifier", {}), config.get("agent", {})
    _check_environment(env, verifier, agent)
    if (path / "steps").exists():
        raise HarborError("steps/: multi-step tasks are not supported")
    tests_dir = path / "tests"
    if (tests_dir / "test.bat").exists() and not (tests_dir / "test.sh").exists():
        raise HarborError("tests/test.bat: Windows tasks are not supported")
    if not (tests_dir / "test.sh").is_file():
        raise HarborError("tests/test.sh: missing (it is what grades the task)")
    tests = read_text_tree(tests_dir, "tests")
    _check_test_script(tests["test.sh"])
    solution_dir = path / "solution"
    solution = read_text_tree(solution_dir, "solution") if solution_dir.is_dir() else {}
    held = {
        "tests": tests,
        "executable": _executables(tests_dir, tests),
        "env": _literal_env(verifier.get("env", {}), "verifier.env"),
        "solution": solution,
        "solution_executable": _executables(solution_dir, solution),
        "solution_env": _literal_env(config.get("solution", {}).get("env", {}), "solution.env"),
    }
    timeout = _positive(verifier.get("timeout_sec", 600.0), "verifier.timeout_sec")
    if limits is None:
        limits = Limits(time_s=timeout, deadline_s=timeout + _DEADLINE_MARGIN_S, memory_mb=_memory_mb(env))
    hook = ((config.get("metadata") or {}).get("workbench") or {}).get("verifier")
    if hook is not None:
        hook = _hook_spec(hook, path)
    agent_timeout = agent.get("timeout_sec")
    return Task(
        id=task_id or f"harbor:{path}",
        instruction=(path / "instruction.md").read_text(encoding="utf-8"),
        files=starting_files(path / "environment"),
        visible_tests="A Harbor task: its tests are held out; the instruction says how to check your work.\n",
        held_out_tests=[held],
        test_kind="harbor",
        entry_point=None,
        limits=limits,
        source="harbor",
        verifier=hook,
        agent_timeout_s=None if agent_timeout is None else _positive(agent_timeout, "agent.timeout_sec"),
    )


def _path(spec: str) -> Path:
    if not spec.startswith("harbor:") or not spec[len("harbor:") :]:
        raise ValueError(f"expected harbor:PATH, got {spec!r}")
    path = Path(spec[len("harbor:") :]).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"no Harbor task folder at {path}")
    return path


def _task_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and is_task_folder(p)) if folder.is_dir() else []


def _check_fields(config: dict[str, Any]) -> None:
    for section, known in _KNOWN.items():
        table = config if not section else config.get(section, {})
        if not isinstance(table, dict):
            raise HarborError(f"task.toml: [{section}] must be a table")
        unknown = sorted(set(table) - known)
        if unknown:
            where = f"{section}." if section else ""
            raise HarborError(
                f"task.toml: {', '.join(where + u for u in unknown)}: not known to this loader "
                "(refused rather than ignored)"
            )


def _check_environment(env: dict[str, Any], verifier: dict[str, Any], agent: dict[str, Any]) -> None:
    if env.get("gpus", 0):
        raise HarborError(f"task.toml: environment.gpus = {env['gpus']}: no GPU is given to agents or tests here")
    if env.get("docker_image"):
        raise HarborError(
            f"task.toml: environment.docker_image = {env['docker_image']!r}: prebuilt images are not "
            "pulled here (the host's tools stand in for the image)"
        )
    if env.get("allow_internet") is True:
        raise HarborError(
            "task.toml: environment.allow_internet = true: neither the agent nor the tests have a network here"
        )
    for name, table in (("environment", env), ("verifier", verifier), ("agent", agent)):
        if table.get("network_mode") not in _NETWORK_OK:
            raise HarborError(f"task.toml: {name}.network_mode = {table['network_mode']!r}: no network here")
        if table.get("allowed_hosts"):
            raise HarborError(f"task.toml: {name}.allowed_hosts: no network here")
    for field in ("env", "mcp_servers"):
        if env.get(field):
            raise HarborError(
                f"task.toml: environment.{field}: not supported (the agent's environment and tools "
                "are the harness's own)"
            )
    for field in ("skills_dir", "healthcheck"):
        if env.get(field):
            raise HarborError(f"task.toml: environment.{field}: not supported")


def _check_test_script(text: str) -> None:
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
        m = _NETWORK.search(code)
        if m:
            raise HarborError(
                f"tests/test.sh line {n}: {m.group(0)!r} installs or downloads; the grading jail has "
                "no network (use what the host has: python, pytest, unittest)"
            )


def _literal_env(env: Any, field: str) -> dict[str, str]:
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise HarborError(f"task.toml: {field} must map names to strings")
    for key, value in env.items():
        if "${" in value:
            raise HarborError(
                f"task.toml: {field}.{key}: ${{...}} templates read the host's environment; not "
                "supported (give the value)"
            )
        if key in _RESERVED_ENV or key.startswith("WORKBENCH_") or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise HarborError(f"task.toml: {field}.{key}: this name cannot be set here")
    return dict(env)


def _executables(root: Path, files: dict[str, str]) -> list[str]:
    return sorted(rel for rel in files if (root / rel).stat().st_mode & 0o111)


def _positive(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise HarborError(f"task.toml: {field} must be a positive number of seconds, got {value!r}")
    return float(value)


def _memory_mb(env: dict[str, Any]) -> int:
    if "memory" in env and "memory_mb" not in env:  # the older form: "4G", "512M"
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([GMK])\s*", str(env["memory"]).upper())
        if not m:
            raise HarborError(f"task.toml: environment.memory = {env['memory']!r}: expected like '4G' or '512M'")
        return max(1, int(float(m.group(1)) * {"G": 1024, "M": 1, "K": 1 / 1024}[m.group(2)]))
    value = env.get("memory_mb", 2048)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise HarborError(f"task.toml: environment.memory_mb must be a positive integer, got {value!r}")
    return value


def _hook_spec(spec: Any, folder: Path) -> str:
    if not isinstance(spec, str) or ":" not in spec:
        raise HarborError(
            f"task.toml: metadata.workbench.verifier = {spec!r}: expected 'module:function' or 'PATH.py:function'"
        )
    target, func = spec.rsplit(":", 1)
    if target.endswith(".py"):
        file = (folder / target).resolve()
        if not file.is_file():
            raise HarborError(f"task.toml: metadata.workbench.verifier: no file {target} in the task folder")
        return f"{file}:{func}"
    return spec
