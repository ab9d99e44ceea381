"""`SharedFolder`: a folder the trainer writes LoRA adapters into and a vLLM on another host reads them from.

    shared = SharedFolder.of("/mnt/sync", "/data/sync").check()   # refuses a missing or unwritable folder
    engine_path = shared.publish(adapter_folder, name)            # atomic copy; the path as the engine sees it

`workbench.train.policy_sync.LoraSync` publishes each step's adapter here (``TrainConfig.sync_dir``).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SharedFolder"]


@dataclass(frozen=True)
class SharedFolder:
    """A folder the trainer writes adapters into and the engine reads them from, on another host.

    `path` is the folder on the trainer's side; `on_engine` is the same folder as the engine's host mounts it (a
    POSIX path there, sent verbatim, never resolved here).
    """

    path: Path
    on_engine: str

    @classmethod
    def of(cls, sync_dir: str, sync_dir_on_engine: str | None = None) -> "SharedFolder":
        return cls(Path(sync_dir), sync_dir_on_engine or sync_dir)

    def check(self) -> "SharedFolder":
        """Refuse a folder that is missing or not writable, before any training starts."""
        if not self.path.is_dir():
            raise ValueError(
                f"sync_dir {self.path} does not exist (or is not a folder): it must be a folder the "
                "trainer writes and the engine reads (a shared mount); create it on both hosts"
            )
        probe = self.path / f".wb-probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ValueError(f"sync_dir {self.path} is not writable by the trainer: {exc.strerror}") from None
        if not posixpath.isabs(self.on_engine):
            raise ValueError(
                f"sync_dir_on_engine must be an absolute path on the engine's host, got {self.on_engine!r}"
            )
        return self

    def publish(self, adapter: Path, name: str) -> str:
        """Copy the adapter folder in under `name` (atomically: the engine never sees half a folder); returns
        its path as the engine sees it."""
        target = self.path / name
        if target.exists():
            raise ValueError(f"{target} exists: adapter names are single-use")
        tmp = self.path / f".{name}.tmp-{uuid.uuid4().hex[:6]}"
        shutil.copytree(adapter, tmp)
        os.replace(tmp, target)
        return posixpath.join(self.on_engine, name)

    def remove(self, name: str) -> None:
        shutil.rmtree(self.path / name, ignore_errors=True)
