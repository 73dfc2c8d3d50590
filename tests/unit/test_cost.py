"""The cost account against the built model and against torch's FLOP counter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from heads_lab.config.cost import Lengths, account, attention_activation_bytes, parameter_count
from heads_lab.config.schemas import AttentionKind, ModelConfig, Norm
from heads_lab.model import Transformer, count_parameters, label_smoothed_loss

TH = AttentionKind.talking_heads
GRID = [
    dict(heads=1), dict(heads=8), dict(heads=32, d_model=128), dict(heads=3, head_dim=20),
    dict(kv_heads=1), dict(kv_heads=4), dict(norm=Norm.post),
    dict(attention=TH, heads=8), dict(attention=TH, heads=32, d_model=128),
    dict(attention=TH, heads_k=4, heads=8, heads_v=2),
    dict(attention=TH, heads=6, heads_k=2, heads_v=3, head_dim=8, talking_heads_in=["dec-self"]),
    dict(encoder_layers=1, decoder_layers=4, d_ff=100),
    dict(relative_positions=16), dict(attention=TH, heads_k=4, heads=8, relative_positions=2),
    dict(attention=TH, heads=8, mixes="logits"), dict(attention=TH, heads=8, heads_v=4, mixes="weights"),
]


@pytest.mark.parametrize("variant", GRID)
def test_parameter_formula_matches_the_built_model(variant):
    cfg = ModelConfig(**{"d_model": 64, "heads": 8, "d_ff": 128, "encoder_layers": 2,
                         "decoder_layers": 2, **variant})
    counted = count_parameters(Transformer(cfg, 97))
    assert parameter_count(cfg, 97) == counted


@pytest.mark.parametrize("variant", GRID[:11])
@pytest.mark.parametrize("sites", [("enc-self", "dec-self", "dec-enc"), ("dec-enc",)])
def test_gate_parameters_are_the_installed_gates(variant, sites):
    """One log α per gated head: the formula against Hard Concrete gates on the built model."""
    from heads_lab.config.cost import gate_parameters
    from heads_lab.config.schemas import PruneConfig
    from heads_lab.model.heads import install_gates

    cfg = ModelConfig(**{"d_model": 64, "heads": 8, "d_ff": 128, "encoder_layers": 2,
                         "decoder_layers": 3, **variant})
    gates = install_gates(Transformer(cfg, 97), PruneConfig(sites=list(sites), l0_lambda=0.1))
    assert gate_parameters(cfg, sites) == sum(p.numel() for p in gates.parameters())


def test_talking_heads_extra_is_hk_h_plus_h_hv_per_layer():
    cfg = ModelConfig(d_model=96, heads=12, attention=TH, encoder_layers=1, decoder_layers=1)
    params = parameter_count(cfg, 50)
    assert params["talking_heads"] == 3 * 288  # 12·12 + 12·12 per attention layer, 3 layers
    mha = parameter_count(ModelConfig(d_model=96, heads=12, encoder_layers=1, decoder_layers=1), 50)
    assert params["total"] - mha["total"] == 3 * 288


def test_mha_parameters_do_not_depend_on_heads_but_kv_heads_save_parameters():
    totals = {h: parameter_count(ModelConfig(d_model=256, heads=h), 8000)["total"]
              for h in (1, 4, 8, 16, 32)}
    assert len(set(totals.values())) == 1
    mqa = parameter_count(ModelConfig(d_model=256, heads=8, kv_heads=1), 8000)
    assert mqa["attention"] < parameter_count(ModelConfig(d_model=256, heads=8), 8000)["attention"]


def _counted_train_flops(cfg: ModelConfig, vocab: int, batch: int, src: int, tgt: int) -> float:
    """FLOPs torch counts in one real training step (forward + backward) without padding. The
    explicit-matmul attention path is used because the counter does not see CPU fused SDPA."""
    torch.manual_seed(0)
    model = Transformer(cfg, vocab)
    src_ids = torch.randint(4, vocab, (batch, src))
    tgt_in = torch.randint(4, vocab, (batch, tgt))
    tgt_out = torch.randint(4, vocab, (batch, tgt))
    with FlopCounterMode(display=False) as counter:
        hidden = model.decode(tgt_in, model.encode(src_ids, need_weights=True), need_weights=True)
        loss, _ = label_smoothed_loss(model.logits(hidden.reshape(-1, cfg.d_model)),
                                      tgt_out.reshape(-1), 0.1)
        loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("variant", [
    dict(heads=8), dict(heads=1), dict(heads=16, kv_heads=2),
    dict(attention=TH, heads=8), dict(attention=TH, heads_k=4, heads=8, heads_v=2),
    dict(attention=TH, heads_k=4, heads=8, mixes="logits"),
    dict(attention=TH, heads=8, heads_v=2, mixes="weights"),
])
def test_train_flops_equal_torch_flop_counter(variant):
    cfg = ModelConfig(**{"d_model": 64, "heads": 8, "d_ff": 256, "encoder_layers": 2,
                         "decoder_layers": 2, "dropout": 0.0, **variant})
    vocab, batch, src, tgt = 300, 4, 11, 9
    counted = _counted_train_flops(cfg, vocab, batch, src, tgt)
    predicted = account(cfg, vocab, Lengths(src, tgt))["flops_per_token"]["train"] * batch * tgt
    assert predicted == pytest.approx(counted, rel=1e-3)  # exact up to rounding; the issue asks 5 %


@pytest.mark.parametrize("variant", [dict(heads=8), dict(attention=TH, heads_k=2, heads=8),
                                     dict(attention=TH, heads_k=2, heads=8, mixes="logits")])
def test_decode_flops_equal_the_counter_on_cached_greedy_steps(variant):
    cfg = ModelConfig(**{"d_model": 64, "heads": 8, "d_ff": 256, "encoder_layers": 2,
                         "decoder_layers": 2, **variant})
    vocab, src_len, steps = 300, 10, 7
    model = Transformer(cfg, vocab).eval()
    src = torch.randint(4, vocab, (1, src_len))
    token = torch.full((1, 1), 2)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        enc, caches = model.encode(src, need_weights=True), model.new_caches()
        for t in range(steps):  # greedy, one cached position per step, matmul attention path
            hidden = model.decode(token, enc, need_weights=True, caches=caches, offset=t)
            token = model.logits(hidden[:, -1]).argmax(-1, keepdim=True)
    predicted = account(cfg, vocab, Lengths(src_len, steps))["flops_per_token"]["decode"] * steps
    assert predicted == pytest.approx(counter.get_total_flops(), rel=1e-3)


def _saved_nm_bytes(attention, n: int, m: int) -> int:
    """Bytes of the tensors autograd keeps for backward in one training forward of an attention
    module (batch 1, n queries, m keys) made of n·m blocks (any view of them), counted by
    torch's own saved-tensor hooks, each storage once."""
    storages: dict[int, int] = {}

    def pack(t):
        if t.numel() % (n * m) == 0:  # views of one storage (W and W flattened) count once
            ptr = t.untyped_storage().data_ptr()
            storages[ptr] = max(storages.get(ptr, 0), t.numel() * t.element_size())
        return t

    x, memory = torch.randn(1, n, attention.in_proj.in_features), None
    if n != m:
        memory = torch.randn(1, m, attention.in_proj.in_features)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attention.train()(x, memory)[0].sum()
    return sum(storages.values())


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("variant", [{}, {"kv_heads": 2}, {"heads_k": 4, "heads_v": 2, "attention": TH},
                                     {"heads_k": 2, "heads_v": 8, "attention": TH},
                                     {"heads_k": 2, "attention": TH, "mixes": "logits"},
                                     {"heads_v": 2, "attention": TH, "mixes": "weights"}])
def test_attention_activation_memory_is_what_autograd_keeps(variant, dropout):
    """The cost account's n·m term equals the bytes autograd saves on the CPU matmul path (n = 7
    and d_head = 8, so that no query, key or value projection has a multiple of n·m elements)."""
    from heads_lab.model.transformer import _attention

    cfg = ModelConfig(d_model=64, heads=8, attention_dropout=dropout, **variant)
    n, m = 7, 30
    measured = _saved_nm_bytes(_attention(cfg, "dec-enc"), n, m)
    assert measured > 0
    assert attention_activation_bytes(cfg, "dec-enc", n, m) == measured


_REUSED_WORKER = """
import gc, json, torch
from heads_lab.training.device import PeakMemory

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))

torch.set_num_threads(1)
start = rss()
# an earlier sweep job in the same worker: an 8 MB block freed (glibc then serves ~1 MB blocks
# from its heap instead of mmap), 300 ~1 MB blocks, each followed by a small one that stays alive
keep, blocks = [], []
del_first = torch.ones(2 << 20)
del del_first
for i in range(300):
    blocks.append(torch.ones((1 << 18) + i))
    keep.append(torch.ones(16))
before = rss()
del blocks
gc.collect()
freed = rss()
peak = PeakMemory(torch.device("cpu"))
print(json.dumps(dict(start=start, before=before, freed=freed, measured=peak.mb())))
"""


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="the kernel does not let this process reset its peak RSS (/proc/self/clear_refs)")
def test_cpu_peak_memory_of_a_job_in_a_reused_worker_leaves_out_the_earlier_jobs_freed_memory():
    """A job's peak RSS is measured from what the process holds at its start, after the earlier
    job's freed heap (which glibc keeps resident) is handed back: not from the earlier job's."""
    out = subprocess.run([sys.executable, "-c", _REUSED_WORKER], capture_output=True, text=True,
                         check=True)
    mb = json.loads(out.stdout)
    assert mb["before"] - mb["start"] > 250  # the earlier job's ~300 MB were resident
    assert mb["measured"] < mb["start"] + 60, mb  # and are not counted in this job's peak
