"""A vLLM tool-call parser for models that emit their calls without ``<tool_call>`` tags.

Loaded by vLLM, not by the workbench (it imports vLLM, which lives in the engine's own venv):

    vllm serve MODEL --enable-auto-tool-choice \\
        --tool-parser-plugin .../json_tool_calls.py --tool-call-parser workbench_json

Qwen2.5-Coder-0.5B-Instruct, asked through opencode, writes the right call as a bare JSON object
(``{"name": "write", "arguments": {"filePath": "solution.py", "content": ...}}``) or in a fenced
``json`` block, without the ``<tool_call>`` tags that vLLM's ``hermes`` parser needs, so the harness
executed nothing (0/16 first turns;
benchmarks/results/tool_call_modes/2026-12-02T092934_fc-v1045-amd-epyc.json). This parser reads, in order:

1. Hermes' tagged calls (``<tool_call>{...}</tool_call>``), exactly as ``hermes`` does;
2. otherwise the tail of the reply from the first line that opens with ``{`` or a ``` fence: one or
   more JSON objects (each optionally fenced) and nothing else after them.

A candidate counts as a call only if it names one of the request's tools and its arguments are valid
under that tool's JSON schema; anything else stays content, byte for byte. It only reads the sampled
text: the tokens, their ids and logprobs go to the client unchanged (the capture proxy records those),
and nothing constrains sampling. Streaming holds back the text from the first candidate line to the end
of the reply (vLLM still sends every token's id and logprob in its own chunk) and decides at the end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jsonschema
from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

__all__ = ["JsonToolCallParser", "parse_calls"]

_FENCE = "```"
_TAG = "<tool_call>"


def _candidate_start(text: str) -> int:
    """Offset of the first line that opens a possible call (``{``, a fence, the hermes tag), or -1."""
    tag = text.find(_TAG)
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.startswith(("{", _FENCE)):
            return offset if tag < 0 else min(offset, tag)
        offset += len(line)
    return tag


def _streamable(text: str) -> int:
    """How much of `text` may go out as content now: up to the first candidate, and never a last line
    that may still grow into one (a lone backtick, a partial ``<tool_call>``)."""
    start = _candidate_start(text)
    if start >= 0:
        return start
    last = text.rfind("\n") + 1
    tail = text[last:]
    if _FENCE.startswith(tail):
        return last
    for i in range(min(len(_TAG) - 1, len(tail)), 0, -1):
        if tail.endswith(_TAG[:i]):
            return len(text) - i
    return len(text)


def _tools_by_name(request: Any) -> dict[str, dict]:
    """The chat request's function tools, name -> JSON schema of the arguments."""
    return {
        tool.function.name: tool.function.parameters or {"type": "object"}
        for tool in request.tools or []
        if isinstance(tool, ChatCompletionToolsParam)
    }


def _valid(schema: dict, arguments: Any) -> bool:
    if not isinstance(arguments, dict):
        return False
    try:
        validator = jsonschema.validators.validator_for(schema)
        return validator(schema).is_valid(arguments)
    except jsonschema.SchemaError:
        return False


def parse_calls(text: str, tools: dict[str, dict]) -> tuple[list[tuple[str, dict]], str] | None:
    """The calls in the untagged tail of `text` and the content before them, or None if it holds none.

    The tail must be one or more JSON objects, each optionally inside a ``` fence (``json`` or no
    language), with only whitespace between and after; each must name a tool of the request and
    carry schema-valid ``arguments``."""
    start = _candidate_start(text)
    if start < 0:
        return None
    content, rest = text[:start], text[start:]
    decoder = json.JSONDecoder()
    calls: list[tuple[str, dict]] = []
    while rest.strip():
        rest = rest.lstrip()
        fenced = rest.startswith(_FENCE)
        if fenced:
            newline = rest.find("\n")
            if newline < 0 or rest[len(_FENCE) : newline].strip() not in ("", "json"):
                return None
            rest = rest[newline + 1 :].lstrip()
        try:
            obj, end = decoder.raw_decode(rest)
        except ValueError:
            return None
        if not isinstance(obj, dict) or set(obj) != {"name", "arguments"} or obj["name"] not in tools:
            return None
        if not _valid(tools[obj["name"]], obj["arguments"]):
            return None
        calls.append((obj["name"], obj["arguments"]))
        rest = rest[end:]
        if fenced:
            rest = rest.lstrip()
            if not rest.startswith(_FENCE):
                return None
            rest = rest[len(_FENCE) :]
    return (calls, content) if calls else None


@ToolParserManager.register_module("workbench_json")
class JsonToolCallParser(Hermes2ProToolParser):
    """Hermes' tagged calls, else bare or fenced JSON calls naming a request tool (see the module doc)."""

    # vLLM hands an engine-based parser each delta alone and calls `finish_streaming` at the end,
    # which the held-back tail needs.
    engine_based_streaming = True
    # Never a structural tag (hermes has one under VLLM_ENFORCE_STRICT_TOOL_CALLING): sampling stays
    # unconstrained, so the logprobs the trainer sees are the sampling distribution's.
    structural_tag_model = None

    def __init__(self, tokenizer: Any, tools: Any = None) -> None:
        super().__init__(tokenizer, tools)
        self._text = ""  # the whole reply so far
        self._sent = 0  # how much of it went out as content
        self._request: Any = None

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        if _TAG in model_output:
            tagged = super().extract_tool_calls(model_output, request)
            if tagged.tools_called:
                return tagged
        parsed = parse_calls(model_output, _tools_by_name(request))
        if parsed is None:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        calls, content = parsed
        return ExtractedToolCallInformation(
            tools_called=True,
            tool_calls=[
                ToolCall(
                    type="function",
                    function=FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)),
                )
                for name, arguments in calls
            ],
            content=content or None,
        )

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any,
    ) -> DeltaMessage | None:
        self._text += delta_text
        self._request = request
        stop = _streamable(self._text)
        if stop > self._sent:
            content = self._text[self._sent : stop]
            self._sent = stop
            return DeltaMessage(content=content)
        return None

    def finish_streaming(self) -> DeltaMessage | None:
        held = self._text[self._sent :]
        self._sent = len(self._text)
        if not held:
            return None
        info = self.extract_tool_calls(self._text, self._request) if self._request is not None else None
        if info is None or not info.tools_called:
            return DeltaMessage(content=held)
        already = self._text[: self._sent - len(held)]
        content = (info.content or "")[len(already) :] or None
        deltas = [
            DeltaToolCall(
                index=i,
                type="function",
                id=make_tool_call_id(),
                function=DeltaFunctionCall(name=call.function.name, arguments=call.function.arguments).model_dump(
                    exclude_none=True
                ),
            )
            for i, call in enumerate(info.tool_calls)
        ]
        self.prev_tool_call_arr = [
            {"name": c.function.name, "arguments": c.function.arguments} for c in info.tool_calls
        ]
        self.streamed_args_for_tool = [c.function.arguments for c in info.tool_calls]
        return DeltaMessage(content=content, tool_calls=deltas)
