"""The Transformer: masking, causality, cached decoding, the loss, per-head weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from heads_lab.config import ModelConfig, Norm
from heads_lab.model import Transformer, label_smoothed_loss

V = 40


def _model(norm: Norm = Norm.pre, heads: int = 4) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=heads, d_ff=64, encoder_layers=2, decoder_layers=2,
                      dropout=0.0, norm=norm)
    return Transformer(cfg, V).double().eval()


@pytest.mark.parametrize("norm", [Norm.pre, Norm.post])
def test_padding_does_not_change_outputs(norm):
    model = _model(norm)
    src = torch.randint(4, V, (1, 6))
    tgt = torch.randint(4, V, (1, 5))
    padded_src = torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], 1)
    padded_tgt = torch.cat([tgt, torch.zeros(1, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(model(padded_src, padded_tgt)[:, :5], model(src, tgt))


def test_decoder_is_causal():
    model = _model()
    src = torch.randint(4, V, (2, 6))
    tgt = torch.randint(4, V, (2, 7))
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, V, (2, 3))
    torch.testing.assert_close(model(src, tgt)[:, :4], model(src, changed)[:, :4])
    assert not torch.allclose(model(src, tgt)[:, 4:], model(src, changed)[:, 4:])


def test_cached_incremental_decoding_equals_full_forward():
    model = _model()
    src = torch.randint(4, V, (3, 6))
    src[1, 4:] = 0  # padding in the source
    tgt = torch.randint(4, V, (3, 7))
    full = model(src, tgt)
    enc, caches = model.encode(src), model.new_caches()
    steps = [model.logits(model.decode(tgt[:, t : t + 1], enc, caches=caches, offset=t))
             for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_label_smoothed_loss_matches_torch_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(50, V, dtype=torch.float64)
    target = torch.randint(0, V, (50,))
    loss, nll = label_smoothed_loss(logits, target, 0.1)
    torch.testing.assert_close(loss, F.cross_entropy(logits, target, label_smoothing=0.1,
                                                     reduction="sum"))
    torch.testing.assert_close(nll, F.cross_entropy(logits, target, reduction="sum"))


def test_attention_weights_per_head_are_distributions():
    model = _model(heads=4)
    src = torch.randint(4, V, (2, 6))
    src[0, 3:] = 0
    tgt = torch.randint(4, V, (2, 5))
    enc = model.encode(src, need_weights=True)
    model.decode(tgt, enc, need_weights=True)
    weights = model.attention_weights()
    assert set(weights) == {"enc-self", "dec-self", "dec-enc"}
    for per_layer in weights.values():
        assert len(per_layer) == 2
        for w in per_layer:
            assert w.shape[:2] == (2, 4)
            torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert torch.all(weights["dec-enc"][0][0, :, :, 3:] == 0)  # padded source keys
    assert torch.all(weights["dec-self"][1][:, :, 0, 1:] == 0)  # no peeking at the future


def test_tied_output_projection_and_zero_pad_embedding():
    model = _model()
    logits = model.logits(torch.ones(1, 32, dtype=torch.float64))
    torch.testing.assert_close(logits[0], model.embed.weight.sum(-1))
    assert torch.all(Transformer(ModelConfig(d_model=16, heads=2), 30).embed.weight[0] == 0)
