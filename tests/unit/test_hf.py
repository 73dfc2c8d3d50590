"""Pretrained Hugging Face models (heads_lab.hf), tested on tiny random-weight Marian, BERT and
DistilBERT models built here (scripts/hf_tiny_models.py) against the library itself: the maps are
the model's own `output_attentions`, a masked head is that head zeroed by hand, importance is a
finite difference, a planted previous-token head is found positional and the others are not."""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install "
                                   "'heads-lab[hf]' (make test installs it)")
import torch  # noqa: E402

from heads_lab.analysis.subject import analyze  # noqa: E402
from heads_lab.config.compose import to_object  # noqa: E402
from heads_lab.hf import heads as hf_heads  # noqa: E402
from heads_lab.hf.analysis import source  # noqa: E402
from heads_lab.hf.models import account, load  # noqa: E402
from heads_lab.hf.subject import PretrainedSubject  # noqa: E402
from tests.conftest import compose  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DE = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.",
      "Eine Frau mit einem roten Hut liest ein Buch im Park."]
EN = ["A man rides a bike.", "Two dogs play in the snow.",
      "A woman in a red hat reads a book in the park."]


def _builder():
    spec = importlib.util.spec_from_file_location("hf_tiny_models",
                                                  ROOT / "scripts" / "hf_tiny_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    data = os.environ.get("HEADS_LAB_DATA")
    return _builder().build(tmp_path_factory.mktemp("hf"), Path(data) if data else None,
                            lm=False)


def _inputs(pre):
    src = pre.tokens.encode(DE if pre.task.references else EN)
    tgt = pre.tokens.encode_target(EN) if pre.task.references else None
    return src, tgt


@pytest.mark.parametrize("family", ["marian", "bert", "distilbert"])
def test_maps_are_the_models_own_attention_one_sentence_at_a_time(tiny, family):
    pre = load(f"hf:{tiny[family]}")
    src, tgt = _inputs(pre)
    sentences = hf_heads.maps(pre, src, tgt)  # batched, padded, then cut back
    for i, sent in enumerate(sentences):
        kwargs = {"input_ids": torch.tensor([src[i]])}
        if pre.task.references:
            kwargs["decoder_input_ids"] = torch.tensor([sent.tgt_in])
        with torch.no_grad():
            out = pre.model(**kwargs, output_attentions=True)
        own = ({"enc-self": out.encoder_attentions, "dec-self": out.decoder_attentions,
                "dec-enc": out.cross_attentions} if pre.task.references
               else {"enc-self": out.attentions})
        assert set(sent.maps) == set(own)
        for site, layers in own.items():
            expected = torch.cat(layers).numpy()  # [layers, heads, query, key]
            np.testing.assert_allclose(sent.maps[site], expected, atol=1e-5)
        assert sent.src == src[i] and sent.src[-1] == (1 if family == "marian" else 3)


@pytest.mark.parametrize("family,key,head", [("marian", ("dec-enc", 1), 2),
                                             ("marian", ("enc-self", 0), 0),
                                             ("bert", ("enc-self", 1), 3),
                                             ("distilbert", ("enc-self", 0), 1)])
def test_a_masked_head_is_that_heads_slice_zeroed_by_hand(tiny, family, key, head):
    pre = load(f"hf:{tiny[family]}")
    src, tgt = _inputs(pre)
    b = hf_heads.batch(pre, src, tgt)
    inputs = {k: v for k, v in b.kwargs.items() if k != "labels"}
    by_hand = copy.deepcopy(pre.model)
    width = pre.d_model // pre.heads[key]
    with torch.no_grad():
        pre.family.outs(by_hand)[key].weight[:, head * width:(head + 1) * width] = 0.0
        expected = by_hand(**inputs).logits
        with hf_heads.masked(pre, {key: [head]}):
            got = pre.model(**inputs).logits
        plain = pre.model(**inputs).logits  # the hooks are gone after the block
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain, expected)


@pytest.mark.parametrize("family", ["marian", "bert"])
def test_importance_is_a_finite_difference_of_the_loss(tiny, family):
    pre = load(f"hf:{tiny[family]}")
    pre.model.double()
    src, tgt = _inputs(pre)
    b = hf_heads.batch(pre, src, tgt, loss=True)
    key = ("dec-enc", 0) if family == "marian" else ("enc-self", 1)
    gate = torch.ones(pre.heads[key], dtype=torch.float64, requires_grad=True)
    with torch.enable_grad(), hf_heads.gated(pre, {key: gate}):
        (grad,) = torch.autograd.grad(hf_heads.loss(pre, b), [gate])
    eps = 1e-5
    for h in range(pre.heads[key]):
        values = []
        for sign in (1, -1):
            shifted = torch.ones(pre.heads[key], dtype=torch.float64)
            shifted[h] += sign * eps
            with torch.no_grad(), hf_heads.gated(pre, {key: shifted}):
                values.append(float(hf_heads.loss(pre, b)))
        assert float(grad[h]) == pytest.approx((values[0] - values[1]) / (2 * eps), rel=1e-4,
                                               abs=1e-9)
    # importance(): |∂L/∂ξ| of the one batch, normalised over the layer
    scores = hf_heads.importance(pre, src, tgt, batch_size=len(src))[(*key, "head")]
    np.testing.assert_allclose(scores, grad.abs().numpy() / np.linalg.norm(grad.numpy()),
                               rtol=1e-6)


def _plant_previous_token_head(pre, layer: int = 0, head: int = 0, period: int = 20) -> None:
    """BERT's layer-0 head 0 made to attend to the previous token through the model's own
    forward: each position written into four embedding dims as an angle a = position · 2π /
    period, (cos a, sin a, −cos a, −sin a), those dims emptied of word and type embeddings; the
    head reads the differences of the pairs (so the embedding LayerNorm's mean, common to every
    dim, cancels), its query turning the angle one position back while its key reads it as is:
    q_i · k_j ∝ cos(2π (i − 1 − j) / period), largest at j = i − 1 (sentences shorter than the
    period)."""
    emb = pre.model.bert.embeddings
    attn = pre.model.bert.encoder.layer[layer].attention.self
    width = attn.attention_head_size
    rows = slice(head * width, (head + 1) * width)
    theta = 2 * math.pi / period
    with torch.no_grad():
        emb.word_embeddings.weight[:, :4] = 0.0
        emb.token_type_embeddings.weight[:, :4] = 0.0
        angles = torch.arange(emb.position_embeddings.weight.shape[0]) * theta
        emb.position_embeddings.weight[:, :4] = torch.stack(
            [angles.cos(), angles.sin(), -angles.cos(), -angles.sin()], dim=1)
        pairs = torch.tensor([[1.0, 0.0, -1.0, 0.0], [0.0, 1.0, 0.0, -1.0]])  # (cos, sin) · 2
        back = torch.tensor([[math.cos(theta), math.sin(theta)],
                             [-math.sin(theta), math.cos(theta)]])  # rotates by −θ
        for proj, turn in ((attn.query, back), (attn.key, torch.eye(2))):
            proj.weight[rows] = 0.0
            proj.bias[rows] = 0.0
            proj.weight[rows.start:rows.start + 2, :4] = 10.0 * turn @ pairs


def test_a_planted_previous_token_head_is_found_positional_and_no_other(tiny):
    pre = load(f"hf:{tiny['bert']}")
    texts = EN + ["Two children watch a dog.", "The old man sits on a green bench."]
    longest = max(len(ids) for ids in pre.tokens.encode(texts))  # (tokenizer-dependent)
    _plant_previous_token_head(pre, period=max(20, longest + 4))  # longer than any sentence
    run = to_object(compose(["analysis.max_sentences=null"]))
    subject = PretrainedSubject(pre, run, [], "cpu")  # its sentences: these texts
    subject.source = lambda cfg: source(pre, cfg, (texts, None))
    result, sentences = analyze(subject, run.analysis)
    heads = {(h["layer"], h["head"]): h for h in result["heads"] if h["site"] == "enc-self"}
    planted = heads[0, 0]
    assert planted["function"] == "positional"
    assert planted["positional"]["offset"] == -1 and planted["positional"]["share"] == 1.0
    others = [h for key, h in heads.items() if key != (0, 0)]
    assert all(h["function"] != "positional" for h in others)
    assert max(h["positional"]["share"] for h in others) < 0.9
    # an encoder has no language model's roles, and analysis.json says why, per site
    assert "lm-self" in result["not_applicable"]["induction"]["enc-self"]
    assert "induction" not in planted and "roles" not in result


def test_info_counts_parameters_and_flops_like_the_library(tiny):
    from torch.utils.flop_counter import FlopCounterMode

    for family, path in tiny.items():
        pre = load(f"hf:{path}")
        row = account(pre)
        assert row["params"] == pre.model.num_parameters()
        assert row["family"] == family
        assert row["d_k"] == {site: row["d_model"] // n for site, n in row["heads"].items()}
        assert row["kv_heads"] == row["heads"]  # no grouped-query attention here
        # queries, keys, values and output of every attention layer, weights and biases, and
        # nothing else (BERT's attention block holds a LayerNorm too: not counted)
        d, modules = row["d_model"], sum(pre.layers(site) for site in row["heads"])
        assert row["params_attention"] == modules * 4 * (d * d + d)
        ids = torch.full((1, 20), 5)
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if pre.task.references:
            kwargs["decoder_input_ids"] = torch.full((1, 20), 5)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            pre.model(**kwargs)
        assert row["flops_per_token"] == counter.get_total_flops() / 20


def test_the_tiny_models_are_the_same_every_build(tmp_path):
    """Tests' numbers rest on the tiny models: two builds give the same vocabularies (ids
    included: the WordPiece trainer orders its pieces differently each time) and weights."""
    import json

    builder = _builder()
    lines = builder.texts(None)
    first, again = (builder.encoders(tmp_path / name, lines) for name in ("a", "b"))
    for one, two in zip(first, again, strict=True):
        vocab = [json.loads((d / "tokenizer.json").read_text())["model"]["vocab"] for d in (one, two)]
        assert vocab[0] == vocab[1] and len(vocab[0]) > 500
        assert list(vocab[0])[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        weights = [(d / "model.safetensors").read_bytes() for d in (one, two)]
        assert weights[0] == weights[1]
    # the causal LMs' byte-level BPE tokenizers and weights alike
    first, again = (builder.causal(tmp_path / name, lines, ("gpt2",))["gpt2"] for name in "cd")
    for name in ("tokenizer.json", "model.safetensors"):
        assert (first / name).read_bytes() == (again / name).read_bytes()


@pytest.mark.parametrize("family", ["marian", "bert"])
def test_pruning_metric_is_the_task_metric_computed_by_hand(tiny, family):
    """prune's metric against the library and sacrebleu: BERT's masked-LM loss and top-1
    accuracy over the masked tokens only (the same fixed tokens every call), Marian's loss per
    reference token and BLEU of its own beam-search translations, in order across batches (refs
    that are those translations score 100)."""
    import sacrebleu
    import torch.nn.functional as F

    from heads_lab.hf.prune import evaluate
    from heads_lab.hf.tasks import EvalData

    pre = load(f"hf:{tiny[family]}")
    src, tgt = _inputs(pre)
    src, tgt = src * 2, (tgt * 2 if tgt else None)  # six sentences: three batches of two
    key = ("dec-enc", 1) if pre.task.references else ("enc-self", 0)
    b = hf_heads.batch(pre, src, tgt, loss=True)
    labels = b.kwargs["labels"]
    if not pre.task.references:
        again = hf_heads.batch(pre, src, None, loss=True).kwargs
        assert torch.equal(again["labels"], labels) and torch.equal(again["input_ids"],
                                                                     b.kwargs["input_ids"])
    with torch.no_grad(), hf_heads.masked(pre, {key: [1]}):
        logits = pre.model(**b.kwargs).logits
    real = labels != -100
    want = F.cross_entropy(logits[real], labels[real], reduction="mean").item()
    if pre.task.references:
        generate, made = pre.model.generate, []

        def recorded(**kwargs):  # the library's own beam search, its outputs kept
            assert kwargs["num_beams"] == 2
            out = generate(**kwargs)
            made.extend(pre.tokens.decode(out.tolist()))
            return out

        pre.model.generate = recorded
        refs = [EN[i % 3] for i in range(len(src))]
        row = evaluate(pre, EvalData(src, tgt, refs, DE * 2), {key: [1]}, beam=2, batch_size=2)
        hyps = list(made)
        assert len(hyps) == len(src)
        assert row["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
        assert row["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
        assert row["bleu"] < 100.0
        same = evaluate(pre, EvalData(src, tgt, hyps, DE * 2), {key: [1]}, beam=2, batch_size=2)
        assert same["bleu"] == pytest.approx(100.0)  # each translation against its own sentence
    else:
        row = evaluate(pre, EvalData(src, None, None, EN * 2), {key: [1]}, beam=1,
                       batch_size=len(src))
        hits = (logits.argmax(-1) == labels)[real]
        assert row["accuracy"] == pytest.approx(hits.float().mean().item(), abs=1e-12)
    assert row["tokens"] == int(real.sum())
    assert row["loss"] == pytest.approx(want, rel=1e-5)
    assert row["ppl"] == pytest.approx(math.exp(want), rel=1e-5)
    with torch.no_grad():
        plain = pre.model(**b.kwargs).logits
    # the mask took effect: on the logits, not the loss, which a random model's few masked
    # tokens can leave within 2e-6 of the unmasked one (seen once, with another tiny vocabulary)
    assert (plain - logits).abs().max().item() > 1e-4


def test_a_mistyped_local_dir_is_named_as_a_dir_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    """A hub name is <model> or <owner>/<model>: a longer path, or one whose first part is a dir
    here, is a local dir that is not there (it was reported as a hub download problem)."""
    from heads_lab.errors import DataError
    from heads_lab.hf.models import _where

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    monkeypatch.setattr("heads_lab.data.sources._hub_reachable", lambda timeout=3.0: False)
    for name in ("outputs/hf_tiny/nope", "outputs/nope", "a/b/c"):
        with pytest.raises(DataError, match=f"hf:{name}: no such save_pretrained dir"):
            _where(name)
    with pytest.raises(DataError, match="hub is unreachable"):  # a hub name stays a hub name
        _where("someone/no-such-model")


@pytest.mark.parametrize("family,broken,message", [
    ("bert", "no weights", r"its weights cannot be read \(.*model\.safetensors"),
    ("bert", "truncated weights", r"its weights cannot be read \(.*header"),
    ("marian", "no tokenizer", r"its tokenizer cannot be read"),
    ("bert", "no tokenizer", r"its tokenizer has 5 tokens but the model 1,000 embeddings"),
])
def test_a_pretrained_dir_broken_as_downloads_break_is_one_clear_error(tiny, tmp_path, family,
                                                                      broken, message):
    """A save_pretrained dir with its weights missing or cut short, or its tokenizer files
    missing: a DataError naming what is wrong and the fix (the command prints it in one line,
    exit 2), never a library traceback; a BERT without its tokenizer files (which transformers
    replaces by 5 special tokens, every word [UNK]) is refused, not analysed."""
    import shutil

    from heads_lab.errors import DataError

    where = tmp_path / family
    shutil.copytree(tiny[family], where)
    weights = where / "model.safetensors"
    if broken == "no weights":
        weights.unlink()
    elif broken == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:3000])
    else:
        for path in where.iterdir():
            if path.name.startswith(("tokenizer", "vocab")) or path.suffix == ".spm":
                path.unlink()
    with pytest.raises(DataError, match=message):
        load(f"hf:{where}")


def test_hf_dot_and_dot_dot_write_under_outputs_hf_by_the_dirs_name(tmp_path, monkeypatch):
    """`analyze hf:.` or `hf:..` (a model in the working dir or above it): the outputs go to
    outputs/hf/<that dir's name>/, never outputs/hf/.. (outputs/ itself) or outputs/hf/."""
    from heads_lab.hf.subject import home
    from heads_lab.output.files import output_dir

    here = tmp_path / "models" / "bert"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    for name, want in ((".", "bert"), ("..", "models"), ("Helsinki-NLP/opus-mt-de-en",
                                                          "Helsinki-NLP-opus-mt-de-en")):
        out = output_dir(home(name), "analysis", ["x=1"])
        assert out.parts[:3] == ("outputs", "hf", want) and ".." not in out.parts, out
        assert (here / out).resolve().is_relative_to(here / "outputs" / "hf" / want)


def test_a_sentence_that_fills_the_models_positions_is_analysed_and_one_more_is_not(tiny,
                                                                                    tmp_path):
    """BERT's length limit counts [CLS] and [SEP] once: a treebank sentence of 254 words of one
    token each is 256 tokens with them, exactly the tiny BERT's 256 positions, and is kept; 255
    words are left out, saying why (the limit was 2 short: [CLS]/[SEP] counted twice)."""
    from types import SimpleNamespace

    pre = load(f"hf:{tiny['bert']}")
    assert pre.config.max_position_embeddings == 256 and len(pre.tokens.encode(["a a"])[0]) == 4

    def sentence(i: int, words: int) -> str:
        rows = "".join(f"{k}\ta\ta\tDET\t_\t_\t{0 if k == 1 else 1}\t{'root' if k == 1 else 'det'}"
                       f"\t_\t_\n" for k in range(1, words + 1))
        return f"# sent_id = s{i}\n# text = {' '.join(['a'] * words)}\n{rows}\n"

    path = tmp_path / "long.conllu"
    path.write_text(sentence(1, 254) + sentence(2, 255), encoding="utf-8")
    cfg = SimpleNamespace(treebank=str(path), max_sentences=None, treebank_ref=None)
    got = source(pre, cfg, None)
    assert [len(ids) for ids in got.split.src] == [256]
    assert [x["sent_id"] for x in got.left_out] == ["s2"]
    assert "over 256" in got.left_out[0]["reason"]


def test_a_pretrained_models_head_view_is_labelled_with_its_own_tokens(tiny):
    """BERT's maps are labelled [CLS] ... [SEP] as the model reads them (not heads-lab's </s>,
    and no target <s> for an encoder); Marian's source ends in its own </s> and its target
    starts with its decoder start token."""
    from heads_lab.analysis.maps import Sentence
    from heads_lab.analysis.publish import token_labels

    bert = load(f"hf:{tiny['bert']}")
    (ids,) = bert.tokens.encode(["a man"])
    src, tgt = token_labels(Sentence(ids, [], {}), bert.tokens)
    assert src[0] == "[CLS]" and src[-1] == "[SEP]" and len(src) == len(ids) and tgt == []
    marian = load(f"hf:{tiny['marian']}")
    (ids,) = marian.tokens.encode(["Ein Mann"])
    (ref,) = marian.tokens.encode_target(["A man"])
    tgt_in = [marian.config.decoder_start_token_id] + ref[:-1]
    src, tgt = token_labels(Sentence(ids, tgt_in, {}), marian.tokens)
    assert src[-1] == "</s>" and len(src) == len(ids)
    assert tgt == marian.tokens.pieces(tgt_in) and len(tgt) == len(tgt_in)


def test_a_cut_text_keeps_its_end_token(tiny):
    """analysis.max_tokens keeps a source's first tokens and its end token ([SEP], </s>), so the
    cut text is read as a whole one (its last token still the one measures leave out)."""
    from heads_lab.hf.analysis import fitted

    bert = load(f"hf:{tiny['bert']}")
    (ids,) = bert.tokens.encode(["A man in a red hat reads a book in the park."])
    (cut,) = fitted(bert, [ids], 5, "analysis.max_tokens")
    assert cut == ids[:4] + ids[-1:] and bert.tokens.pieces(cut)[-1] == "[SEP]"
    marian = load(f"hf:{tiny['marian']}")
    (ids,) = marian.tokens.encode(DE[2:])
    (cut,) = fitted(marian, [ids], 4, "analysis.max_tokens")
    assert cut == ids[:3] + [1] and fitted(marian, [ids], 100, "analysis.max_tokens") == [ids]
