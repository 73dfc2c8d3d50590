"""The CPU dropout kernel and the bf16 autocast path."""

from __future__ import annotations

import pytest
import torch

from heads_lab.config.schemas import ModelConfig
from heads_lab.model import MultiHeadAttention, Transformer
from heads_lab.model.dropout import dropout, keep_mask
from heads_lab.training.device import autocast

CPU = torch.device("cpu")


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_rate_is_one_minus_p(p):
    torch.manual_seed(0)
    mask = keep_mask(torch.Size([1000, 1001]), p, CPU)  # an odd size: the last draw is cut
    assert mask.dtype == torch.bool and mask.shape == (1000, 1001)
    assert abs(mask.float().mean().item() - (1 - p)) < 0.002
    lanes = mask.view(-1)[: 4 * 250_000].view(-1, 4).float().mean(0)  # every lane is unbiased
    assert torch.allclose(lanes, torch.full((4,), 1 - p), atol=0.004)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_mask_in_a_float_dtype_is_the_bool_mask_as_zeros_and_ones(dtype):
    torch.manual_seed(5)
    as_bool = keep_mask(torch.Size([33, 17]), 0.3, CPU)
    torch.manual_seed(5)
    as_float = keep_mask(torch.Size([33, 17]), 0.3, CPU, dtype)
    assert as_float.dtype == dtype
    assert torch.equal(as_float, as_bool.to(dtype))


def test_dropout_scales_masks_and_is_seeded():
    x = torch.ones(400, 500, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.2, True)
    torch.manual_seed(3)
    assert torch.equal(y, dropout(x, 0.2, True))
    kept = y != 0
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.8))
    assert abs(y.mean().item() - 1.0) < 0.01
    y.sum().backward()
    assert torch.equal(x.grad, kept.float() / 0.8)
    assert dropout(x, 0.2, False) is x and dropout(x, 0.0, True) is x


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_attention_path_matches_fp32(causal):
    torch.manual_seed(0)
    att = MultiHeadAttention(64, 4, 16).eval()
    x = torch.randn(3, 9, 64)
    mask = None if causal else (torch.arange(9) < torch.tensor([9, 5, 2])[:, None])[:, None, None]
    y32, _ = att(x, mask=mask, causal=causal)
    with autocast(CPU, "bf16"):
        y16, _ = att(x, mask=mask, causal=causal)
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), y32, rtol=3e-2, atol=3e-2)


def test_bf16_model_logits_track_fp32():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=64, heads=4, d_ff=128, encoder_layers=2,
                                    decoder_layers=2, dropout=0.0), 100).eval()
    src, tgt = torch.randint(4, 100, (4, 10)), torch.randint(4, 100, (4, 8))
    ref = model(src, tgt).log_softmax(-1)
    with autocast(CPU, "bf16"):
        low = model(src, tgt).float().log_softmax(-1)
    assert (low.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    assert (low - ref).abs().mean() < 0.05
