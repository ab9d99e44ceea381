"""Training from recorded rollouts: captured groups replayed through the same GRPOTrainer step, off-policy.

A recording is any folder holding rollout folders (``trace.json`` + ``summary.json``, as `workbench.rollout.run`
writes them: a training run's ``rollouts/``, an eval run, copies of ``workbench/data/rollouts/``). Rollouts are
grouped by ``summary.json``'s ``task_id`` in folder order; their recorded rewards are the rewards
(`FAILED_STATUSES` unscored). ``TrainConfig.from_rollouts`` makes `workbench.train.grpo.GRPORun` draw each step's group
from here instead of running rollouts; rows, the loss and the metrics are the live path's
(`workbench.train.fields`).

Off-policy: the recorded logprobs are the behaviour policy (whatever model and adapter sampled them), so TRL's
vLLM importance-sampling correction weighs each row by exp(log pi_theta - log mu) under
``TrainConfig.importance_sampling`` (``sequence_mask``: a row whose ratio is above TRL's C_max = 3 is masked;
no lower bound by default); metrics.jsonl says
``off_policy: true`` beside TRL's ``sampling/importance_sampling_ratio/{min,mean,max}``. The sampling temperature
must be the one the trainer scores at (refused otherwise); a recording from another model is allowed when its
token ids fit the tokenizer (``behaviour_models`` records it).

    recording = load_recording(Path("runs/20261130-120501__grpo/rollouts"), temperature=0.7)
    recording.results("easy/3", group_size=4)     # RolloutResults; missing slots are unscored placeholders
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.rollout import RolloutResult
from workbench.turns import load_trace

__all__ = ["Recording", "load_recording", "NOT_RECORDED"]

NOT_RECORDED = "not_recorded"  # the status of a slot the recording has no rollout for (reward None)


@dataclass
class Recording:
    """Recorded rollouts by task id, in folder order."""

    root: Path
    groups: dict[str, list[RolloutResult]]
    models: list[str] = field(default_factory=list)

    @property
    def task_ids(self) -> list[str]:
        return list(self.groups)

    @property
    def tool_parsers(self) -> list[str]:
        """The parsers the engine read the rollouts' tool calls with (summary.json's ``tool_parser``; older
        recordings, or an engine elsewhere, did not record it)."""
        return sorted(
            {str(r.summary["tool_parser"]) for g in self.groups.values() for r in g if r.summary.get("tool_parser")}
        )

    def check_tool_parser(self, parser: str | None) -> None:
        """ValueError when the rollouts were read by different parsers, or by another than `parser` (the one this
        run's model is served with): their calls and replies would be judged by two rules in one step."""
        have = self.tool_parsers
        if len(have) > 1:
            raise ValueError(f"from_rollouts: the recording mixes rollouts read by different tool parsers: {have}")
        if have and parser and have[0] != parser:
            raise ValueError(
                f"from_rollouts: the rollouts' tool calls were read by the {have[0]!r} parser, this run's model by "
                f"{parser!r} (set --tool-parser {have[0]} to train on them as recorded)"
            )

    @property
    def isolations(self) -> list[str]:
        """The sandbox modes the rollouts were captured under (from their summaries)."""
        return sorted({str(r.summary.get("isolation", "unknown")) for g in self.groups.values() for r in g})

    def results(self, task_id: str, group_size: int) -> tuple[list[RolloutResult], dict[str, int]]:
        """The task's first `group_size` rollouts (unscored placeholders where it has fewer) and counters."""
        if task_id not in self.groups:
            raise ValueError(f"task {task_id!r} is not in the recording {self.root}")
        have = self.groups[task_id]
        out = have[:group_size]
        missing = group_size - len(out)
        out += [
            RolloutResult(f"missing-{i}", task_id, NOT_RECORDED, "no such rollout in the recording", None, None, {})
            for i in range(missing)
        ]
        return out, {"rollouts_not_recorded": missing, "rollouts_unused": max(0, len(have) - group_size)}

    def check_vocabulary(self, vocab_size: int) -> None:
        """ValueError when a recorded token id is outside the trainer's vocabulary (another tokenizer's ids)."""
        for results in self.groups.values():
            for r in results:
                assert r.out_dir is not None
                top = max(
                    (
                        i
                        for c in load_trace(r.out_dir / "trace.json")
                        for i in (c.get("prompt_token_ids") or []) + (c.get("completion_token_ids") or [])
                    ),
                    default=-1,
                )
                if top >= vocab_size:
                    raise ValueError(
                        f"from_rollouts: {r.out_dir} holds token id {top}, outside the trainer's "
                        f"vocabulary ({vocab_size}): recorded with another tokenizer"
                    )


def _rollout_folders(root: Path) -> list[Path]:
    """Folders holding trace.json + summary.json. A rollout folder is not searched further: its workspace/ holds
    whatever the agent wrote, which must never pass for a rollout."""
    found = []
    for here, dirs, files in os.walk(root):
        if "trace.json" in files and "summary.json" in files:
            found.append(Path(here))
            dirs[:] = []
        else:
            dirs.sort()
    return sorted(found)


def load_recording(root: Path | str, *, temperature: float) -> Recording:
    """Every rollout folder under `root`, grouped by task. ValueError for an empty recording or a sampling
    temperature other than `temperature`."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"from_rollouts: {root} is not a folder")
    folders = _rollout_folders(root)
    if not folders:
        raise ValueError(f"from_rollouts: no rollout folders (trace.json + summary.json) under {root}")
    groups: dict[str, list[RolloutResult]] = {}
    models: list[str] = []
    wrong_t: list[str] = []
    for folder in folders:
        try:
            s: dict[str, Any] = json.loads((folder / "summary.json").read_text())
            task_id, status = str(s["task_id"]), str(s["status"])
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(
                f"from_rollouts: {folder}/summary.json is unreadable or lacks task_id/status: {exc}"
            ) from None
        t = s.get("temperature")
        if t is not None and abs(float(t) - temperature) > 1e-9:
            wrong_t.append(f"{folder.name} (T={t})")
        if s.get("model") and s["model"] not in models:
            models.append(str(s["model"]))
        reward = s.get("reward")
        groups.setdefault(task_id, []).append(
            RolloutResult(
                s.get("rollout_id") or folder.name,
                task_id,
                status,
                s.get("reason"),
                None if reward is None else float(reward),
                folder,
                s,
            )
        )
    if wrong_t:
        raise ValueError(
            f"from_rollouts: sampled at another temperature than the trainer's {temperature}: "
            f"{', '.join(wrong_t[:5])}{' ...' if len(wrong_t) > 5 else ''}; the importance ratios "
            "would compare different distributions (set --temperature to the recording's)"
        )
    return Recording(root, groups, models)
