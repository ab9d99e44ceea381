"""Views for anyone's captures: any folder of traces in the three formats (our rollout folders, OpenEnv training
traces, lists of OpenEnv trace entries) loaded as rollout folders (workbench.turns.sources), the token view's
per-token masks, logprob ribbon and first mismatch (workbench.views.tokens), and a whole run as one static page
(workbench.views.page, `workbench html`) opened in a real headless Chromium with the network cut off.

Inputs are the real shipped captures and OpenEnv fixtures (workbench/data/rollouts, workbench/data/traces)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from workbench.cli.notebooks import NotebookError, check_parameters
from workbench.turns import TraceError, analyse, load_sources, load_trace, sniff, tokenizer_for_rollout
from workbench.views import STYLE, load_run, render_row, render_run, render_turn

DATA = Path(__file__).resolve().parents[1] / "workbench" / "data"
ROLLOUTS, TRACES = DATA / "rollouts", DATA / "traces"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def smol_tok():
    return tokenizer_for_rollout(ROLLOUTS / "smollm2-fork-bpe")


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    """OpenEnv's own trace entries (`TrainingTrace.to_trace_entries`) of the fork-bpe fixture."""
    from openenv.core.harness.training import TrainingTrace

    return TrainingTrace.model_validate_json((TRACES / "openenv-fork-bpe.json").read_text()).to_trace_entries()


def _captures(root: Path, entries: list[dict]) -> Path:
    """A folder with one trace of each format, two bad files and a JSON file that is no trace."""
    shutil.copytree(ROLLOUTS / "smollm2-fork-bpe", root / "ours" / "fork-bpe")
    shutil.copytree(ROLLOUTS / "smollm2-easy", root / "ours" / "damaged")
    trace = root / "ours" / "damaged" / "trace.json"
    trace.write_text(trace.read_text()[:-200])  # cut short, as a killed writer leaves it
    (root / "openenv").mkdir()
    shutil.copy(TRACES / "openenv-fork-invalid.json", root / "openenv" / "fork-invalid.json")
    (root / "openenv" / "entries.json").write_text(json.dumps(entries))
    (root / "openenv" / "truncated.json").write_text((TRACES / "openenv-fork-bpe.json").read_text()[:5000])
    doc = json.loads((TRACES / "openenv-fork-bpe.json").read_text())
    doc["turns"][1]["loss_mask"] = doc["turns"][1]["loss_mask"][:-1]  # one value short of prompt + completion
    (root / "openenv" / "short-mask.json").write_text(json.dumps(doc))
    (root / "config.json").write_text(json.dumps({"params": "small"}))
    return root


def test_the_three_formats_load_and_a_bad_file_hides_nothing(tmp_path, entries):
    root = _captures(tmp_path / "captures", entries)
    found = load_sources(root, tmp_path / "work")
    got = {s.name: s.format for s in found.rollouts}
    assert got == {
        "ours/fork-bpe": "rollout",
        "openenv/entries": "openenv-entries",
        "openenv/fork-invalid": "openenv-trace",
    }
    skipped = {p.name: why for p, why in found.skipped}
    assert set(skipped) == {"trace.json", "truncated.json", "short-mask.json"}
    assert skipped["trace.json"].startswith(f"{root / 'ours' / 'damaged' / 'trace.json'}: not valid JSON")
    assert str(root / "openenv" / "truncated.json") in skipped["truncated.json"]
    assert "not valid JSON" in skipped["truncated.json"]
    assert "turns[1]" in skipped["short-mask.json"] and "loss_mask" in skipped["short-mask.json"]
    assert found.ignored == [root / "config.json"]

    by = {s.name: s for s in found.rollouts}
    assert by["ours/fork-bpe"].folder == root / "ours" / "fork-bpe"  # read in place, nothing copied
    for name, fixture in (("openenv/entries", "openenv-fork-bpe"), ("openenv/fork-invalid", "openenv-fork-invalid")):
        folder = by[name].folder
        assert folder.parent == tmp_path / "work"
        doc = json.loads((TRACES / f"{fixture}.json").read_text())
        calls = load_trace(folder / "trace.json")
        assert [c["loss_mask"] for c in calls] == [t["loss_mask"] for t in doc["turns"]]  # token for token
        assert json.loads((folder / "summary.json").read_text())["model"] == "smollm2"  # from the turns' metadata

    # a second load into the same work folder replaces its own imports and leaves a stranger's folder alone
    stranger = tmp_path / "work" / "openenv__entries"
    (stranger / "summary.json").write_text(json.dumps({"imported_from": {"file": "/elsewhere.json"}}))
    again = load_sources(root, tmp_path / "work")
    assert {s.name: s.folder.name for s in again.rollouts if s.format != "rollout"} == {
        "openenv/entries": "openenv__entries-2",
        "openenv/fork-invalid": "openenv__fork-invalid",
    }
    assert json.loads((stranger / "summary.json").read_text()) == {"imported_from": {"file": "/elsewhere.json"}}


def test_one_file_a_loose_call_list_and_an_empty_folder(tmp_path):
    one = load_sources(TRACES / "openenv-fork-bpe.json", tmp_path / "w")
    assert [(s.name, s.format) for s in one.rollouts] == [("openenv-fork-bpe", "openenv-trace")]
    assert sniff(ROLLOUTS / "smollm2-easy") == "rollout" and sniff(TRACES / "openenv-fork-bpe.json") == "openenv-trace"
    # our own call list outside its folder has no model to decode it with: said, not guessed
    loose = tmp_path / "calls.json"
    shutil.copy(ROLLOUTS / "smollm2-easy" / "trace.json", loose)
    with pytest.raises(TraceError, match="calls.json: a list of captured calls without loss_mask"):
        sniff(loose)
    (tmp_path / "other.json").write_text("{}")
    refused = load_sources(tmp_path / "other.json", tmp_path / "w")
    assert refused.rollouts == [] and "none of the formats" in refused.skipped[0][1]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no traces in or under"):
        load_sources(tmp_path / "empty", tmp_path / "w")


class _Spans(HTMLParser):
    """Token spans (data-id) as (position, classes) and ribbon bars as (position, logprob, height px)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[tuple[int, set[str]]] = []
        self.bars: list[tuple[int, float, int, str]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        if "data-id" in a:
            self.tokens.append((int(a["data-i"]), classes))
        if "wb-lp" in classes:
            px = int(re.fullmatch(r"height:(\d+)px", a["style"]).group(1))
            self.bars.append((int(a["data-i"]), float(a["data-lp"]), px, a["title"]))


def _parse(html: str) -> _Spans:
    p = _Spans()
    p.feed(html)
    return p


def test_a_partial_mask_shows_both_colours_and_the_ribbon_carries_each_logprob(tmp_path, smol_tok):
    d = load_sources(TRACES / "openenv-fork-bpe.json", tmp_path / "w").rollouts[0].folder
    turn = analyse(load_trace(d / "trace.json")).turns[0]
    assert turn.partial
    view = render_turn(smol_tok, turn)
    spans = _parse(view)
    n_p = len(turn.prompt_ids)
    sampled = [(i, c) for i, c in spans.tokens if i >= n_p]
    assert [int("wb-train" in c) for _, c in sampled] == turn.output_mask  # the producer's mask, token for token
    assert [int("wb-untrained" in c) for _, c in sampled] == [1 - m for m in turn.output_mask]
    assert f"partly trained ({sum(turn.output_mask)} of {len(turn.output_ids)}" in view

    # the ribbon: one bar per sampled token, its exact logprob and id on hover, taller when less likely
    assert [i for i, *_ in spans.bars] == list(range(n_p, n_p + len(turn.output_ids)))
    assert [lp for _, lp, _, _ in spans.bars] == turn.per_token_logps
    for (_, lp, _, title), tid in zip(spans.bars, turn.output_ids):
        assert f"id {tid} · logprob {lp!r}" in title
    by_surprise = sorted(spans.bars, key=lambda b: -b[1])
    assert [px for _, _, px, _ in by_surprise] == sorted(px for _, _, px, _ in spans.bars)
    assert by_surprise[-1][2] >= by_surprise[0][2] + 5  # the least likely token stands out: not a flat ribbon


def test_a_row_says_where_the_next_prompt_first_differed(smol_tok):
    fork_dir = ROLLOUTS / "smollm2-fork-bpe"
    derived = analyse(load_trace(fork_dir / "trace.json"), smol_tok)
    assert len(derived.rows) == 2 and len(derived.forks) == 1
    fork = derived.forks[0]
    first = render_row(smol_tok, derived.rows[0], forks=derived.forks, max_context=30)
    assert f"first mismatch at token {fork.index}</span>" in first and "bpe_boundary" in first
    marked = [i for i, c in _parse(first).tokens if "wb-div" in c]
    assert marked == [fork.index]
    # the token it marks really is where the two sequences part
    row_ids, next_prompt = derived.rows[0].input_ids, derived.turns[fork.turn].prompt_ids
    assert row_ids[: fork.index] == next_prompt[: fork.index] and row_ids[fork.index] != next_prompt[fork.index]
    last = render_row(smol_tok, derived.rows[1], forks=derived.forks)
    assert "no mismatch" in last and "first mismatch" not in last
    plain = render_row(smol_tok, derived.rows[0])  # without the forks it claims nothing and marks nothing
    assert "mismatch at" not in plain and "no mismatch" not in plain
    assert not [i for i, c in _parse(plain).tokens if "wb-div" in c]


def test_the_run_page_is_one_self_contained_document(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ROLLOUTS / "smollm2-easy", run / "rollouts" / "easy")
    shutil.copy(TRACES / "openenv-fork-invalid.json", run / "fork-invalid.json")
    (run / "broken.json").write_text('{"schema_version": 1, "turns": [')
    nameless = json.loads((TRACES / "openenv-fork-bpe.json").read_text())
    for t in nameless["turns"]:
        del t["metadata"]["model"]
    (run / "nameless.json").write_text(json.dumps(nameless))
    pages, skipped = load_run(run, tmp_path / "work")
    assert {p.name for p, _ in skipped} == {"broken.json", "nameless.json"}
    assert "naming the model" in dict((p.name, why) for p, why in skipped)["nameless.json"]
    # told which tokenizer decodes it, the same trace renders
    assert len(load_run(run / "nameless.json", tmp_path / "work2", model="smollm2")[0]) == 1
    page = render_run(pages, title="a run", skipped=skipped)
    assert page.startswith("<!doctype html>") and page.count(STYLE) == 1  # the tokens' stylesheet, once
    assert not re.search(r"<script|<link|\b(src|href)=", page), "the page must need nothing beside it"
    assert [p.source.name for p in pages] == ["rollouts/easy", "fork-invalid"]
    assert page.count('<details class="wb-rollout"') == 2 and "broken.json</b>: " in page
    for p in pages:
        assert sum(len(t.prompt_ids) + len(t.output_ids) for t in p.derived.turns) > 0
        assert f"<h2>{p.source.name}</h2>" in page
    fragment = render_run(pages, skipped=skipped, document=False)
    assert "<html" not in fragment and fragment.startswith('<meta charset="utf-8">')


def test_notebook_03_declares_the_traces_parameters():
    check_parameters("03_turns", {"traces": str(TRACES), "traces_model": "smollm2"})
    with pytest.raises(NotebookError, match="unknown parameter.*trace_dir"):
        check_parameters("03_turns", {"trace_dir": str(TRACES)})


@pytest.fixture(scope="module")
def written_page(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`workbench html` as a user runs it on a small run: a shipped rollout, an OpenEnv fixture, a broken file."""
    tmp = tmp_path_factory.mktemp("html")
    run = tmp / "run"
    shutil.copytree(ROLLOUTS / "smollm2-fork-invalid", run / "rollouts" / "fork-invalid")
    shutil.copy(TRACES / "openenv-fork-bpe.json", run / "openenv-fork-bpe.json")
    (run / "broken.json").write_text("[{")
    out = tmp / "page" / "run.html"
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "html", str(run), "--out", str(out), "--max-context", "40"],
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard: ~15 s here (OpenEnv's validator import, two tokenizer loads)
    )
    return out, proc


def test_the_html_command_writes_the_page_and_names_what_it_skipped(written_page):
    out, proc = written_page
    assert proc.returncode == 1, proc.stderr  # something was skipped: said in the status too
    assert re.search(r"broken\.json: skipped: .*not valid JSON", proc.stderr), proc.stderr
    assert f"{out}: 2 rollout(s), 4 turns, 1 skipped" in proc.stdout, proc.stdout
    assert out.stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH: scripts/setup.sh installs it")
def test_the_page_shows_its_tokens_in_headless_chromium(written_page, tmp_path, smol_tok):
    from PIL import Image

    out, _ = written_page
    offline = [  # every host name fails and any http(s) request goes to a closed port (file:// is unaffected)
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # we may be root (CI, containers); the page is our own file
        "--disable-gpu",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--proxy-server=http://127.0.0.1:9",
        "--hide-scrollbars",
        "--window-size=1280,2000",
    ]
    shot = tmp_path / "page.png"
    run = subprocess.run(
        [*offline, f"--user-data-dir={tmp_path / 'p1'}", f"--screenshot={shot}", out.as_uri()],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only: a loaded machine takes seconds
    )
    assert run.returncode == 0 and shot.stat().st_size > 20_000, run.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2000)
    colours = {c for _, c in image.getcolors(maxcolors=1 << 24)}
    assert len(colours) > 200, len(colours)  # text, tables, token backgrounds: not a blank or one-colour page
    # the ribbon's bars, drawn in their solid colours: trained (green) and sampled-but-not-trained (orange)
    assert (22, 163, 74) in colours and (234, 137, 12) in colours

    dom = subprocess.run(
        [*offline, f"--user-data-dir={tmp_path / 'p2'}", "--dump-dom", out.as_uri()],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    views = dom.stdout.split('<div class="wb-view">')[1:]  # [0]: the page's head and overview table
    partial = [v for v in views if "partly trained" in v.split("</b>")[0]]
    assert len(partial) == 1  # turn 0 of the OpenEnv fixture: its producer trained 41 of 50 sampled tokens
    assert 'class="wb-tok wb-train' in partial[0] and 'class="wb-tok wb-untrained' in partial[0]
    # the sampled tokens' own text is in the page, each in its span
    doc = json.loads((TRACES / "openenv-fork-bpe.json").read_text())
    ids = doc["turns"][0]["completion_token_ids"]
    words = [(i, smol_tok.decode([i])) for i in ids]
    words = [(i, w) for i, w in words if re.fullmatch(r" ?[A-Za-z_]{3,}", w)]
    assert len(words) >= 3, words
    for tid, text in words:
        assert re.search(rf'data-id="{tid}">{re.escape(text)}</span>', partial[0]), (tid, text)
    assert "first mismatch at token" in dom.stdout and "no mismatch" in dom.stdout
