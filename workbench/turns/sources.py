"""Traces from anywhere, as the rollout folders every view reads: one path (a folder or a file) holding traces in any
of three formats, each found, checked and, where needed, imported.

The three formats:

- ``rollout``: our rollout folder, ``trace.json`` (+ ``summary.json``), as `workbench rollout` or ``import`` writes it;
- ``openenv-trace``: an OpenEnv ``TrainingTrace`` file, ``{"schema_version": 1, "turns": [...]}``;
- ``openenv-entries``: a JSON list of OpenEnv trace entries (``TrainingTrace.to_trace_entries``).

The two OpenEnv formats are imported (`workbench.turns.interop.import_trace`, masks kept token for token) into a
work folder the caller names (a notebook's run folder, a temporary folder); rollout folders are read in place.

    found = load_sources(Path("~/captures"), work_dir=run / "imported")   # model= for traces that name none
    for src in found.rollouts:
        analyse(load_trace(src.folder / "trace.json"), tokenizer_for_rollout(src.folder))
    for path, why in found.skipped:                                        # one bad file hides nothing else
        print(f"{path}: skipped: {why}")

Anything unreadable (bad JSON, a mask that does not fit, a folder's damaged trace.json) is one entry in ``skipped``
naming the file and the reason, and the scan goes on; JSON files in none of the three shapes (a run's config.json)
are listed in ``ignored``. Only a path holding no trace at all is an error (FileNotFoundError).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from workbench.turns.interop import import_trace
from workbench.turns.trace import TraceError, load_trace

__all__ = ["SourceFormat", "SOURCE_FORMATS", "Source", "Sources", "sniff", "load_sources"]

SourceFormat = Literal["rollout", "openenv-trace", "openenv-entries"]
SOURCE_FORMATS: tuple[SourceFormat, ...] = ("rollout", "openenv-trace", "openenv-entries")


@dataclass(frozen=True)
class Source:
    """One rollout the views can read: `folder` holds trace.json (+ summary.json); it came from `origin`."""

    name: str  # unique within one load: the path below the scanned root ("easy_1", "sub/trace")
    folder: Path
    origin: Path  # the rollout folder itself, or the OpenEnv file it was imported from
    format: SourceFormat


@dataclass
class Sources:
    """What one path held: the rollouts, what could not be read (path, why) and the JSON that is no trace."""

    root: Path
    rollouts: list[Source] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    ignored: list[Path] = field(default_factory=list)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: unreadable: {exc}") from None


def _shape(data: Any, path: Path) -> SourceFormat | None:
    if isinstance(data, dict):
        return "openenv-trace" if "turns" in data and "schema_version" in data else None
    if not isinstance(data, list) or not data or not all(isinstance(e, dict) for e in data):
        return None
    if not any("prompt_token_ids" in e or "completion_token_ids" in e for e in data):
        return None
    if all("loss_mask" in e and isinstance(e.get("metadata"), dict) for e in data):
        return "openenv-entries"
    # our proxy's call list, loose: its tokenizer and task live in the folder around it
    raise TraceError(
        f"{path}: a list of captured calls without loss_mask/metadata (not OpenEnv trace entries); "
        "a capture of ours is read as a folder: trace.json beside a summary.json naming the model"
    )


def sniff(path: Path) -> SourceFormat | None:
    """Which of the three formats `path` (a folder or a .json file) is, or None for JSON in none of them.
    TraceError naming the file when it is unreadable, or a call list that is not a rollout folder's."""
    path = Path(path)
    if path.is_dir():
        return "rollout" if (path / "trace.json").is_file() else None
    return _shape(_read_json(path), path)


def _model_of(data: Any) -> str | None:
    """The model a document's turns name (our exports and OpenEnv's proxy write ``metadata.model``)."""
    turns = data.get("turns") if isinstance(data, dict) else data
    for t in turns if isinstance(turns, list) else []:
        meta = t.get("metadata") if isinstance(t, dict) else None
        if isinstance(meta, dict):
            rollout = meta.get("rollout")
            name = meta.get("model") or (rollout.get("model") if isinstance(rollout, dict) else None)
            if name:
                return str(name)
    return None


def _hidden(rel: Path) -> bool:
    # a rollout's graded workspace holds the agent's files, not traces; dot-folders are caches (.ipynb_checkpoints)
    return any(part == "workspace" or part.startswith(".") for part in rel.parts[:-1])


def _scan(root: Path, exclude: Path | None) -> tuple[list[Path], list[Path]]:
    """Rollout folders under `root`, and the .json files outside them (each a candidate OpenEnv file)."""
    if (root / "trace.json").is_file():
        return [root], []
    found = [
        p
        for p in sorted(root.rglob("*.json"))
        if not _hidden(p.relative_to(root)) and not (exclude is not None and exclude in p.parents)
    ]
    folders = sorted({p.parent for p in found if p.name == "trace.json"})
    inside = set(folders)
    files = [p for p in found if not inside.intersection(p.parents)]
    return folders, files


def _target(work_dir: Path, name: str, origin: Path) -> Path:
    """A fresh folder for `origin`'s import: its own earlier import is replaced (a re-run sees the file as it is
    now); any other folder of that name is left alone and a suffix added."""
    for n in range(1, 1000):
        d = work_dir / (name if n == 1 else f"{name}-{n}")
        if not d.exists() or not any(d.iterdir()):
            return d
        summary = d / "summary.json"
        try:
            imported = json.loads(summary.read_text()).get("imported_from") or {}
        except (OSError, json.JSONDecodeError, AttributeError):
            imported = {}
        if imported.get("file") == str(origin.resolve()):
            shutil.rmtree(d)
            return d
    raise TraceError(f"{work_dir}: 999 folders named {name}-N already; name another work folder")


def _label(root: Path, p: Path, strip_suffix: bool) -> str:
    if p == root:
        return p.stem if strip_suffix else p.name
    rel = p.relative_to(root)
    return "/".join((rel.with_suffix("") if strip_suffix else rel).parts)


def load_sources(path: Path, work_dir: Path, *, model: str | None = None) -> Sources:
    """Every trace in or under `path`, as rollout folders: ours in place, OpenEnv files imported into `work_dir`
    (one folder per file). `model` names the tokenizer for OpenEnv files whose turns name none (their metadata's
    ``model`` wins). Bad files are reported in ``skipped`` and the rest still load."""
    root, work_dir = Path(path), Path(work_dir)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such file or folder of traces")
    out = Sources(root=root)
    folders: list[Path]
    files: list[Path]
    if root.is_file():
        folders, files = [], [root]
    else:
        folders, files = _scan(root, work_dir if work_dir != root else None)
    for d in folders:
        try:
            load_trace(d / "trace.json")  # TraceError names the file and the position
        except (TraceError, OSError, UnicodeDecodeError) as exc:
            out.skipped.append((d / "trace.json", str(exc)))
            continue
        out.rollouts.append(Source(_label(root, d, False) or d.name, d, d, "rollout"))
    for f in files:
        try:
            data = _read_json(f)
            fmt = _shape(data, f)
            if fmt is None:
                if root.is_file():  # the one file asked for
                    raise TraceError(f"{f}: JSON in none of the formats {', '.join(SOURCE_FORMATS)}")
                out.ignored.append(f)
                continue
            name = _label(root, f, True).replace("/", "__")
            dest = _target(work_dir, name, f)
            import_trace(f, dest, model=_model_of(data) or model)
        except (TraceError, OSError) as exc:
            out.skipped.append((f, str(exc)))
            continue
        out.rollouts.append(Source(_label(root, f, True), dest, f, fmt))
    if not out.rollouts and not out.skipped:
        raise FileNotFoundError(
            f"{root}: no traces in or under it (rollout folders with trace.json, OpenEnv training-trace files, "
            f"JSON lists of OpenEnv trace entries)"
        )
    return out
