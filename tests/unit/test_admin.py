"""Admin initialisation (Liu et al. 2020) for post-norm models: ω from a profiling pass."""

from __future__ import annotations

import math

import pytest
import torch

from heads_lab.config.schemas import ModelConfig, Norm
from heads_lab.model import Transformer, admin_init

V = 40


def _model(init: str) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=3, decoder_layers=2,
                      dropout=0.1, norm=Norm.post, init=init)
    return Transformer(cfg, V)


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(4, V, (6, 9), generator=g), torch.randint(4, V, (6, 7), generator=g)


def test_omega_is_the_root_of_the_accumulated_branch_variances():
    model = _model("admin")
    src, tgt = _batch()
    variances: dict[str, list[float]] = {"enc": [], "dec": []}

    def hook(stack):
        def record(module, args, out):
            out = out[0] if isinstance(out, tuple) else out
            variances[stack].append(out.double().var().item())
        return record

    handles = []
    for layer in model.encoder:
        handles += [layer.self_attn.register_forward_hook(hook("enc")),
                    layer.ffn.register_forward_hook(hook("enc"))]
    for layer in model.decoder:
        handles += [m.register_forward_hook(hook("dec"))
                    for m in (layer.self_attn, layer.cross_attn, layer.ffn)]
    omegas = admin_init(model, src, tgt)
    for h in handles:
        h.remove()
    model.eval()
    expected = []
    for stack, tokens in (("enc", src), ("dec", tgt)):
        total = model.embed_tokens(tokens).double().var().item()
        for v in variances[stack]:
            expected.append(math.sqrt(total))
            total += v
    assert omegas == pytest.approx(expected, rel=1e-5)
    residuals = [r for layer in model.encoder for r in (layer.res_self, layer.res_ffn)] + \
        [r for layer in model.decoder for r in (layer.res_self, layer.res_cross, layer.res_ffn)]
    for r, w in zip(residuals, omegas):
        torch.testing.assert_close(r.omega.detach(), torch.full((32,), w))
    assert omegas[0] < omegas[5] and omegas[6] < omegas[-1]  # grows along each stack
    assert model.training is False  # eval() above; admin_init itself restores the mode


def test_admin_with_unit_omega_is_the_plain_post_norm_model_and_omega_learns():
    admin, plain = _model("admin"), _model("xavier")
    plain.load_state_dict({k: v for k, v in admin.state_dict().items() if "omega" not in k})
    admin.eval()
    plain.eval()
    src, tgt = _batch()
    torch.testing.assert_close(admin(src, tgt), plain(src, tgt))  # ω = 1: the same function
    admin_init(admin, src, tgt)
    assert not torch.allclose(admin(src, tgt), plain(src, tgt))
    admin.train()
    loss, _ = admin.loss(admin(src, tgt, hidden_only=True).reshape(-1, 32), tgt.flatten(), 0.1)
    loss.backward()
    assert admin.decoder[0].res_self.omega.grad.abs().sum() > 0  # ω is a learned parameter
