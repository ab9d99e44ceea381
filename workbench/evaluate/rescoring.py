"""Re-score one captured trace under two policies: which sampled tokens did training make more or less likely?

The rows are the trainer's (`workbench.turns.derive.analyse`: the engine's own ids, never re-tokenised); each
labelled position (mask 1: the sampled tokens of trained turns, or every sampled token with
``positions="sampled"``) is scored under policy A (the base model, or an adapter) and policy B (an
adapter), in float32 on CPU with transformers + PEFT, at the temperature the trace was sampled at.

    from workbench.evaluate.rescoring import rescore, render_delta, delta_widget
    result = rescore(Path("runs/x/rollouts/easy-13__00"), load("smollm2").path,
                     adapter_b="runs/<grpo>/adapters/final", names=("base", "step 8 adapter"))
    result.summary()["by_part"]          # mean delta for tool_name / arguments / code / text / ...
    HTML(render_delta(result))           # tokens coloured by delta; hover shows both logprobs
    delta_widget(result, interactive=False)   # headless: the same static HTML

Each token carries its ``part`` of the assistant text, from the decoded output of its turn: inside a
``<tool_call>`` block the ``"name"`` value is ``tool_name``, a code-holding argument's string value
(`CODE_KEYS`: write's content, edit's new/old strings) is ``code``, the rest of ``"arguments"``'s value is
``arguments``, the block's other characters are ``tool_syntax``; outside, ``text``; special tokens
(``<|im_end|>``) are ``special``. A token gets the part most of its characters have.

The forward is the model's own (PEFT's with an adapter) with transformers' ``logits_to_keep`` set to
the positions before the labelled tokens: no attention or LM head is written here, and only those
positions' logits are made.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from workbench.turns import analyse, load_trace, Tokenizer, decode_text
from workbench.views import STYLE, token_texts

__all__ = [
    "TokenDelta",
    "RescoreResult",
    "rescore",
    "token_parts",
    "render_delta",
    "delta_widget",
    "PARTS",
    "Part",
    "Positions",
    "CODE_KEYS",
]

Part = Literal["tool_name", "arguments", "code", "tool_syntax", "text", "special"]
PARTS: tuple[Part, ...] = ("tool_name", "arguments", "code", "tool_syntax", "text", "special")
Positions = Literal["trained", "sampled"]  # which tokens are scored: the trained (masked) ones or every sampled one
CODE_KEYS = ("content", "newString", "oldString", "new_string", "old_string")
# Positions scored per forward: 512 x 152k vocabulary x 4 bytes = 311 MB of logits at most (a whole
# 3k-token row would be 1.8 GB). A row's trained tokens are fewer than this, so it is one forward.
_CHUNK = 512


@dataclass
class TokenDelta:
    """One labelled token: where it is, what it is, its logprob as captured and under A and B."""

    row: int
    turn: int
    position: int  # in the row
    index: int  # in its turn's sampled output
    id: int
    text: str
    part: Part
    captured: float  # the engine's logprob when it was sampled
    a: float
    b: float

    @property
    def delta(self) -> float:
        return self.b - self.a


@dataclass
class RescoreResult:
    """The labelled tokens scored under A and B; ``model``, ``policy_a`` and ``policy_b`` are names as a reader
    knows them (the asset, "base", the adapter's), not paths."""

    model: str
    policy_a: str
    policy_b: str
    temperature: float
    positions: Positions
    tokens: list[TokenDelta]

    def summary(self, top: int = 10) -> dict[str, Any]:
        """Mean delta overall and by part; the `top` most increased and decreased tokens."""

        def stats(ts: list[TokenDelta]) -> dict[str, Any]:
            n = len(ts)
            return {
                "n": n,
                "mean_delta": sum(t.delta for t in ts) / n if n else None,
                "mean_abs_delta": sum(abs(t.delta) for t in ts) / n if n else None,
            }

        ranked = sorted(self.tokens, key=lambda t: t.delta)
        brief: list[dict[str, Any]] = [
            {"text": t.text, "part": t.part, "turn": t.turn, "index": t.index, "delta": t.delta, "a": t.a, "b": t.b}
            for t in ranked
        ]
        return {
            **stats(self.tokens),
            "by_part": {
                p: stats([t for t in self.tokens if t.part == p])
                for p in PARTS
                if any(t.part == p for t in self.tokens)
            },
            "max_abs_captured_vs_a": max((abs(t.captured - t.a) for t in self.tokens), default=None),
            "top_increased": [x for x in brief[::-1][:top] if x["delta"] > 0],
            "top_decreased": [x for x in brief[:top] if x["delta"] < 0],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in asdict(self).items() if k != "tokens"},
            "tokens": [{**asdict(t), "delta": t.delta} for t in self.tokens],
            "summary": self.summary(),
        }


# -- which part of the assistant text a token is -------------------------------------------------------

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_STRING = r'"((?:[^"\\]|\\.)*)'  # a JSON string's body (to its end, or the text's end when cut short)


def _char_parts(text: str) -> list[Part]:
    parts: list[Part] = ["text"] * len(text)
    for block in _BLOCK.finditer(text):
        lo, hi = block.span()
        parts[lo:hi] = ["tool_syntax"] * (hi - lo)
        body, off = block.group(1), block.start(1)
        name = re.search(r'"name"\s*:\s*' + _STRING, body)
        if name:
            parts[off + name.start(1) : off + name.end(1)] = ["tool_name"] * (name.end(1) - name.start(1))
        args = re.search(r'"arguments"\s*:\s*', body)
        if not args:
            continue
        end = body.rfind("}")  # the outer object's close; what is before it is the arguments' value
        a_lo, a_hi = off + args.end(), off + (end if end > args.end() else len(body))
        parts[a_lo:a_hi] = ["arguments"] * (a_hi - a_lo)
        for m in re.finditer(r'"(?:' + "|".join(CODE_KEYS) + r')"\s*:\s*' + _STRING, body[args.end() :]):
            s, e = off + args.end() + m.start(1), off + args.end() + m.end(1)
            parts[s:e] = ["code"] * (e - s)
    return parts


def token_parts(tokenizer: Tokenizer, ids: Sequence[int]) -> tuple[list[str], list[Part]]:
    """Per token of one sampled output: its own text and its part (see the module docstring)."""
    texts = token_texts(tokenizer, ids)
    special = set(tokenizer.all_special_ids)
    # Character offsets from prefix decodes: a token's own decode can differ from its share of the
    # whole (a multi-byte character split over two tokens decodes as U+FFFD alone).
    bounds = [len(decode_text(tokenizer, ids[:k], skip_special_tokens=False)) for k in range(len(ids) + 1)]
    full = decode_text(tokenizer, ids, skip_special_tokens=False)
    chars = _char_parts(full)
    parts: list[Part] = []
    for k, tid in enumerate(ids):
        span = chars[bounds[k] : max(bounds[k], bounds[k + 1])]
        parts.append("special" if tid in special else Counter(span).most_common(1)[0][0] if span else "text")
    return texts, parts


# -- scoring ---------------------------------------------------------------------------------------------


def _policy(model: Any, name: str | None) -> Any:
    import contextlib

    if name is None:
        return model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()
    model.set_adapter(name)
    return contextlib.nullcontext()


def _score(model: Any, input_ids: list[int], targets: list[int], temperature: float) -> list[float]:
    """log p(input_ids[t] | input_ids[:t]) at `temperature` for each t in `targets`: the model's own forward
    (PEFT's when adapted), logits only at the positions before the targets (transformers' `logits_to_keep`)."""
    import torch

    ids = torch.tensor([input_ids])
    out: list[float] = []
    with torch.no_grad():
        for c in range(0, len(targets), _CHUNK):
            pos = torch.tensor(targets[c : c + _CHUNK])
            logits = model(input_ids=ids, logits_to_keep=pos - 1).logits[0].float() / temperature
            out += logits.log_softmax(-1).gather(-1, ids[0, pos][:, None])[:, 0].tolist()
    return out


def rescore(
    rollout: Path | str | list[dict[str, Any]],
    model_path: Path | str,
    adapter_a: Path | str | None = None,
    adapter_b: Path | str | None = None,
    tokenizer: Tokenizer | None = None,
    *,
    positions: Positions = "trained",
    temperature: float | None = None,
    names: tuple[str | None, str | None] = (None, None),
) -> RescoreResult:
    """Score every labelled token of the trace's rows under A (`adapter_a`, or the base model when None)
    and B (`adapter_b`, or the base model). `tokenizer` decodes (default: `model_path`'s); the trace's
    sampling temperature is used unless `temperature` is given. `names`: what the view calls A and B (e.g.
    "base", "step 8 adapter"); by default "base" or the adapter's folder name, never a path of this machine."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench._compat import quiet_known_noise

    calls = load_trace(Path(rollout) / "trace.json") if isinstance(rollout, (str, Path)) else rollout
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
    if temperature is None:
        temps = {
            t
            for c in calls
            if c.get("purpose", "agent") == "agent"
            and c.get("per_token_logps") is not None
            and (t := (c.get("sampling_params") or {}).get("temperature")) is not None
        }
        if len(temps) > 1:
            raise ValueError(f"the trace was sampled at several temperatures {sorted(temps)}: pass temperature=")
        temperature = float(temps.pop()) if temps else 1.0
    quiet_known_noise()  # PEFT reads transformers' deprecated `is_gradient_checkpointing`
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    loaded: dict[str, str | None] = {"a": None, "b": None}
    if adapter_a or adapter_b:
        from peft import PeftModel

        for side, path in (("a", adapter_a), ("b", adapter_b)):
            if path is None:
                continue
            if isinstance(model, PeftModel):
                model.load_adapter(str(path), adapter_name=side)
            else:
                model = PeftModel.from_pretrained(model, str(path), adapter_name=side)
            loaded[side] = side
        model.eval()
    analysed = analyse(calls)
    turns = {t.index: t for t in analysed.turns}
    tokens: list[TokenDelta] = []
    for r, row in enumerate(analysed.rows):
        label = row.mask if positions == "trained" else row.sampled
        targets = [i for i, m in enumerate(label) if m]
        if not targets:
            continue
        scores = {}
        for side in ("a", "b"):
            with _policy(model, loaded[side]):
                scores[side] = _score(model, row.input_ids, targets, temperature)
        where: dict[int, tuple[int, int]] = {}
        decoded: dict[int, tuple[list[str], list[Part]]] = {}
        for t_index, (_, out_start, end) in zip(row.turns, row.spans):
            for i in range(out_start, end):
                where[i] = (t_index, i - out_start)
        for k, i in enumerate(targets):
            t_index, j = where[i]
            if t_index not in decoded:
                decoded[t_index] = token_parts(tokenizer, turns[t_index].output_ids)
            texts, parts = decoded[t_index]
            tokens.append(
                TokenDelta(
                    row=r,
                    turn=t_index,
                    position=i,
                    index=j,
                    id=row.input_ids[i],
                    text=texts[j],
                    part=parts[j],
                    captured=row.logprobs[i],
                    a=scores["a"][k],
                    b=scores["b"][k],
                )
            )
    return RescoreResult(
        model=Path(model_path).name,  # the asset's name (smollm2), as the reader knows it
        policy_a=names[0] or _policy_name(adapter_a),
        policy_b=names[1] or _policy_name(adapter_b),
        temperature=temperature,
        positions=positions,
        tokens=tokens,
    )


def _policy_name(adapter: Path | str | None) -> str:
    return Path(adapter).name if adapter else "base"


# -- the view --------------------------------------------------------------------------------------------

_DELTA_STYLE = """<style>
.wb-up{background:rgba(22,163,74,var(--a))}.wb-down{background:rgba(220,38,38,var(--a))}
.wb-part-tool_name{text-decoration:underline 2px #2563eb}.wb-part-code{font-weight:600}
</style>"""


def render_delta(result: RescoreResult, *, parts: Sequence[str] = PARTS, top: int = 10) -> str:
    """Tokens coloured by delta (green: B made it more likely, red: less; intensity |delta| / the largest),
    hover for both logprobs; a table by part; the most increased and decreased tokens."""
    shown = [t for t in result.tokens if t.part in parts]
    scale = max((abs(t.delta) for t in shown), default=0.0) or 1.0
    spans, turn = [], None
    for t in shown:
        if t.turn != turn and turn is not None:
            spans.append('<span class="wb-turn" title="next turn"></span>')
        turn = t.turn
        cls = "wb-up" if t.delta > 0 else "wb-down" if t.delta < 0 else ""
        tip = (
            f"turn {t.turn} #{t.index} id {t.id} · {t.part} · A {t.a:.4f} · B {t.b:.4f} · "
            f"delta {t.delta:+.4f} · captured {t.captured:.4f}"
        )
        text = html.escape(t.text).replace("\n", "↵\n") or "∅"
        spans.append(
            f'<span class="wb-tok {cls} wb-part-{t.part}" style="--a:{abs(t.delta) / scale:.3f}" '
            f'title="{html.escape(tip)}">{text}</span>'
        )
    s = result.summary(top)
    by_part = "".join(
        f"<tr><td>{p}</td><td>{v['n']}</td><td>{v['mean_delta']:+.4f}</td><td>{v['mean_abs_delta']:.4f}</td></tr>"
        for p, v in s["by_part"].items()
    )

    def ranked(rows: list[dict[str, Any]]) -> str:
        return "".join(
            f"<tr><td>{html.escape(json.dumps(x['text']))}</td><td>{x['part']}</td><td>{x['turn']}:{x['index']}</td>"
            f"<td>{x['delta']:+.4f}</td><td>{x['a']:.4f}</td><td>{x['b']:.4f}</td></tr>"
            for x in rows
        )

    head = (
        f"<div><b>A</b> {html.escape(result.policy_a)} vs <b>B</b> {html.escape(result.policy_b)} on "
        f"{html.escape(result.model)}: {len(result.tokens)} {result.positions} tokens at T={result.temperature:g}; "
        f"mean delta {s['mean_delta'] if s['mean_delta'] is None else format(s['mean_delta'], '+.4f')}</div>"
    )
    cols = "<tr><th>token</th><th>part</th><th>turn:#</th><th>delta</th><th>A</th><th>B</th></tr>"
    return (
        f"{STYLE}{_DELTA_STYLE}{head}<div class='wb-tokens'>{''.join(spans) or '<i>no labelled tokens</i>'}</div>"
        f"<table class='wb-table'><tr><th>part</th><th>tokens</th><th>mean delta</th><th>mean |delta|</th></tr>{by_part}</table>"
        f"<div><b>most increased</b></div><table class='wb-table'>{cols}{ranked(s['top_increased'])}</table>"
        f"<div><b>most decreased</b></div><table class='wb-table'>{cols}{ranked(s['top_decreased'])}</table>"
    )


def delta_widget(result: RescoreResult, *, interactive: bool = True) -> Any:
    """`render_delta` with a part filter (ipywidgets); with ``interactive=False`` (headless) the same view
    as static HTML."""
    if not interactive:
        return render_delta(result)
    import ipywidgets as w

    present = [p for p in PARTS if any(t.part == p for t in result.tokens)]
    pick = w.SelectMultiple(options=present, value=tuple(present), description="parts")
    out = w.HTML(render_delta(result))
    pick.observe(lambda *_: setattr(out, "value", render_delta(result, parts=pick.value)), "value")
    return w.VBox([pick, out])
