"""Language models trained here (task=lm): their text (heads_lab.data.lm) scored byte for byte,
the decoder-only model (heads_lab.model.lm) against formulas and its own causality, perplexity
and bits per byte against a plain re-computation, the LM recipe's optimiser and schedule, and
the settings a language model refuses in one line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from heads_lab.config.compose import to_object
from heads_lab.config.cost import kv_cache_bytes, lm_parameter_count
from heads_lab.config.validate import validate
from heads_lab.data import collate
from heads_lab.data.lm import byte_lengths, lm_tokenizer, prepare_lm, repeats, row_bytes
from heads_lab.data.tokenizer import BOS, EOS, PAD
from heads_lab.errors import ConfigError, DataError
from heads_lab.model import LanguageModel, count_parameters
from heads_lab.model.heads import attention_modules
from heads_lab.training.language import copy_accuracy, lm_perplexity, row_nll
from heads_lab.training.optim import cosine, optimizer
from tests.conftest import compose

TEXT = ["Wherefore art thou  Romeo?\n\tDeny thy father — and refuse thy name;",
        "Ay, me!  Ünïcødé, «quotes», and 12,345 digits\n", "   leading spaces", "a"]


def _run(*args: str):
    run = to_object(compose(["task=lm", "model=tiny", *args]))
    validate(run)
    return run


def test_the_tokenizer_gives_every_byte_back_and_counts_them(tmp_path):
    """Byte fallback, no normalisation: decoding the ids gives the text back exactly (doubled
    spaces, tabs, newlines, accents), and the ids' byte lengths sum to its UTF-8 size."""
    tok = lm_tokenizer(TEXT * 50, 400, tmp_path)
    lengths = byte_lengths(tok)
    for text in TEXT + ["Unseen: ζ∑ 漢字 emoji 🙂\n\n"]:
        (ids,) = tok.encode([text])
        assert tok.decode([ids])[0] == text
        assert int(lengths[ids].sum()) == len(text.encode("utf-8"))
    assert lengths[[PAD, BOS, EOS]].tolist() == [0, 0, 0]


def _works(root: Path) -> dict[str, str]:
    texts = {"alpha": "ALPHA\n\nFirst line of alpha.\nSecond, longer line of alpha.\n",
             "beta": "BETA\n\nOnly line of beta — with a dash.\n",
             "gamma": "GAMMA\n\nA third work,  spaced.\n" * 20,
             "delta": "DELTA\n\nHeld out for test.\n" * 5}
    (root / "works").mkdir(parents=True)
    for name, text in texts.items():
        (root / "works" / f"{name}.txt").write_text(text, encoding="utf-8")
    return texts


def test_documents_are_one_stream_per_split_cut_into_blocks_scored_once(tmp_path):
    """data=shakespeare's reading on a stand-in: each split's works one stream, an EOS after
    each, cut into blocks; every block token is scored once (no EOS predicted after a block,
    whose text goes on), and a split's scored bytes are its works' UTF-8 bytes and one per EOS."""
    from heads_lab.config.data_schemas import ShakespeareDataConfig

    texts = _works(tmp_path)
    cfg = ShakespeareDataConfig(root=str(tmp_path), vocab_size=340, block_size=16,
                                valid=["beta"], test=["delta"])
    lm = prepare_lm(cfg, tmp_path / "cache")
    train = lm.splits["train"]
    stream = [int(t) for i in range(len(train)) for t in train.tgt[i]]
    assert stream.count(EOS) == 2 and stream[-1] == EOS  # alpha, gamma: an EOS after each
    assert lm.tokenizer.decode([stream])[0] == texts["alpha"] + texts["gamma"]
    assert all(len(train.tgt[i]) == 16 for i in range(len(train) - 1))
    for name, works in (("train", ["alpha", "gamma"]), ("valid", ["beta"]), ("test", ["delta"])):
        split = lm.splits[name]
        assert split.open_end
        assert int(split.bytes.sum()) == sum(len(texts[w].encode()) + 1 for w in works)
        assert int(split.scored_lens.sum()) == sum(len(split.tgt[i]) for i in range(len(split)))
    batch = collate(train, np.arange(2))
    assert (batch.tgt_in[:, 0] == BOS).all() and (batch.tgt_out[:, 16] == PAD).all()
    assert torch.equal(batch.tgt_out[:, :15], batch.tgt_in[:, 1:16])
    with pytest.raises(DataError, match="no work 'omega'"):
        prepare_lm(ShakespeareDataConfig(root=str(tmp_path), vocab_size=400, valid=["omega"]),
                   tmp_path / "cache")


def test_a_corpus_side_is_deduplicated_and_split_by_the_datas_seed_not_the_runs(tmp_path):
    """task=lm on data=synthetic: its source side's distinct sentences, shuffled by data.seed
    before the split, each scored with its EOS (one byte)."""
    one = prepare_lm(_run("data.held_out=50", "seed=1").data, tmp_path)
    again = prepare_lm(_run("data.held_out=50", "seed=7").data, tmp_path)  # another run seed
    other = prepare_lm(_run("data.held_out=50", "data.seed=3").data, tmp_path)
    valid = one.splits["valid"]
    assert valid.tgt_text == again.splits["valid"].tgt_text != other.splits["valid"].tgt_text
    assert len(valid) == 50 and not valid.open_end
    assert int(valid.bytes.sum()) == sum(len(t.encode()) + 1 for t in valid.tgt_text)
    held = set(valid.tgt_text) | set(one.splits["test"].tgt_text)
    assert len(held) == 100  # distinct, and none of them trained on:
    train = {one.tokenizer.decode([list(one.splits["train"].tgt[i])])[0]
             for i in range(len(one.splits["train"]))}
    assert not held & train


def test_a_corpus_sides_repeated_lines_are_read_once_from_all_its_splits(tmp_path):
    """data=local's en side: every line of the three splits' en files, each distinct line once
    (the de side is not read), in held-out sets the run's seed never changes."""
    lines = {split: [f"{split} line {i % 37} of the corpus." for i in range(120)] + ["shared"]
             for split in ("train", "valid", "test")}
    for split, text in lines.items():
        (tmp_path / f"{split}.en").write_text("\n".join(text) + "\n", encoding="utf-8")
        (tmp_path / f"{split}.de").write_text("\n".join(["x"] * len(text)) + "\n")
    run = _run("data=local", f"data.root={tmp_path}", "data.src=en", "data.tgt=de",
               "data.held_out=10", "data.vocab_size=340")
    lm = prepare_lm(run.data, tmp_path / "cache")
    assert lm.stats["side"] == {"language": "en", "lines": 363, "distinct": 3 * 37 + 1,
                                "shuffle_seed": 0}
    assert sum(len(s) for s in lm.splits.values()) == 3 * 37 + 1


def test_repeats_are_a_random_prefix_then_a_sequence_twice():
    cfg = _run("data=repeats", "data.train_size=50").data
    for tokens, prefix, n in repeats(cfg)["train"]:
        x = tokens[prefix:prefix + n]
        assert tokens[prefix + n:] == x and len(set(x)) == n
        assert cfg.min_repeat <= n <= cfg.max_repeat and 0 <= prefix <= cfg.max_prefix
        assert min(tokens) > EOS and max(tokens) < cfg.vocab_size


@pytest.mark.parametrize("args", [[], ["model.attention=talking_heads", "model.heads_k=2",
                                        "model.heads_v=8"],
                                  ["model.kv_heads=2"], ["model.d_ff=0", "model.layers=2"],
                                  ["model.relative_positions=4", "model.norm=post"]])
def test_the_models_parameters_are_the_formula_and_every_head_setting_holds(args):
    """A talking-heads LM has talking heads (its mixes counted), grouped-query shares key/value
    heads, d_ff=0 leaves attention-only layers: the built model's parameters equal
    lm_parameter_count's, part by part."""
    run = _run(*args)
    model = LanguageModel(run.model, 300)
    got = count_parameters(model)
    want = lm_parameter_count(run.model, 300)
    assert {k: got[k] for k in want} == want
    modules = attention_modules(model)
    assert set(modules) == {("lm-self", i) for i in range(len(model.layers))}
    if "model.attention=talking_heads" in args:
        assert got["talking_heads"] > 0 and modules["lm-self", 0].variant == "talking_heads"
    if "model.d_ff=0" in args:
        assert got["ffn"] == 0 and len(model.layers) == 2
    attn = modules["lm-self", 0]  # the keys and values its cache would hold, per layer
    assert kv_cache_bytes(run.model, "lm") == len(model.layers) * (
        attn.k_heads + attn.v_heads) * run.model.d_head * 4


def test_the_model_is_causal_and_its_nll_is_a_plain_cross_entropy(tmp_path):
    torch.manual_seed(0)
    run = _run("data.held_out=20")
    lm = prepare_lm(run.data, tmp_path)
    model = LanguageModel(run.model, len(lm.tokenizer)).eval()
    x = torch.tensor([[BOS, 10, 11, 12, 13, 14]])
    y = x.clone()
    y[0, 4] = 99
    with torch.no_grad():
        a, b = model(x[:, :0], x), model(x[:, :0], y)
    torch.testing.assert_close(a[0, :4], b[0, :4])  # later tokens change nothing before them
    assert not torch.allclose(a[0, 4:], b[0, 4:])
    split = lm.splits["valid"]
    nll, tokens = row_nll(model, split, 512, torch.device("cpu"))
    for i in range(len(split)):
        ids = [BOS, *split.tgt[i]]
        with torch.no_grad():
            logits = model(torch.tensor([[]], dtype=torch.long), torch.tensor([ids]))[0]
        target = torch.tensor([*split.tgt[i], EOS])
        want = F.cross_entropy(logits.double(), target, reduction="sum").item()
        assert nll[i] == pytest.approx(want, rel=1e-5) and tokens[i] == len(target)
    got = lm_perplexity(model, split, 512, torch.device("cpu"))
    assert got["bits_per_byte"] == pytest.approx(nll.sum() / (math.log(2) * split.bytes.sum()))
    assert got["ppl"] == pytest.approx(math.exp(nll.sum() / tokens.sum()))
    assert row_bytes(split, byte_lengths(lm.tokenizer)).tolist() == split.bytes.tolist()


def test_blocks_read_in_context_score_what_one_read_of_the_whole_text_scores():
    """eval.context: each document block read after the text before it, its own tokens alone
    scored. With context enough for all earlier blocks, the blocks' NLLs sum to that of the
    whole text read once from its BOS (an independent reference: one plain forward pass); with
    a shorter context each block's NLL is a forward pass over its last `context` tokens before
    it; with none it is the non-overlapping score; tokens scored never change."""
    from heads_lab.data import Split

    torch.manual_seed(0)
    model = LanguageModel(_run("model.max_positions=256").model, 60).eval()
    stream = torch.randint(4, 60, (13,)).tolist()
    blocks = [stream[0:5], stream[5:10], stream[10:13]]
    split = Split(None, None, [[] for _ in blocks], blocks, open_end=True)
    cpu = torch.device("cpu")

    def nll_of(ids: list[int], scored: int) -> float:  # the last `scored` targets of BOS + ids
        with torch.no_grad():
            logits = model(torch.tensor([[]], dtype=torch.long), torch.tensor([[BOS, *ids[:-1]]]))
        losses = F.cross_entropy(logits[0].double(), torch.tensor(ids), reduction="none")
        return float(losses[-scored:].sum())

    plain, plain_tokens = row_nll(model, split, 512, cpu)
    assert plain.tolist() == pytest.approx([nll_of(b, len(b)) for b in blocks], rel=1e-6)
    full, tokens = row_nll(model, split, 512, cpu, context=20)
    assert tokens.tolist() == plain_tokens.tolist() == [5, 5, 3]
    assert full.sum() == pytest.approx(nll_of(stream, len(stream)), rel=1e-6)
    assert full[0] == pytest.approx(plain[0], rel=1e-9)  # nothing before the first block
    short, _ = row_nll(model, split, 512, cpu, context=3)
    assert short.tolist() == pytest.approx([nll_of(stream[0:5], 5), nll_of(stream[2:10], 5),
                                            nll_of(stream[7:13], 3)], rel=1e-6)
    assert abs(short[1] - plain[1]) > 1e-6  # the context is read: it changes the score


def test_copy_accuracy_counts_the_second_copy_but_its_first_token():
    """A stand-in model that predicts every next token right scores 1; one that predicts the
    token itself again (never right on random tokens) scores 0."""
    run = _run("data=repeats", "data.valid_size=8")
    split = prepare_lm(run.data, Path("/nonexistent")).splits["valid"]

    class Oracle(torch.nn.Module):
        pad_id, cfg = PAD, run.model

        def __init__(self, shift: int):
            super().__init__()
            self.shift = shift

        def encode(self, src):
            return None

        def decode(self, tgt_in, enc):
            return tgt_in

        def logits(self, hidden):  # the next token of the batch's rows (shift 1) or the same
            out = torch.full((*hidden.shape, 64), -1e9)
            nxt = torch.roll(hidden, -self.shift, dims=1) if self.shift else hidden
            return out.scatter(-1, nxt[..., None], 0.0)

    cpu = torch.device("cpu")
    assert copy_accuracy(Oracle(1), split, 4096, cpu) == 1.0
    assert copy_accuracy(Oracle(0), split, 4096, cpu) == 0.0


def test_the_lm_recipe_decays_matrices_only_and_follows_a_cosine():
    run = _run()
    model = LanguageModel(run.model, 300)
    opt = optimizer(model, run.trainer)
    assert isinstance(opt, torch.optim.AdamW) and run.trainer.label_smoothing == 0
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in decayed) == (p.dim() >= 2), name
    f = cosine(100, 1100, 0.1)
    assert f(50) == pytest.approx(0.5) and f(100) == pytest.approx(1.0)
    assert f(600) == pytest.approx(0.55) and f(1100) == pytest.approx(0.1)
    assert f(5000) == pytest.approx(0.1)


@pytest.mark.parametrize("args,message", [
    (["prune.sites=[dec-enc]"], "task=lm has no dec-enc attention"),
    (["model.talking_heads_in=[enc-self]"], "task=lm has no enc-self attention"),
    (["eval.sacrebleu_test=wmt14"], "scored by perplexity and bits per byte, not BLEU"),
    (["data=shakespeare", "data.block_size=600", "model.max_positions=512"],
     "data.block_size=600 needs 601 positions"),
    (["data=shakespeare", "data.block_size=256", "model.max_positions=257",
      "trainer.pad_multiple=8"], r"pads the longest sentence \(data.block_size \+ 1 = 257\)"),
    (["data=shakespeare", "data.block_size=256", "model.max_positions=512",
      "eval.context=256"], r"need 513 positions \(BOS, context, block\)"),
    (["eval.context=8"], "eval.context=8 reads a document's held-out blocks"),
    (["eval.context=-1"], "eval.context=-1 must be >= 0"),
    (["trainer.max_steps=null", "trainer.max_epochs=2"], "schedule=cosine decays"),
    (["model.init=admin", "model.norm=post"], "model.init=admin profiles a translator"),
])
def test_a_language_models_bad_settings_are_one_line(args, message):
    with pytest.raises(ConfigError, match=message):
        _run(*args)


def test_an_lm_block_that_fills_the_positions_is_valid_padded_or_not():
    """BOS + a block of 256 needs 257 positions; the translator's data.max_len + 2 rule (and its
    padded form) does not apply to an LM's blocks."""
    for pad in (1, 8):
        validate(_run("data=shakespeare", "data.block_size=256", "model.max_positions=264",
                      "data.max_len=300", f"trainer.pad_multiple={pad}"))


def test_a_task_or_data_the_other_task_needs_is_one_line():
    with pytest.raises(ConfigError, match="task=mlm: masked-LM encoders are analysed"):
        validate(to_object(compose(["task=mlm"])))
    with pytest.raises(ConfigError, match="data=shakespeare is text for a language model"):
        validate(to_object(compose(["data=shakespeare"])))


def test_info_accounts_a_language_model_and_its_key_value_cache(capsys):
    """`heads-lab info task=lm ...`: the LM's parameters (= the built model's), FLOPs and
    KV-cache bytes per token, which multi-query attention shrinks by its heads."""
    import json as _json

    from heads_lab.commands.info import main as info

    assert info(["task=lm", "model=tiny", "model.heads=4", "model.kv_heads=1,4", "--json"]) == 0
    rows = _json.loads(capsys.readouterr().out)
    assert [r["kv_cache_bytes_per_token"] for r in rows] == [2 * 1 * 1 * 16 * 4, 2 * 1 * 4 * 16 * 4]
    for r in rows:
        run = _run(f"model.kv_heads={r['model']['kv_heads']}")
        assert r["params"]["total"] == count_parameters(LanguageModel(run.model, 2000))["total"]
    assert info(["task=lm", "model=tiny", "model.kv_heads=1,4"]) == 0
    assert "KV cache bytes/token" in capsys.readouterr().out


def test_the_best_weights_validation_numbers_include_bits_per_byte():
    """eval.checkpoint=best: results.json's valid numbers are the best validation's, a language
    model's bits per byte too (not the last validation's beside the best's perplexity)."""
    from types import SimpleNamespace

    from heads_lab.commands.train import _evaluated_validation

    history = [{"step": 100, "valid/loss": 4.0, "valid/ppl": 54.6, "valid/bits_per_byte": 1.9},
               {"step": 200, "valid/loss": 4.2, "valid/ppl": 66.7, "valid/bits_per_byte": 2.0}]
    result = SimpleNamespace(history=history)
    assert _evaluated_validation(result, {"checkpoint": "best", "step": 100}) == {
        "valid/loss": 4.0, "valid/ppl": 54.6, "valid/bits_per_byte": 1.9}
    assert _evaluated_validation(result, {"checkpoint": "last", "step": 200}) == {}
    translator = SimpleNamespace(history=[{"step": 100, "valid/loss": 2.0, "valid/ppl": 7.4}])
    assert _evaluated_validation(translator, {"checkpoint": "best", "step": 100}) == {
        "valid/loss": 2.0, "valid/ppl": 7.4}
