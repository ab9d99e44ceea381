"""Re-scoring a captured SmolLM2 trace under two policies on the tiny model (random Qwen3 with the Qwen
vocabulary, so SmolLM2's ids < 49152 fit): exact zeros where the policies agree, non-zero where an
adapter changes the model, scores equal to the model's plain forward, token parts, the view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from workbench.engine import build_asset
from workbench.evaluate.rescoring import RescoreResult, delta_widget, render_delta, rescore, token_parts
from workbench.turns import analyse, load_trace

FIXTURES = Path(__file__).parent.parent / "workbench" / "data" / "rollouts"
EASY = FIXTURES / "smollm2-easy"  # two turns in one row: a write call (53 tokens, trained), a reply (14)


@pytest.fixture(scope="module")
def tiny():
    return build_asset("tiny").path


@pytest.fixture(scope="module")
def smol_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FIXTURES / "smollm2-tokenizer")


@pytest.fixture(scope="module")
def adapters(tiny, tmp_path_factory):
    """zero: PEFT's initial LoRA (B = 0); late: non-zero only in layer 1 (the last of 2); twin: a copy of late."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("adapters")
    targets = ["q_proj", "v_proj", "down_proj"]
    for name, layers in (("zero", None), ("late", [1])):
        model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        peft = get_peft_model(
            model,
            LoraConfig(r=4, lora_alpha=8, target_modules=targets, layers_to_transform=layers, task_type="CAUSAL_LM"),
        )
        if name == "late":
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for n, p in peft.named_parameters():
                    if "lora_B" in n:
                        p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        peft.save_pretrained(root / name)
        if name == "late":
            peft.save_pretrained(root / "twin")
    return root


def test_a_policy_against_itself_is_exactly_zero(tiny, adapters, smol_tok):
    for a, b in ((None, None), (adapters / "late", adapters / "twin"), (None, adapters / "zero")):
        result = rescore(EASY, tiny, a, b, smol_tok)
        assert len(result.tokens) == 53 and all(t.delta == 0.0 for t in result.tokens), (a, b)


def test_a_changed_adapter_moves_the_logprobs(tiny, adapters, smol_tok):
    late = rescore(EASY, tiny, None, adapters / "late", smol_tok)
    assert sum(t.delta != 0.0 for t in late.tokens) == len(late.tokens) == 53
    assert max(abs(t.delta) for t in late.tokens) > 1e-3
    # a zero adapter as A is the base model: the same deltas, to the bit
    via_zero = rescore(EASY, tiny, adapters / "zero", adapters / "late", smol_tok)
    assert [t.delta for t in via_zero.tokens] == [t.delta for t in late.tokens]
    s = late.summary(top=3)
    assert (
        s["n"] == 53
        and len(s["top_increased"]) <= 3
        and set(s["by_part"]) <= {"tool_name", "arguments", "code", "tool_syntax", "text", "special"}
    )


def test_scores_are_the_models_plain_forward_at_the_trace_temperature(tiny, adapters, smol_tok):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    calls = load_trace(EASY / "trace.json")
    row = analyse(calls).rows[0]
    result = rescore(calls, tiny, None, adapters / "late", smol_tok, positions="sampled")
    assert result.temperature == 0.5 and result.positions == "sampled" and len(result.tokens) == 67
    # Independently: the plain forward on the last k positions (logits_to_keep=int, another slicing path)
    k = len(row.input_ids) - min(t.position for t in result.tokens) + 1
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    ids = torch.tensor([row.input_ids])
    with torch.no_grad():
        want_a = (base(ids, logits_to_keep=k).logits[0] / 0.5).log_softmax(-1)
        tuned = PeftModel.from_pretrained(base, str(adapters / "late")).eval()
        want_b = (tuned(input_ids=ids, logits_to_keep=k).logits[0] / 0.5).log_softmax(-1)
    first = len(row.input_ids) - k  # want_x[j] predicts position first + j + 1
    for t in result.tokens:
        assert t.id == row.input_ids[t.position] and t.captured == row.logprobs[t.position]
        assert t.a == pytest.approx(want_a[t.position - 1 - first, t.id].item(), abs=1e-5)
        assert t.b == pytest.approx(want_b[t.position - 1 - first, t.id].item(), abs=1e-5)
    # the sampled tokens are the trace's, in order, with their own texts
    agent = [c for c in calls if c["purpose"] == "agent"]
    assert [t.id for t in result.tokens] == [i for c in agent for i in c["completion_token_ids"]]
    assert "".join(t.text for t in result.tokens[:53]) == smol_tok.decode(agent[0]["completion_token_ids"])


def test_token_parts_of_a_captured_write_call(smol_tok):
    out = [c for c in load_trace(EASY / "trace.json") if c["purpose"] == "agent"]
    texts, parts = token_parts(smol_tok, out[0]["completion_token_ids"])
    by = {}
    for text, part in zip(texts, parts):
        by.setdefault(part, "")
        by[part] += text
    assert by["tool_name"] == "write"
    assert by["code"] == "def subtract(a, b):\\n    return a - b;\\n"
    assert "solution.py" in by["arguments"] and "<tool_call>" not in by["arguments"]
    assert by["tool_syntax"].startswith("<tool_call>") and by["special"] == "<|im_end|>"
    texts, parts = token_parts(smol_tok, out[1]["completion_token_ids"])
    assert set(parts[:-1]) == {"text"} and parts[-1] == "special"


def test_token_parts_with_the_qwen_tokenizer(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    text = 'Sure.<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
    texts, parts = token_parts(tok, tok.encode(text))
    got = {p: "".join(t for t, q in zip(texts, parts) if q == p) for p in set(parts)}
    assert got["text"] == "Sure." and got["tool_name"] == "bash" and "ls -la" in got["arguments"]
    assert "code" not in got  # a shell command is an argument, not code
    assert "<tool_call>" in got["tool_syntax"] and "</tool_call>" in got["tool_syntax"]


def test_view_renders_headless_with_the_tokens(tiny, adapters, smol_tok):
    result = rescore(EASY, tiny, None, adapters / "late", smol_tok)
    page = render_delta(result)
    assert page.startswith("<style>") and "<script" not in page
    assert ">write<" in page and "> subtract<" in page
    assert "most increased" in page and "most decreased" in page and "wb-part-code" in page
    assert delta_widget(result, interactive=False) == page
    assert render_delta(result, parts=("tool_name",)).count('class="wb-tok') == 1
    empty = RescoreResult(model="m", policy_a="base", policy_b="base", temperature=1.0, positions="trained", tokens=[])
    assert "no labelled tokens" in render_delta(empty)
    json.dumps(result.to_json())  # serialisable as is
    widget = delta_widget(result)
    assert type(widget).__name__ == "VBox"


def test_view_names_the_policies_as_a_reader_knows_them_never_by_a_path(tiny, adapters, smol_tok):
    head = render_delta(rescore(EASY, tiny, None, adapters / "late", smol_tok)).split("</div>")[0]
    assert "<b>A</b> base vs <b>B</b> late on tiny:" in head and str(adapters) not in head and str(tiny) not in head
    named = rescore(EASY, tiny, None, adapters / "late", smol_tok, names=("base", "step 8 adapter"))
    assert "<b>A</b> base vs <b>B</b> step 8 adapter on tiny:" in render_delta(named)
