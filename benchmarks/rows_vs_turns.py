"""Rows vs per-turn: tokens forwarded per trained token, and the loss agreement of the two layouts.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rows_vs_turns.py            # ~3 min on 2 cores
    .venv/bin/python benchmarks/rows_vs_turns.py --turns 5 --no-loss          # token counts only

Conversations:
- the captured multi-turn opencode rollouts shipped in ``workbench/data/rollouts`` (SmolLM2 through the real
  harness and proxy; two of the three forked), plus any folder given with ``--rollouts``;
- synthetic 5/10/20-turn agent conversations rendered with the real Qwen2.5 tokenizer and the qwen2_5 tool
  template (`workbench.engine.assets.build_tokenizer`, as tests/test_turns.py does): opencode's real system prompt
  and 9 tools (7,097 tokens, from the ``tiny-humaneval`` capture), the task, then per turn one assistant tool
  call (``write``/``bash``/``read``/``edit``, 100-300 tokens) and its tool result (50-400 tokens). A turn's
  output ids are the template's rendering of its assistant message up to ``<|im_end|>`` (what the model
  samples); its prompt is the rendering of everything before it. They chain by construction, which the
  script checks (a fork would be reported, not hidden).

Both layouts come from `workbench.turns.derive`: `build_rows` (turns chained into rows) vs one row per turn
(``prompt_ids + output_ids``, mask 1 on the output). Every sampled token is trained here (``trained=True`` on
every turn), so "trained tokens" = sampled tokens, equal in both layouts. Tokens forwarded per trained token
= row tokens / trained tokens; the saving is per-turn tokens / chained tokens.

Loss agreement: the ``tiny`` asset (random-init Qwen3 shape, float32) scores every sampled token in both
layouts (`workbench.train.experimental.fused_logprobs.sampled_logprobs`: hidden states, LM head on the sampled
positions only), and GRPO's clipped surrogate (ε = 0.2, no KL) is taken as a token-mean over the
conversation's sampled tokens (`grpo_loss`, the per-turn rows' sums divided by the conversation's total),
with one advantage per conversation (+1.0) and logp_old = the model's own logprobs plus N(0, 0.2) noise
(seeded), so both sides of the clip are exercised. Agreement: |loss_chained - loss_per_turn| ≤ 1e-5.
Prints a table and writes a new benchmarks/results/rows_vs_turns/<date>_<host>.json per run (benchmarks/run_file.py: never an earlier run's file).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file
from run_file import host, new_run_file
from workbench.turns import Row, build_rows, Turn, derive_turns, load_trace

FIXTURES = ROOT / "workbench" / "data" / "rollouts"
TOLERANCE = 1e-5


# -- conversations ----------------------------------------------------------------------------------


def captured(folders: list[Path]) -> list[tuple[str, list[Turn]]]:
    """Agent turns of every captured rollout with ≥ 2 of them, all marked trained."""
    out = []
    for folder in folders:
        turns, _ = derive_turns(load_trace(folder / "trace.json"), lambda call: True)
        if len(turns) >= 2:
            out.append((f"captured/{folder.name}", turns))
    return out


def _code(rng: random.Random, lines: int) -> str:
    names = ["total", "items", "value", "result", "index", "count", "text", "parts", "left", "right"]
    body = []
    for _ in range(lines):
        a, b = rng.sample(names, 2)
        body.append(
            rng.choice(
                [
                    f"    {a} = {b} + {rng.randrange(100)}",
                    f"    if {a} > {b}:\n        return {a}",
                    f"    for {a} in range(len({b})):",
                    f"    {a}.append({b}[{rng.randrange(9)}])",
                ]
            )
        )
    return f"def solve_{rng.randrange(1000)}(items):\n" + "\n".join(body) + "\n    return items\n"


def _tool_call(rng: random.Random, k: int) -> tuple[dict[str, Any], str]:
    """An assistant message with one tool call (~100-300 tokens) and the tool's result (~50-400 tokens)."""
    kind = ("write", "bash", "read", "edit")[k % 4]
    if kind == "write":
        args = {"filePath": "solution.py", "content": _code(rng, rng.randrange(12, 40))}
        result = "Wrote file successfully."
    elif kind == "bash":
        args = {"command": f"python -m pytest -q tests/test_{rng.randrange(99)}.py", "description": "run the tests"}
        result = "\n".join(
            f"tests/test_x.py::test_{i} {'PASSED' if rng.random() < 0.7 else 'FAILED'}"
            for i in range(rng.randrange(5, 40))
        )
    elif kind == "read":
        args = {"filePath": "solution.py"}
        result = "\n".join(f"{i:05d}| {line}" for i, line in enumerate(_code(rng, rng.randrange(8, 30)).split("\n")))
    else:
        args = {"filePath": "solution.py", "oldString": _code(rng, 4), "newString": _code(rng, rng.randrange(6, 20))}
        result = "Edit applied successfully."
    text = f"I will use {kind} next." if rng.random() < 0.5 else ""
    message = {
        "role": "assistant",
        "content": text,
        "tool_calls": [{"id": f"call_{k}", "type": "function", "function": {"name": kind, "arguments": args}}],
    }
    return message, result


def synthetic(tok: Any, n_turns: int, seed: int = 0) -> tuple[str, list[Turn]]:
    call = next(c for c in load_trace(FIXTURES / "tiny-humaneval" / "trace.json") if c["purpose"] == "agent")
    tools = call["request"]["tools"]
    messages = list(call["request"]["messages"])
    rng = random.Random(seed + n_turns)
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def render(msgs: list[dict[str, Any]], generation: bool) -> list[int]:
        return tok.apply_chat_template(
            msgs, tools=tools, add_generation_prompt=generation, tokenize=True, return_dict=False
        )

    turns = []
    for k in range(n_turns):
        prompt = render(messages, True)
        assistant, result = _tool_call(rng, k)
        full = render(messages + [assistant], False)
        output = full[len(prompt) : full.index(end, len(prompt)) + 1]  # what the model samples, <|im_end|> included
        assert full[: len(prompt)] == prompt, "the template does not extend the prompt"
        turns.append(
            Turn(
                index=k, call=k, prompt_ids=prompt, output_ids=output, per_token_logps=[0.0] * len(output), trained=True
            )
        )
        messages += [assistant, {"role": "tool", "tool_call_id": f"call_{k}", "content": result}]
    return f"synthetic/{n_turns}-turn", turns


# -- layouts and loss -------------------------------------------------------------------------------


def per_turn_rows(turns: list[Turn]) -> list[Row]:
    """One row per turn: its prompt and its output, mask 1 on the output."""
    return [
        Row(
            t.prompt_ids + t.output_ids,
            [0] * len(t.prompt_ids) + [1] * len(t.output_ids),
            [0.0] * len(t.prompt_ids) + list(t.per_token_logps),
            [0] * len(t.prompt_ids) + [1] * len(t.output_ids),
            [t.index],
            [(0, len(t.prompt_ids), len(t.prompt_ids) + len(t.output_ids))],
        )
        for t in turns
    ]


def _logprobs(model: Any, rows: list[Row]) -> list[Any]:
    """Per row: the float32 logprob of each mask-1 token, in row order."""
    import torch

    from workbench.train.experimental.fused_logprobs import sampled_logprobs

    out = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor(row.input_ids)
            hidden = model.model(input_ids=ids[None]).last_hidden_state[0]
            logp, _ = sampled_logprobs(hidden, model.lm_head.weight, ids, torch.tensor(row.mask), chunk_size=512)
            out.append(logp)
    return out


def loss_agreement(model: Any, turns: list[Turn], seed: int) -> dict[str, Any]:
    """GRPO token-mean loss over the chained rows vs over one row per turn, same advantages and logp_old."""
    import torch

    from workbench.train.experimental.fused_logprobs import grpo_loss

    chained, _ = build_rows(turns)
    t0 = time.perf_counter()
    logp_chained = torch.cat(_logprobs(model, chained))
    t1 = time.perf_counter()
    logp_turns = torch.cat(_logprobs(model, per_turn_rows(turns)))
    t2 = time.perf_counter()
    n = logp_chained.numel()
    assert n == logp_turns.numel() == sum(len(t.output_ids) for t in turns)
    g = torch.Generator().manual_seed(seed)
    logp_old = logp_chained + 0.2 * torch.randn(n, generator=g)
    advantages = torch.ones(n)
    a = grpo_loss(logp_chained, logp_old, advantages, num_tokens=n).item()
    b = grpo_loss(logp_turns, logp_old, advantages, num_tokens=n).item()
    return {
        "loss_chained": a,
        "loss_per_turn": b,
        "abs_diff": abs(a - b),
        "max_abs_logprob_diff": (logp_chained - logp_turns).abs().max().item(),
        "agree": abs(a - b) <= TOLERANCE,
        "forward_s_chained": round(t1 - t0, 2),
        "forward_s_per_turn": round(t2 - t1, 2),
    }


def measure(name: str, turns: list[Turn], model: Any | None, seed: int) -> dict[str, Any]:
    chained, forks = build_rows(turns)
    trained = sum(len(t.output_ids) for t in turns)
    chained_tokens = sum(len(r.input_ids) for r in chained)
    per_turn_tokens = sum(len(t.prompt_ids) + len(t.output_ids) for t in turns)
    record = {
        "conversation": name,
        "turns": len(turns),
        "rows": len(chained),
        "forks": len(forks),
        "trained_tokens": trained,
        "chained_tokens": chained_tokens,
        "per_turn_tokens": per_turn_tokens,
        "chained_per_trained": chained_tokens / trained,
        "per_turn_per_trained": per_turn_tokens / trained,
        "saving": per_turn_tokens / chained_tokens,
    }
    if model is not None:
        record.update(loss_agreement(model, turns, seed))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[5, 10, 20], help="synthetic conversation lengths")
    parser.add_argument(
        "--rollouts", type=Path, nargs="*", default=[], help="more captured rollout folders (each with a trace.json)"
    )
    parser.add_argument("--no-loss", action="store_true", help="token counts only (no model)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from workbench.engine import build_tokenizer

    started = dt.datetime.now(dt.timezone.utc)
    model = None
    if not args.no_loss:
        import torch
        from transformers import AutoModelForCausalLM

        from workbench.engine import build_asset

        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_pretrained(build_asset("tiny").path, dtype=torch.float32).eval()
    tok = build_tokenizer()
    folders = sorted(p for p in FIXTURES.iterdir() if (p / "trace.json").exists()) + list(args.rollouts)
    conversations = captured(folders) + [synthetic(tok, n, args.seed) for n in args.turns]
    records = [measure(name, turns, model, args.seed) for name, turns in conversations]

    print(
        f"{'conversation':<34} {'turns':>5} {'rows':>4} {'trained':>7} {'chained':>8} {'per-turn':>9} "
        f"{'fwd/trained':>12} {'saving':>7} {'loss chained':>13} {'loss per-turn':>13} {'|Δ|':>8}"
    )
    for r in records:
        loss = (
            f"{r['loss_chained']:>13.8f} {r['loss_per_turn']:>13.8f} {r['abs_diff']:>8.1e}"
            if "loss_chained" in r
            else ""
        )
        print(
            f"{r['conversation']:<34} {r['turns']:>5} {r['rows']:>4} {r['trained_tokens']:>7} "
            f"{r['chained_tokens']:>8} {r['per_turn_tokens']:>9} "
            f"{r['chained_per_trained']:>5.1f} / {r['per_turn_per_trained']:<5.1f} {r['saving']:>6.2f}x {loss}"
        )
    record = {
        "benchmark": "rows_vs_turns",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/rows_vs_turns.py", *sys.argv[1:]]),
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "host": host(),
        "tolerance": TOLERANCE,
        "conversations": records,
    }
    path = new_run_file("rows_vs_turns")
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    if model is not None and not all(r["agree"] for r in records):
        sys.exit(1)


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()
