"""The task record: `Task` (what an agent is asked to do and how it is graded) and its grading `Limits`.

Plain data, standard library only: every task source builds these (`workbench.tasks.catalog` for HumanEval,
DeepCoder and JSONL rows, `workbench.tasks.harbor` for Harbor folders) and the grader reads them
(`workbench.verify`), so this module imports nothing of the project and any of them can import it.

    from workbench.tasks import Limits, Task      # the usual import: workbench.tasks.catalog re-exports both
    task = Task(id="mine/0", instruction="...", files={}, visible_tests="...",
                held_out_tests=[{"input": "1\\n", "output": "2\\n"}], test_kind="stdin_stdout", entry_point=None)
    Task.from_json(task.to_json()) == task        # held_out_tests.json round-trips
    task.public_json()                            # what task.json holds: no held-out tests
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["TEST_KINDS", "WRITE_HINT", "Limits", "Task"]

# How the easy set's one-line instructions end. A harness whose file-writing tool has another name (codex has
# none: it writes files with exec_command) names its own (`Harness.task_prompt`).
WRITE_HINT = " Use the write tool."

TEST_KINDS = ("stdin_stdout", "function_call", "humaneval", "harbor")


@dataclass(frozen=True)
class Limits:
    """Resource limits for grading one task; `workbench.verify` documents which of them hold where.

    Defaults follow TRL's opencode example: 6 s per test, ~2 GB address space, 2 MB of output.
    """

    time_s: float = 6.0  # wall clock per test (HumanEval: for the whole check())
    memory_mb: int = 2048  # address space (RLIMIT_AS) of each test process
    output_bytes: int = 2_000_000  # stdout (and stderr) cap per test; more is killed
    max_processes: int = 64  # processes + threads the solution may have at once
    file_mb: int = 64  # largest file the solution may write (RLIMIT_FSIZE)
    deadline_s: float = 120.0  # whole verification, copy included; tests past it are not run
    workspace_mb: int = 64  # the workspace copy graded: apparent size of its files in all
    workspace_entries: int = 5000  # ... and its files and folders (a deeper tree than 64 is refused too)
    # What the copy (with its TMPDIR and writable folders) may hold while the tests run, allocated; past it
    # the tests are killed and the verification scores 0. 4x workspace_mb: the copy itself (<= 64 MiB, plus
    # ~20 MiB of block rounding for 5000 tiny files) and room for a test's output files (a few of file_mb),
    # while a loop writing 64 MiB files stops near its 4th, not at the host's free space.
    disk_mb: int = 256
    disk_entries: int = 20000  # ... and its files and folders: the copy's 5000, the rest for caches tests make

    def __post_init__(self) -> None:
        for name in (
            "time_s",
            "memory_mb",
            "output_bytes",
            "max_processes",
            "file_mb",
            "deadline_s",
            "workspace_mb",
            "workspace_entries",
            "disk_mb",
            "disk_entries",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)!r}")
        if self.disk_mb < self.workspace_mb or self.disk_entries < self.workspace_entries:
            raise ValueError("Limits.disk_mb / disk_entries must hold at least the copy (workspace_mb / _entries)")


@dataclass(frozen=True)
class Task:
    """One coding task. ``held_out_tests`` entries by ``test_kind``:

    - ``stdin_stdout``: ``{"input": str, "output": str}``, run as ``python solution.py``;
    - ``function_call``: ``{"input": [args...], "output": expected}``, ``entry_point(*args)`` is compared
      with ``expected`` (or ``expected[0]``, the dataset's wrapping);
    - ``humaneval``: ``{"prelude": prompt, "check": test_source}``, ``check(entry_point)`` must not raise;
    - ``harbor``: one ``{"tests": {path: text}, ...}``: a Harbor task's tests/ folder (`workbench.tasks.harbor`).

    ``verifier``: a verifier hook (``module:function`` or ``PATH.py:function``) that grades instead of
    the held-out tests (`workbench.verify.hook`). ``agent_timeout_s``: the task's own wall clock for the
    agent (Harbor's ``agent.timeout_sec``), None for the run's.
    """

    id: str
    instruction: str
    files: dict[str, str]
    visible_tests: str
    held_out_tests: list[dict[str, Any]]
    test_kind: str
    entry_point: str | None
    limits: Limits = field(default_factory=Limits)
    source: str = "jsonl"
    verifier: str | None = None
    agent_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.test_kind not in TEST_KINDS:
            raise ValueError(f"task {self.id!r}: test_kind {self.test_kind!r} is not one of {TEST_KINDS}")
        if self.test_kind in ("function_call", "humaneval") and not self.entry_point:
            raise ValueError(f"task {self.id!r}: a {self.test_kind} task needs an entry_point")
        if not self.held_out_tests:
            raise ValueError(f"task {self.id!r} has no held-out tests")

    def to_json(self) -> dict[str, Any]:
        """The full record, held-out tests included (for held_out_tests.json; never the workspace)."""
        return asdict(self)

    def public_json(self) -> dict[str, Any]:
        """What task.json holds: what the agent may know, no tests beyond the visible examples."""
        return {
            "id": self.id,
            "instruction": self.instruction,
            "source": self.source,
            "test_kind": self.test_kind,
            "entry_point": self.entry_point,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Task:
        """Inverse of `to_json`."""
        d = dict(d)
        d["limits"] = Limits(**d.get("limits", {}))
        return cls(**d)
