"""Decoder-only language models through the whole command: `heads-lab info / analyze / prune
hf:<dir>` on tiny GPT-2, GPT-NeoX, Llama and Qwen2 models, a planted previous-token head that
`analyze` finds (and no other head), and bad input in one line."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests.integration.test_cli import _assert_one_line_error, heads_lab

transformers = pytest.importorskip("transformers", reason="the hf extra (make test installs it)")
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ["data=synthetic", "analysis.split=valid", "trainer.device=cpu", "trainer.threads=1"]


def _builder():
    spec = importlib.util.spec_from_file_location("hf_tiny_models",
                                                  ROOT / "scripts" / "hf_tiny_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _build(out: Path, families: tuple[str, ...]) -> dict[str, Path]:
    builder = _builder()
    data = os.environ.get("HEADS_LAB_DATA")
    return builder.causal(out, builder.texts(Path(data) if data else None), families)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("hf-lm"), ("gpt2",))["gpt2"]


def plant_previous_token_head(model, layer: int = 0, head: int = 0, period: int = 512) -> None:
    """GPT-2's layer-0 head 0 made to attend to the previous token through the model's own
    forward: each position written into four dims of its position embedding as an angle
    a = position · 2π / period, 100 · (cos a, sin a, −cos a, −sin a), those dims emptied of the
    token embeddings and so large beside the rest that ln_1's scale is the same at every
    position to 1e-6 (the angle one position apart moves q · k by 1e-4 of itself); the head
    reads the differences of the pairs (ln_1's mean cancels in them), its query turning the
    angle one position back while its key reads it as is:
    q_i · k_j ∝ cos(2π (i − 1 − j) / period), largest at j = i − 1 among the keys a causal
    head sees (j ≤ i; texts shorter than the period)."""
    width = model.config.n_embd // model.config.n_head
    theta = 2 * math.pi / period
    attn = model.transformer.h[layer].attn
    with torch.no_grad():
        model.transformer.wte.weight[:, :4] = 0.0
        angles = torch.arange(model.transformer.wpe.weight.shape[0]) * theta
        model.transformer.wpe.weight[:, :4] = 100.0 * torch.stack(
            [angles.cos(), angles.sin(), -angles.cos(), -angles.sin()], dim=1)
        pairs = torch.tensor([[1.0, 0.0, -1.0, 0.0], [0.0, 1.0, 0.0, -1.0]])
        back = torch.tensor([[math.cos(theta), math.sin(theta)],
                             [-math.sin(theta), math.cos(theta)]])  # rotates by −θ
        d = model.config.n_embd
        for start, turn in ((head * width, back), (d + head * width, torch.eye(2))):  # q, k
            cols = slice(start, start + width)
            attn.c_attn.weight[:, cols] = 0.0  # Conv1D: weight [in, out]
            attn.c_attn.bias[cols] = 0.0
            attn.c_attn.weight[:4, start:start + 2] = (300.0 * turn @ pairs).T


def test_info_of_a_causal_lm_from_the_command_line(gpt2, tmp_path):
    """`heads-lab info hf:<a GPT-2>`: its heads, key/value heads, d_k and KV cache per token,
    as JSON and as the table (the causal path in `make test`; the rest in the slow tests)."""
    proc = heads_lab("info", f"hf:{gpt2}", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (row,) = json.loads(proc.stdout)
    assert row["task"] == "lm" and row["kv_heads"] == {"lm-self": 4}
    assert row["kv_cache_bytes_per_token"] == 2 * 2 * 4 * 16 * 4
    assert row["flops_tokens"] == {"tokens": 128}


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_a_planted_previous_token_head_is_found_by_analyze_and_no_other(gpt2, tmp_path):
    """The positive control through the whole command: `heads-lab analyze` of a tiny GPT-2 with
    a previous-token head planted in its weights finds it (previous-token score ≈ 1 on the
    repeated random tokens, positional at offset −1 on the text, marked in the table) and
    scores no other head so."""
    model = transformers.GPT2LMHeadModel.from_pretrained(gpt2)
    plant_previous_token_head(model)
    where = tmp_path / "gpt2-planted"
    model.save_pretrained(where)
    transformers.AutoTokenizer.from_pretrained(gpt2).save_pretrained(where)
    proc = heads_lab("analyze", f"hf:{where}", *DATA, "analysis.max_sentences=30", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = (tmp_path / "outputs" / "hf").glob("*/analysis/*/analysis.json")
    result = json.loads(found.read_text())
    heads = {(h["layer"], h["head"]): h for h in result["heads"]}
    planted = heads[0, 0]
    assert planted["previous_token"] > 0.95
    assert planted["function"] == "positional" and planted["positional"]["offset"] == -1
    assert planted["positional"]["share"] > 0.95
    others = [h for key, h in heads.items() if key != (0, 0)]
    assert max(h["previous_token"] for h in others) < 0.5
    assert all(h["function"] != "positional" for h in others)
    assert result["roles"]["sequences"] == 10 and result["roles"]["length"] == 50
    table = " ".join(proc.stdout.split())
    assert "lm-self roles: previous-token" in table


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_info_analyze_and_prune_run_on_each_tiny_causal_family(tmp_path):
    tiny = _build(tmp_path / "hf", ("gpt2", "gpt_neox", "llama", "qwen2"))
    proc = heads_lab("info", *[f"hf:{tiny[f]}" for f in ("gpt2", "gpt_neox", "llama", "qwen2")],
                     "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rows = json.loads(proc.stdout)
    assert [r["kv_heads"]["lm-self"] for r in rows] == [4, 4, 2, 2]
    assert [r["d_k"]["lm-self"] for r in rows] == [16, 16, 16, 32]
    assert [r["kv_cache_bytes_per_token"] for r in rows] == [1024, 1024, 512, 1024]
    table = heads_lab("info", f"hf:{tiny['gpt2']}", f"hf:{tiny['qwen2']}", cwd=tmp_path)
    assert table.returncode == 0 and "KV cache bytes per token" in table.stdout
    for family in ("gpt2", "gpt_neox", "llama", "qwen2"):
        proc = heads_lab("analyze", f"hf:{tiny[family]}", *DATA, "analysis.max_sentences=12",
                         cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        (found,) = (tmp_path / "outputs" / "hf").glob(f"*{family}/analysis/*/analysis.json")
        result = json.loads(found.read_text())
        assert set(result["functions"]) == {"lm-self"} and result["model"]["task"] == "lm"
        assert all(h["importance"] is not None and 0 <= h["induction"] <= 1
                   and 0 <= h["sink"] <= 1 for h in result["heads"])
        # every measure applies to the causal site but the syntax, which needs trees here
        assert set(result["not_applicable"]) == {"syntactic_gain"}
        assert "analysis.treebank" in result["not_applicable"]["syntactic_gain"]["lm-self"]
        assert (found.parent / "heads_induction.png").is_file()
        assert (found.parent / "head_view.html").is_file()
        proc = heads_lab("prune", f"hf:{tiny[family]}", "data=synthetic",
                         "prune.eval_sentences=12", "prune.step=0.5", "trainer.device=cpu",
                         cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        (found,) = (tmp_path / "outputs" / "hf").glob(f"*{family}/prune/*/prune.json")
        record = json.loads(found.read_text())
        curves = record["curves"]
        assert [r["kept"]["lm-self"] for r in curves["lm-self"]] == [8, 4, 0]
        assert all(r["bits_per_byte"] > 0 and r["ppl"] > 1 for r in curves["lm-self"])
        if family in ("llama", "qwen2"):  # grouped-query: a curve over whole key/value groups
            groups = curves["lm-self kv groups"]
            assert [r["kv_groups_pruned"] for r in groups] == [0, 2, 4]
            assert [r["kept"]["lm-self"] for r in groups] == [8, 4, 0]
            assert record["kv_groups"] == {"lm-self:0": 2, "lm-self:1": 2}
        else:
            assert set(curves) == {"lm-self"}


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_a_causal_models_bad_input_is_one_line(gpt2, tmp_path):
    """A text longer than the model's positions and a cut longer than them: one line each, exit
    2; a cut within them analyses the text's first tokens."""
    gpt2 = f"hf:{gpt2}"
    _assert_one_line_error(heads_lab("analyze", gpt2, *DATA, "analysis.max_tokens=300",
                                     cwd=tmp_path), "analysis.max_tokens=300 is over the model's "
                                                    "256 positions")
    root = tmp_path / "long"
    root.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            lines = [" ".join(["word"] * 400)] + [
                f"a short line about the {w} and its {v}" for w in ("dog", "cat", "bird")
                for v in ("owner", "house", "food", "friends", "toys", "garden")]
            with gzip.open(root / f"{split}.{lang}.gz", "wt") as f:
                f.write("\n".join(lines) + "\n")
    proc = heads_lab("analyze", gpt2, "data=local", f"data.root={root}", "data.src=en",
                     "data.tgt=de", "data.vocab_size=40", "data.max_len=1000",
                     "analysis.split=valid", cwd=tmp_path)
    _assert_one_line_error(proc, "text 0 is", "longer than the model's 256 positions",
                           "analysis.max_tokens=256")
    cut = heads_lab("analyze", gpt2, "data=local", f"data.root={root}", "data.src=en",
                    "data.tgt=de", "data.vocab_size=40", "data.max_len=1000",
                    "analysis.split=valid", "analysis.max_tokens=64",
                    "analysis.max_sentences=4", cwd=tmp_path)
    assert cut.returncode == 0, cut.stderr + cut.stdout


SHAKESPEARE = Path(os.environ.get("HEADS_LAB_DATA", "/nonexistent")) / "shakespeare" / "works"


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
@pytest.mark.skipif(not SHAKESPEARE.is_dir(), reason="Shakespeare not found: set HEADS_LAB_DATA "
                    "to the dir holding shakespeare/ (.ci/run points it at ../shared/data)")
def test_a_pretrained_lm_is_analysed_on_the_document_corpus(gpt2, tmp_path):
    """`analyze hf:<LM> data=shakespeare`: the held-out works' blocks as its texts (cut to
    analysis.max_tokens), every head measured."""
    proc = heads_lab("analyze", f"hf:{gpt2}", "data=shakespeare", "analysis.split=valid",
                     "analysis.max_sentences=6", "analysis.max_tokens=200", "trainer.threads=1",
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = (tmp_path / "outputs" / "hf").glob("*/analysis/*/analysis.json")
    result = json.loads(found.read_text())
    assert result["sentences"] == 6 and set(result["functions"]) == {"lm-self"}
