"""Decoder-only language models through `hf:` (heads_lab.hf with the lm task), tested on tiny
random-weight GPT-2, GPT-NeoX, Llama and Mistral (4 query heads, 2 key/value heads) and Qwen2
(head_dim 32 ≠ d_model / h) built here (scripts/hf_tiny_models.py) against the library itself:
the maps are its own `output_attentions`, a masked query head is its slice of the output
projection's input zeroed by hand, a masked key/value group is the model with that group's
rows and columns removed, the perplexity is a plain transformers loop, and the special-token
rule puts exactly one BOS before every text."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install "
                                   "'heads-lab[hf]' (make test installs it)")
import torch  # noqa: E402

from heads_lab.errors import ConfigError, DataError  # noqa: E402
from heads_lab.hf import heads as hf_heads  # noqa: E402
from heads_lab.hf.models import FAMILIES, account, load  # noqa: E402
from heads_lab.hf.prune import evaluate  # noqa: E402
from heads_lab.hf.tasks import EvalData  # noqa: E402
from tests.unit.test_hf import EN, _builder  # noqa: E402

LMS = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2")
TEXTS = EN + ["Two children watch a dog.", "The old man sits on a green bench."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    data = os.environ.get("HEADS_LAB_DATA")
    builder = _builder()
    out = tmp_path_factory.mktemp("hf-lm")
    return builder.causal(out, builder.texts(Path(data) if data else None))


def _slice_zeroed(module, head: int, width: int) -> None:
    """A head's columns of the output projection's weight set to 0 (GPT-2's Conv1D stores it
    transposed: its rows)."""
    with torch.no_grad():
        if hasattr(module, "nf"):  # transformers' Conv1D: weight [in, out]
            module.weight[head * width:(head + 1) * width, :] = 0.0
        else:
            module.weight[:, head * width:(head + 1) * width] = 0.0


def test_each_family_is_one_entry_of_the_families_table():
    """A new family of a known task is its FAMILIES entry: Mistral and Qwen2 are one line each
    (the Llama-like builder), and no file of the hf adapter branches on the task kind."""
    assert {"gpt2", "gpt_neox", "llama", "mistral", "qwen2"} <= set(FAMILIES)
    assert {FAMILIES[f].task.name for f in LMS} == {"lm"}
    root = Path(__file__).resolve().parents[2] / "heads_lab" / "hf"
    for name in ("heads.py", "prune.py", "subject.py", "analysis.py"):
        text = (root / name).read_text()
        for branch in ("seq2seq", "task.name ==", 'name == "lm"', '"mlm"', '"translate"',
                       "isinstance("):
            assert branch not in text, (name, branch)
    models = (root / "models.py").read_text()
    assert models.count('_llama_like("mistral"') == 1 and models.count('_llama_like("qwen2"') == 1


@pytest.mark.parametrize("family", LMS)
def test_a_text_starts_from_one_bos_and_no_text_token_is_dropped(tiny, family):
    """GPT-2, GPT-NeoX and Qwen2 read <|endoftext|> + text (their tokenizers add nothing), Llama
    and Mistral their own <s> once (their tokenizers add it); encode_spans keeps every token,
    the last one ending where the text does."""
    pre = load(f"hf:{tiny[family]}")
    bos = "<s>" if family in ("llama", "mistral") else "<|endoftext|>"
    text = "A man rides a bike."
    (ids,) = pre.tokens.encode([text])
    assert pre.tokens.pieces(ids)[0] == bos and pre.tokens.pieces(ids).count(bos) == 1
    plain = pre.tokens.tok(text, add_special_tokens=False)["input_ids"]
    assert ids[1:] == plain
    got, spans = pre.tokens.encode_spans(text)
    assert got == ids and len(spans) == len(ids)
    assert spans[0] == (0, 0) and spans[-1][1] == len(text)
    assert pre.tokens.bos_id == ids[0]


@pytest.mark.parametrize("family", LMS)
def test_maps_are_the_models_own_attention_one_sentence_at_a_time(tiny, family):
    pre = load(f"hf:{tiny[family]}")
    src = pre.tokens.encode(TEXTS)
    sentences = hf_heads.maps(pre, src, None)  # batched, padded on the right, then cut back
    for i, sent in enumerate(sentences):
        with torch.no_grad():
            own = pre.model(input_ids=torch.tensor([src[i]]), output_attentions=True).attentions
        assert set(sent.maps) == {"lm-self"} and sent.tgt_in == []
        expected = torch.cat(own).numpy()  # [layers, heads, query, key]
        np.testing.assert_allclose(sent.maps["lm-self"], expected, atol=1e-5)
        assert np.allclose(np.triu(sent.maps["lm-self"], k=1), 0.0)  # causal


@pytest.mark.parametrize("family,key,head", [("gpt2", ("lm-self", 1), 2),
                                             ("gpt_neox", ("lm-self", 0), 1),
                                             ("llama", ("lm-self", 1), 3),
                                             ("qwen2", ("lm-self", 0), 2)])
def test_a_masked_query_head_is_its_slice_of_the_output_projections_input_zeroed(tiny, family,
                                                                                 key, head):
    """Under grouped-query attention (Llama, Qwen2) too: one query head, not its key/value
    head's whole group; with Qwen2's head_dim 32, the slice is 32 wide (not d_model / h)."""
    pre = load(f"hf:{tiny[family]}")
    b = hf_heads.batch(pre, pre.tokens.encode(TEXTS), None)
    by_hand = copy.deepcopy(pre.model)
    width = pre.d_k["lm-self"]
    assert width == (32 if family == "qwen2" else 16)
    _slice_zeroed(pre.family.outs(by_hand)[key], head, width)
    with torch.no_grad():
        expected = by_hand(**b.kwargs).logits
        with hf_heads.masked(pre, {key: [head]}):
            got = pre.model(**b.kwargs).logits
        plain = pre.model(**b.kwargs).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain, expected)


def _without_group(pre, layer: int, group: int):
    """A copy of a Llama-style model whose layer `layer` lost key/value head `group` and its
    query heads for real: q_proj rows, k_proj and v_proj rows, o_proj columns removed, the
    layer's head counts one group smaller."""
    cfg = pre.config
    heads, kv, width = cfg.num_attention_heads, cfg.num_key_value_heads, pre.d_k["lm-self"]
    r = heads // kv
    queries = [h for h in range(heads) if h // r != group]
    keep_q = torch.tensor([h * width + i for h in queries for i in range(width)])
    keep_kv = torch.tensor([g * width + i for g in range(kv) if g != group for i in range(width)])
    small = copy.deepcopy(pre.model)
    attn = small.model.layers[layer].self_attn
    with torch.no_grad():
        for name, rows in (("q_proj", keep_q), ("k_proj", keep_kv), ("v_proj", keep_kv)):
            old = getattr(attn, name)
            new = torch.nn.Linear(old.in_features, len(rows), bias=old.bias is not None)
            new.weight.copy_(old.weight[rows])
            if old.bias is not None:
                new.bias.copy_(old.bias[rows])
            setattr(attn, name, new)
        old = attn.o_proj
        new = torch.nn.Linear(len(keep_q), old.out_features, bias=old.bias is not None)
        new.weight.copy_(old.weight[:, keep_q])
        if old.bias is not None:
            new.bias.copy_(old.bias)
        attn.o_proj = new
    layer_cfg = copy.deepcopy(cfg)  # the layer reads its head counts from its config
    layer_cfg.num_attention_heads, layer_cfg.num_key_value_heads = heads - r, kv - 1
    layer_cfg.head_dim = width
    attn.config = layer_cfg
    attn.num_key_value_groups = r
    if hasattr(attn, "num_heads"):
        attn.num_heads = heads - r
    return small


@pytest.mark.parametrize("family,layer,group", [("llama", 1, 0), ("qwen2", 0, 1),
                                                ("mistral", 0, 1)])
def test_a_pruned_key_value_group_is_the_model_with_that_group_removed(tiny, family, layer,
                                                                       group):
    pre = load(f"hf:{tiny[family]}")
    assert pre.groups == {("lm-self", 0): 2, ("lm-self", 1): 2}
    b = hf_heads.batch(pre, pre.tokens.encode(TEXTS), None)
    small = _without_group(pre, layer, group)
    r = pre.heads[("lm-self", layer)] // 2
    heads = list(range(group * r, (group + 1) * r))
    with torch.no_grad():
        removed = small(**b.kwargs).logits
        with hf_heads.masked(pre, {("lm-self", layer): heads}):
            masked = pre.model(**b.kwargs).logits
        plain = pre.model(**b.kwargs).logits
    assert small.model.layers[layer].self_attn.k_proj.out_features == pre.d_k["lm-self"]
    real = b.kwargs["attention_mask"].bool()
    torch.testing.assert_close(masked[real], removed[real], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(plain[real], removed[real])


def test_a_groups_importance_is_one_gate_over_its_query_heads(tiny):
    """|∂L/∂ξ_g| for one gate over all the query heads of key/value group g: a finite difference
    of the loss in that gate, and, within one batch, |the sum of its heads' gradients|."""
    pre = load(f"hf:{tiny['llama']}")
    pre.model.double()
    src = pre.tokens.encode(TEXTS)
    b = hf_heads.batch(pre, src, None, loss=True)
    key = ("lm-self", 1)
    head_gate = torch.ones(4, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad(), hf_heads.gated(pre, {key: head_gate}):
        (per_head,) = torch.autograd.grad(hf_heads.loss(pre, b), [head_gate])
    scores = hf_heads.importance(pre, src, None, batch_size=len(src), groups=True)
    grads = per_head.view(2, 2).sum(dim=1)
    np.testing.assert_allclose(scores[(*key, "group")], grads.abs().numpy()
                               / np.linalg.norm(grads.numpy()), rtol=1e-6)
    # Llama's RMSNorm and rotary embeddings compute in float32 even in a float64 model: a step
    # of 1e-2 keeps that rounding (~1e-7 of the loss) small beside the difference
    eps = 1e-2
    for g in range(2):
        values = []
        for sign in (1, -1):
            gate = torch.ones(2, dtype=torch.float64)
            gate[g] += sign * eps
            with torch.no_grad(), hf_heads.gated(pre, {key: gate}):
                values.append(float(hf_heads.loss(pre, b)))
        assert float(grads[g]) == pytest.approx((values[0] - values[1]) / (2 * eps), rel=2e-2)


def _library_nll(pre, src) -> tuple[float, int]:
    """Σ NLL (nats) and predicted tokens of the texts `src`, by the library's own loss, one
    text at a time."""
    nll, tokens = 0.0, 0
    with torch.no_grad():
        for ids in src:
            x = torch.tensor([ids])
            nll += float(pre.model(input_ids=x, labels=x).loss) * (len(ids) - 1)
            tokens += len(ids) - 1
    return nll, tokens


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_perplexity_and_bits_per_byte_are_a_plain_transformers_loop(tiny, family):
    """At 0 % pruned, prune's metric is the library's own loss, one text at a time: Σ over
    texts of its mean next-token loss × its predicted tokens, per token (PPL) and per UTF-8
    byte (bits per byte), batched and padded or not."""
    pre = load(f"hf:{tiny[family]}")
    src = pre.tokens.encode(TEXTS)
    nll, tokens = _library_nll(pre, src)
    size = sum(len(t.encode("utf-8")) for t in TEXTS)
    row = evaluate(pre, EvalData(src, None, None, TEXTS), {}, beam=1, batch_size=3)
    assert row["tokens"] == tokens and row["bytes"] == size
    assert row["ppl"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)
    assert row["bits_per_byte"] == pytest.approx(nll / (math.log(2) * size), rel=1e-5)


@pytest.mark.parametrize("family", LMS)
def test_info_reads_heads_key_value_heads_and_head_dim_from_the_config(tiny, family):
    from torch.utils.flop_counter import FlopCounterMode

    pre = load(f"hf:{tiny[family]}")
    row = account(pre)
    kv = 2 if family in ("llama", "mistral", "qwen2") else 4
    d_k = 32 if family == "qwen2" else 16
    assert row["task"] == "lm" and row["layers"] == "2 (decoder-only)"
    assert row["heads"] == {"lm-self": 4} and row["kv_heads"] == {"lm-self": kv}
    assert row["d_k"] == {"lm-self": d_k} and row["params"] == pre.model.num_parameters()
    assert row["kv_cache_bytes_per_token"] == 2 * 2 * kv * d_k * 4  # fp32
    assert row["weights_per_query_head"] == {"lm-self": 2 * 64 * d_k}
    ids = torch.full((1, 128), 5)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        pre.model(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert row["flops_per_token"] == counter.get_total_flops() / 128


def test_a_causal_lm_config_whose_heads_do_not_divide_is_one_line(tiny, tmp_path):
    where = tmp_path / "llama"
    shutil.copytree(tiny["llama"], where)
    config = json.loads((where / "config.json").read_text())
    config["num_key_value_heads"] = 3
    (where / "config.json").write_text(json.dumps(config))
    with pytest.raises(DataError, match="4 query heads do not divide into 3 key/value heads"):
        load(f"hf:{where}")


def test_a_tokenizer_without_the_token_a_text_starts_from_is_one_line(tiny, tmp_path):
    """A causal LM's text starts from its BOS (or end-of-text) token: a tokenizer with neither,
    and a config without one, is refused in one line."""
    where = tmp_path / "qwen2"
    shutil.copytree(tiny["qwen2"], where)
    for name in ("tokenizer_config.json", "config.json"):
        data = json.loads((where / name).read_text())
        for k in ("bos_token", "eos_token", "bos_token_id", "eos_token_id"):
            data[k] = None
        (where / name).write_text(json.dumps(data))
    with pytest.raises(DataError, match="no BOS or end-of-text token"):
        load(f"hf:{where}")


def test_a_text_longer_than_the_models_positions_is_one_line(tiny):
    from heads_lab.hf.analysis import fitted

    pre = load(f"hf:{tiny['gpt2']}")
    ids = pre.tokens.encode([" ".join(["a"] * 300), "a man"])
    n = len(ids[0])
    assert n > 256
    with pytest.raises(ConfigError, match=fr"text 0 is {n} tokens, longer than the model's 256 "
                                          r"positions.*analysis.max_tokens=256"):
        fitted(pre, ids, None, "analysis.max_tokens")
    assert [len(x) for x in fitted(pre, ids, 100, "analysis.max_tokens")] == [100, len(ids[1])]
    with pytest.raises(ConfigError, match="analysis.max_tokens=300 is over the model's 256"):
        fitted(pre, ids, 300, "analysis.max_tokens")


def test_an_end_token_the_tokenizer_appends_is_scored_and_counted_as_one_byte(tiny):
    """Bits per byte divides by the texts' UTF-8 bytes and one byte per end token scored (a
    tokenizer that appends </s>): the same NLL as the library's loss over those ids."""
    pre = load(f"hf:{tiny['llama']}")
    eos = pre.tokens.tok.eos_token_id
    src = [ids + [eos] for ids in pre.tokens.encode(TEXTS)]
    nll, tokens = _library_nll(pre, src)
    size = sum(len(t.encode("utf-8")) for t in TEXTS) + len(TEXTS)
    row = evaluate(pre, EvalData(src, None, None, TEXTS), {}, beam=1, batch_size=4)
    assert row["bytes"] == size and row["tokens"] == tokens
    assert row["bits_per_byte"] == pytest.approx(nll / (math.log(2) * size), rel=1e-5)


def test_a_role_probe_longer_than_the_models_positions_is_one_line(tiny):
    from heads_lab.config.compose import to_object
    from heads_lab.hf.subject import PretrainedSubject
    from tests.conftest import compose

    pre = load(f"hf:{tiny['gpt2']}")
    run = to_object(compose(["analysis.role_length=200"]))
    subject = PretrainedSubject(pre, run, [], "cpu")
    with pytest.raises(ConfigError, match=r"analysis.role_length=200: the role probe reads 401 "
                                          r"tokens .* over .* 256 positions; give "
                                          r"analysis.role_length=127 or less"):
        subject.sequence_maps([[1] * 401])


def test_the_memory_guard_counts_the_sentences_analysed_and_the_probe(monkeypatch):
    """The maps kept are those of the sentences analysed (the first of a split that may be
    far longer) and the role probe's: a split of 10,000 long sentences analysed 5 at a time
    passes where 4 MiB are available; the probe alone, or all 10,000, do not."""
    from types import SimpleNamespace

    from heads_lab.analysis import subject as seam
    from heads_lab.analysis.record import Source
    from heads_lab.data import Split

    monkeypatch.setattr(seam, "free_memory", lambda: 4 * 2**20)
    rows = [[5] * 99] * 10_000
    split = Split(None, None, rows, [[] for _ in rows])
    heads = {("lm-self", 0): 2, ("lm-self", 1): 2}
    few = Source("valid", split, [], None, list(range(5)))
    small = SimpleNamespace(role_length=5, role_sequences=2)
    seam.check_memory(few, heads, small)  # 4 heads · 5 · 100² floats, 0.8 MB; probe tiny
    with pytest.raises(ConfigError, match="the attention maps of 10,000 sentences"):
        seam.check_memory(Source("valid", split, [], None, list(range(10_000))), heads, small)
    need = 4 * (4 * 5 * 100 * 100 + 4 * 10 * 201 * 201) / 2**20  # float32: texts', probe's
    with pytest.raises(ConfigError, match=f"would take {need:.1f} MiB, over half the 4.0 MiB"):
        seam.check_memory(few, heads, SimpleNamespace(role_length=100, role_sequences=10))
