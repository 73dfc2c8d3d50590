"""`heads-lab bench --lm`'s pieces (not its speeds): the nanoGPT-style peer computes heads-lab's
language model's function, the Hugging Face peers are transformers' own models at the same dims,
heads-lab's cached generation is its uncached one, and a smoke run writes its rows."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from heads_lab.bench.baseline import PlainGPT
from heads_lab.bench.lm import LMRow, LMWorkload, generation_throughput, lm_step
from heads_lab.config.cost import lm_parameter_count
from heads_lab.config.schemas import ModelConfig, Norm
from heads_lab.data.tokenizer import BOS
from heads_lab.errors import ConfigError
from heads_lab.model import LanguageModel
from heads_lab.training.optim import optimizer

TINY = ModelConfig(d_model=32, heads=4, d_ff=64, layers=2, max_positions=64, dropout=0.0)


def _plain_name(ours: str) -> str:
    """PlainGPT's name for a parameter of heads-lab's LanguageModel."""
    if ours == "embed.weight":
        return ours
    if ours.startswith("norm."):
        return "ln_f." + ours.split(".", 1)[1]
    _, layer, rest = ours.split(".", 2)
    renames = {"self_attn.in_proj.": "c_attn.", "self_attn.out_proj.": "c_proj.",
               "ffn.fc1.": "c_fc.", "ffn.fc2.": "mlp_proj.", "res_self.norm.": "ln_1.",
               "res_ffn.norm.": "ln_2."}
    for a, b in renames.items():
        if rest.startswith(a):
            return f"blocks.{layer}.{b}{rest[len(a):]}"
    raise KeyError(ours)


@pytest.mark.parametrize("norm", [Norm.pre, Norm.post])
def test_the_nanogpt_style_peer_computes_heads_labs_language_model(norm):
    """With heads-lab's weights copied in, the plain PyTorch model (its own fused c_attn, SDPA
    with is_causal, its own blocks) gives heads-lab's logits in float64 to 1e-12: the same
    network, so the bench's rows differ by implementation alone."""
    cfg = dataclasses.replace(TINY, norm=norm)
    torch.manual_seed(0)
    ours = LanguageModel(cfg, 50).double().eval()
    plain = PlainGPT(cfg, 50).double().eval()
    theirs = dict(plain.named_parameters())
    with torch.no_grad():
        for name, weight in ours.named_parameters():
            theirs.pop(_plain_name(name)).copy_(weight)
    assert not theirs  # every parameter of the peer came from ours
    tokens = torch.randint(3, 50, (3, 9))
    tokens[:, 0] = BOS
    with torch.no_grad():
        want = ours.logits(ours.decode(tokens))
        got = plain.logits(plain.decode(tokens))
    assert (got - want).abs().max() < 1e-12 < want.abs().max()
    # its generation (nanoGPT's: the whole prefix again each step, the argmax, no token held
    # back) is the argmax of our model's logits step by step
    ids = torch.full((3, 1), BOS)
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, ours.logits(ours.decode(ids))[:, -1].argmax(-1, keepdim=True)], 1)
    assert plain.generate(torch.full((3, 1), BOS), 6) == ids[:, 1:].tolist()


def test_the_nanogpt_style_peer_drops_out_where_heads_lab_does(monkeypatch):
    """Training mode, dropout made deterministic (each call scales by a constant that depends
    on how many calls came before): equal logits only if both models drop out the same tensors
    in the same order — embeddings, the attention and feed-forward branches, the feed-forward's
    inner activation."""
    import heads_lab.model.transformer as transformer

    calls = []

    def fake(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        calls.append(tuple(x.shape))
        return x * (1.0 + 0.1 * len(calls))

    cfg = dataclasses.replace(TINY, dropout=0.1)
    torch.manual_seed(0)
    ours = LanguageModel(cfg, 50).double().train()
    plain = PlainGPT(cfg, 50).double().train()
    with torch.no_grad():
        for name, weight in ours.named_parameters():
            dict(plain.named_parameters())[_plain_name(name)].copy_(weight)
    tokens = torch.randint(3, 50, (2, 7))
    monkeypatch.setattr(transformer, "dropout", fake)
    with torch.no_grad():
        want = ours.logits(ours.decode(tokens))
    ours_calls, calls[:] = list(calls), []
    monkeypatch.setattr(torch.nn.functional, "dropout", fake)
    with torch.no_grad():
        got = plain.logits(plain.decode(tokens))
    assert calls == ours_calls and len(calls) == 1 + 3 * cfg.layers
    assert (got - want).abs().max() < 1e-12 < want.abs().max()


def test_the_hugging_face_peers_are_transformers_models_at_the_same_dims():
    """GPT-2 and Llama from their configs: their dims are heads-lab's (Llama's key/value heads
    from model.kv_heads), the bench step trains them, and each generates exactly `new` tokens
    per row by its own `generate`, the argmax of its own logits step by step."""
    pytest.importorskip("transformers", reason="the hf extra (make test installs it)")
    from heads_lab.bench.baseline import HFCausalPeer

    gpt2 = HFCausalPeer(TINY, 50, family="gpt2").eval()
    c = gpt2.hf.config
    assert (c.n_embd, c.n_layer, c.n_head, c.n_inner, c.n_positions) == (32, 2, 4, 64, 64)
    llama = HFCausalPeer(dataclasses.replace(TINY, kv_heads=2), 50, family="llama").eval()
    attn = llama.hf.model.layers[0].self_attn
    assert attn.k_proj.out_features == 2 * 8 and attn.q_proj.out_features == 4 * 8
    assert llama.hf.lm_head.weight is llama.hf.model.embed_tokens.weight  # tied
    work = LMWorkload(batch=3, length=8, vocab=50, new=5)
    for family, peer in (("gpt2", gpt2), ("llama", llama)):
        rate, out = generation_throughput(LMRow(family, TINY, peer=family), peer, work, reps=1)
        assert rate > 0 and [len(o) for o in out] == [5, 5, 5]
        ids = torch.full((3, 1), BOS)
        with torch.no_grad():
            for _ in range(5):
                nxt = peer.logits(peer.decode(ids))[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], 1)
        assert ids[:, 1:].tolist() == out
        peer.train()
        tokens, target = work.tensors()
        opt = optimizer(peer, _recipe())
        losses = [lm_step(peer, opt, "fp32", tokens, target) for _ in range(5)]
        assert losses[-1] < losses[0]  # one fixed batch: the step learns it


def _recipe():
    from heads_lab.config.schemas import TrainerConfig

    return TrainerConfig(optimizer="adamw", lr=1e-2, adam_betas=[0.9, 0.95], weight_decay=0.0)


def test_bench_lm_command_writes_its_rows(tmp_path, monkeypatch):
    """A smoke run at tiny dims: every row trained and timed, heads-lab's parameters as the
    cost account counts them, the cached generation identical to the uncached one."""
    from heads_lab.bench import main

    monkeypatch.setattr("heads_lab.bench.lm.matmul_ceiling", lambda dtype, device: 100.0)
    out = tmp_path / "lm.json"
    args = ["--lm", "--steps", "1", "--warmup", "0", "--json", str(out), "--device", "cpu",
            "--batch", "2", "--length", "8", "--new-tokens", "4", "model.d_model=32",
            "model.d_ff=64", "model.layers=2", "model.max_positions=64"]
    assert main(args) == 0
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["mha h=1", "mha h=8", "mha h=32", "mha h=8 kv_heads=2",
                          "mha h=8 kv_heads=1", "talking_heads h=8", "nanoGPT-style h=8"]
    cfg = ModelConfig(d_model=32, d_ff=64, layers=2, max_positions=64, heads=8)
    assert rows["mha h=8"]["params"] == lm_parameter_count(cfg, 4000)["total"]
    assert rows["nanoGPT-style h=8"]["params"] == rows["mha h=8"]["params"]
    assert rows["mha h=8"]["cache_identical"] is True
    assert all(r["tokens_per_s"] > 0 and r["generate_tokens_per_s"] > 0 for r in rows.values())
    assert rows["nanoGPT-style h=8"]["flops_per_token"] == rows["mha h=8"]["flops_per_token"]
    th = rows["talking_heads h=8"]
    assert th["params"] == rows["mha h=8"]["params"] + 2 * 2 * 8 * 8  # P_l, P_w per layer


@pytest.mark.parametrize("args,message", [
    (["--lm", "--depth"], "bench --lm measures eager training and generation"),
    (["--lm", "--compile"], "drop --depth, --profile, --compile"),
    (["--new-tokens", "64"], "--new-tokens is the generated length of bench --lm"),
    (["--lm", "model.kv_heads=2"], "sets each row's heads itself .* drop model.kv_heads"),
    (["--lm", "model.d_ff=0"], r"model.d_ff=0 has no counterpart in its peers"),
    (["--lm", "model.positions=none"], r"model.positions=none has no counterpart"),
    (["--lm", "model.attention_dropout=0.1"], r"model.attention_dropout=0.1 has no counterpart"),
    (["--lm", "model.d_model=48"], "model.d_model=48 must be a multiple of 32"),
    (["--batch", "0"], "--batch and --length must be at least 2"),
    (["--lm", "--batch", "0"], "--batch, --length and --new-tokens must be at least 1"),
    (["--lm", "--length", "600"], "bench --lm needs 600 positions"),
    (["--lm", "--new-tokens", "0"], "--new-tokens must be at least 1"),
    (["--lm", "model.encoder_layers=0", "model.layers=0"], "model.layers"),
])
def test_bench_lm_bad_input_is_one_line(args, message, tmp_path):
    from heads_lab.bench import main

    with pytest.raises(ConfigError, match=message):
        main([*args, "--json", str(tmp_path / "x.json")])
