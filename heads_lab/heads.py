"""Heads as units: address them (site, layer, head), mask them, remove them for real, and gate
them with Hard Concrete variables (Voita et al. 2019).

A head's output o_h [batch, query, head_dim] enters the output projection scaled by a gate
g_h (`Attention.head_gate`, shape [out_heads]; None = all ones): y = W_o · concat_h(g_h · o_h).
- mask: g_h = 0 for the masked heads (`eval.head_mask`, `mask_heads`);
- importance (Michel et al. 2019): g = ξ, a ones vector that requires grad; |∂L/∂ξ_h|;
- Hard Concrete gates (`HardConcreteGates`, installed as `model.gates`): g_h sampled from a
  stretched, clamped concrete distribution at every encode in train mode, 0/1 in eval mode; the
  trainer adds l0_lambda · penalty() to the loss.
Removing a head drops its rows of in_proj (query, key and value) and its columns of out_proj,
which gives exactly the function of the masked model (tests check it) with fewer FLOPs.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from heads_lab.errors import ConfigError
from heads_lab.model.attention import Attention, MultiHeadAttention, TalkingHeadsAttention

SITES = ("enc-self", "dec-self", "dec-enc")
SITE_NAMES = {"enc": "enc-self", "enc-self": "enc-self", "e": "enc-self",
              "dec": "dec-self", "dec-self": "dec-self", "d": "dec-self",
              "dec-enc": "dec-enc", "cross": "dec-enc", "d-e": "dec-enc"}
HeadSet = dict[tuple[str, int], list[int]]  # (site, layer) → head indices


def attention_modules(model: nn.Module) -> dict[tuple[str, int], Attention]:
    """Every attention module of a Transformer by (site, layer), in the order of SITES."""
    out: dict[tuple[str, int], Attention] = {}
    for i, layer in enumerate(model.encoder):
        out[("enc-self", i)] = layer.self_attn
    for i, layer in enumerate(model.decoder):
        out[("dec-self", i)] = layer.self_attn
    for i, layer in enumerate(model.decoder):
        out[("dec-enc", i)] = layer.cross_attn
    return out


def gated_heads(module: Attention) -> int:
    """How many heads a gate of `module` has: the heads whose outputs enter out_proj."""
    return module.out_heads


# Kinds of heads. Multi-head attention (grouped/multi-query too) has one: a query head with its
# softmax and its output ("head"). Talking heads have three, of different counts: h_K query/key
# heads (the logits J), h softmax heads (the weights W, the attention maps) and h_V value heads
# (the outputs O that masks, gates and removal act on). Numbers of different kinds never pair.
KIND_NAMES = {"head": "heads", "qk": "query/key heads (h_K)", "softmax": "softmax heads (h)",
              "value": "value heads (h_V)"}


def head_kinds(module: Attention) -> dict[str, int]:
    """{kind: count} of `module`'s heads, in the order they act (see KIND_NAMES)."""
    if isinstance(module, TalkingHeadsAttention):
        return {"qk": module.q_heads, "softmax": module.heads, "value": module.v_heads}
    return {"head": module.heads}


def map_kind(module: Attention) -> str:
    """The kind whose attention maps (softmax weights) the module returns."""
    return "softmax" if isinstance(module, TalkingHeadsAttention) else "head"


def out_kind(module: Attention) -> str:
    """The kind that masks, Hard Concrete gates and removal act on (gated_heads of them)."""
    return "value" if isinstance(module, TalkingHeadsAttention) else "head"


def set_kind_gate(module: Attention, kind: str, gate: Tensor | None) -> None:
    """Multiply the heads of one kind by `gate` [count] (None: ones)."""
    if kind == out_kind(module):
        module.head_gate = gate
    elif kind == "qk":
        module.qk_gate = gate
    elif kind == "softmax":
        module.softmax_gate = gate
    else:
        raise ValueError(f"{type(module).__name__} has no {kind!r} heads: {list(head_kinds(module))}")


def parse_head_mask(spec: str, modules: dict[tuple[str, int], Attention] | dict[tuple[str, int],
                    int]) -> HeadSet:
    """`enc:0:3,dec-enc:2:*` → {("enc-self", 0): [3], ("dec-enc", 2): [0, …, h-1]}. Sites:
    enc (enc-self), dec (dec-self), dec-enc (cross); layer and head are 0-based ints or *;
    items separated by commas (quote them on a Hydra command line) or +. `modules`: the
    model's attention modules, or their head counts by (site, layer)."""
    counts = {k: v if isinstance(v, int) else gated_heads(v) for k, v in modules.items()}
    out: HeadSet = {}
    for item in filter(None, (s.strip() for s in re.split(r"[,+\s]", spec))):
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in SITE_NAMES:
            raise ConfigError(f"bad head spec {item!r} in {spec!r}: write site:layer:head, site "
                              "one of enc, dec, dec-enc, layer and head a number or *, "
                              "e.g. enc:0:3,dec-enc:2:*")
        site = SITE_NAMES[parts[0]]
        layers = sorted(layer for s, layer in counts if s == site)
        for layer in _pick(parts[1], layers, f"{site} layer", item):
            heads = list(range(counts[(site, layer)]))
            for head in _pick(parts[2], heads, f"{site} layer {layer} head", item):
                chosen = out.setdefault((site, layer), [])
                if head not in chosen:
                    chosen.append(head)
    return {key: sorted(v) for key, v in out.items()}


def config_head_counts(cfg) -> dict[tuple[str, int], int]:
    """Heads per (site, layer) of a ModelConfig (for checking a spec before a model exists)."""
    layers = {"enc-self": cfg.encoder_layers, "dec-self": cfg.decoder_layers,
              "dec-enc": cfg.decoder_layers}
    return {(site, i): cfg.head_counts(site)["out"] for site in SITES for i in range(layers[site])}


def _pick(text: str, choices: list[int], what: str, item: str) -> list[int]:
    if text == "*":
        return choices
    if not re.fullmatch(r"\d+", text) or int(text) not in choices:
        raise ConfigError(f"head spec {item!r}: no {what} {text!r}; choose from "
                          f"{choices[0]}-{choices[-1]} or *" if choices else f"no {what}s")
    return [int(text)]


def format_heads(heads: HeadSet) -> str:
    """The inverse of parse_head_mask (one item per head)."""
    short = {"enc-self": "enc", "dec-self": "dec", "dec-enc": "dec-enc"}
    return ",".join(f"{short[site]}:{layer}:{h}" for (site, layer), hs in sorted(heads.items())
                    for h in hs)


def mask_heads(model: nn.Module, heads: HeadSet) -> None:
    """Zero the outputs of `heads` (every other head's gate is 1); an empty set unmasks."""
    for key, module in attention_modules(model).items():
        if key in heads and heads[key]:
            gate = torch.ones(gated_heads(module), device=module.out_proj.weight.device)
            gate[heads[key]] = 0.0
            module.head_gate = gate
        else:
            module.head_gate = None


def count_heads(model: nn.Module) -> dict[str, int]:
    """Heads per site (their gates' sizes), e.g. {"enc-self": 24, ...}."""
    out = dict.fromkeys(SITES, 0)
    for (site, _), module in attention_modules(model).items():
        out[site] += gated_heads(module)
    return out


def remove_heads(model: nn.Module, heads: HeadSet) -> HeadSet:
    """Remove `heads` for real: their query/key/value rows of in_proj and their columns of
    out_proj go, so the model is smaller and faster. Multi-head attention with one key/value
    head per query head only (grouped/multi-query heads share keys; talking heads mix all
    heads): others raise ConfigError. A module left with no head keeps out_proj's bias only.
    Returns the heads kept per module (original indices), for rebuilding the pruned model."""
    kept: HeadSet = {}
    for key, module in attention_modules(model).items():
        drop = set(heads.get(key, []))
        keep = [h for h in range(module.out_heads) if h not in drop]
        kept[key] = keep
        if not drop:
            continue
        if isinstance(module, TalkingHeadsAttention) or module.k_heads != module.q_heads:
            raise ConfigError("removing heads needs plain multi-head attention (model.attention="
                              "mha without kv_heads); mask them instead with eval.head_mask")
        _shrink(module, keep)
    return kept


@torch.no_grad()
def _shrink(module: MultiHeadAttention, keep: list[int]) -> None:
    d, h = module.head_dim, module.q_heads
    rows = torch.tensor([part * h * d + head * d + i for part in range(3) for head in keep
                         for i in range(d)], dtype=torch.long, device=module.in_proj.weight.device)
    cols = rows[: len(keep) * d]
    with warnings.catch_warnings():  # a module losing every head: zero-element weights
        warnings.simplefilter("ignore", UserWarning)
        in_proj = nn.Linear(module.in_proj.in_features, len(rows)).to(module.in_proj.weight)
        out_proj = nn.Linear(len(cols), module.out_proj.out_features).to(module.out_proj.weight)
    in_proj.weight.copy_(module.in_proj.weight[rows])
    in_proj.bias.copy_(module.in_proj.bias[rows])
    out_proj.weight.copy_(module.out_proj.weight[:, cols])
    out_proj.bias.copy_(module.out_proj.bias)
    module.in_proj, module.out_proj = in_proj, out_proj
    n = len(keep)
    module.heads = module.q_heads = module.k_heads = module.v_heads = module.out_heads = n
    module.sizes = (n * d, n * d, n * d)
    if module.position_bias is not None:
        module.position_bias = nn.Parameter(module.position_bias[keep].clone())
    if module.head_gate is not None:
        module.head_gate = module.head_gate[keep] if n else None


def apply_kept(model: nn.Module, kept: HeadSet) -> None:
    """Rebuild a pruned model's shapes from `remove_heads`' return value (before loading its
    weights): every module keeps len(kept[key]) heads."""
    modules = attention_modules(model)
    drop = {key: [h for h in range(modules[key].out_heads) if h not in hs]
            for key, hs in kept.items() if key in modules}
    remove_heads(model, drop)


class HardConcreteGates(nn.Module):
    """One Hard Concrete gate per head of every attention module (Louizos et al. 2018, as used
    by Voita et al. 2019): log α per head; with u ~ U(0, 1),
      s = σ((log u − log(1 − u) + log α) / β),  z = min(1, max(0, s·(ζ − γ) + γ))
    while training. At test time the deterministic ẑ = min(1, max(0, σ(log α)(ζ − γ) + γ)) decides
    (`rule`): "voita", as Voita et al.'s code, keeps a head iff ẑ > 0 (log α > −ln(−ζ/γ), −2.40
    for the default stretch) and scales its output by ẑ; "binary" keeps it iff ẑ > 0.5
    (log α > 0 for the default stretch) at 1. The L0 term of a module is Σ_h P(z_h ≠ 0) =
    Σ_h σ(log α_h − β log(−γ/ζ)); `penalty` averages it over the gated modules. log α starts at
    logit(init_keep)."""

    def __init__(self, model: nn.Module, sites: tuple[str, ...] = SITES, temperature: float = 0.33,
                 stretch: tuple[float, float] = (-0.1, 1.1), init_keep: float = 0.9,
                 l0_lambda: float = 0.0, lr: float | None = None, rule: str = "voita"):
        super().__init__()
        if rule not in ("voita", "binary"):
            raise ValueError(f"gate rule {rule!r}: voita or binary")
        self.beta, (self.gamma, self.zeta) = temperature, stretch
        self.l0_lambda, self.lr = l0_lambda, lr  # lr: the gates' own (None: the model's)
        self.rule = rule
        self.keys = [key for key in attention_modules(model) if key[0] in sites]
        # σ(log α) = init_keep at the start: every gate open at test time
        start = math.log(init_keep / (1 - init_keep))
        self.log_alpha = nn.ParameterDict({
            _name(key): nn.Parameter(torch.full((gated_heads(attention_modules(model)[key]),),
                                                start))
            for key in self.keys})
        self.modules_ = attention_modules(model)  # a plain dict: not submodules of the gates

    def sample(self, log_alpha: Tensor) -> Tensor:
        u = torch.rand_like(log_alpha).clamp(1e-6, 1 - 1e-6)
        s = torch.sigmoid((u.log() - (-u).log1p() + log_alpha) / self.beta)
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def expected(self, log_alpha: Tensor) -> Tensor:
        return (torch.sigmoid(log_alpha) * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def test_gates(self) -> dict[tuple[str, int], Tensor]:
        """Each gated module's test-time gate [heads] under `rule`: ẑ (voita) or ẑ > 0.5 (binary);
        0 is a closed head."""
        out = {}
        for key in self.keys:
            z = self.expected(self.log_alpha[_name(key)]).detach()
            out[key] = z if self.rule == "voita" else (z > 0.5).to(z.dtype)
        return out

    def prob_open(self, log_alpha: Tensor) -> Tensor:
        """P(z ≠ 0) per head."""
        return torch.sigmoid(log_alpha - self.beta * math.log(-self.gamma / self.zeta))

    def penalty(self) -> Tensor:
        """Σ_h P(z_h ≠ 0) per gated module, averaged over the modules."""
        return torch.stack([self.prob_open(self.log_alpha[_name(k)]).sum()
                            for k in self.keys]).mean()

    def set_gates(self, training: bool) -> None:
        """Put a gate on every gated module: a sample (training) or the test-time 0/1 gate."""
        test = None if training else self.test_gates()
        for key in self.keys:
            module = self.modules_[key]
            module.head_gate = (self.sample(self.log_alpha[_name(key)]) if training
                                else test[key])

    def closed(self) -> HeadSet:
        """The heads whose test-time gate is 0."""
        return {key: [int(h) for h in (gate == 0).nonzero().flatten()]
                for key, gate in self.test_gates().items()}


def install_gates(model: nn.Module, prune_cfg, l0_lambda: float | None = None) -> None:
    """Hard Concrete gates on `model` (as model.gates) from a PruneConfig."""
    model.gates = HardConcreteGates(
        model, tuple(prune_cfg.sites), prune_cfg.temperature, tuple(prune_cfg.stretch),
        init_keep=prune_cfg.init_keep,
        l0_lambda=prune_cfg.l0_lambda if l0_lambda is None else l0_lambda, lr=prune_cfg.gate_lr,
        rule=prune_cfg.gate_eval,
    ).to(next(model.parameters()).device)


@torch.no_grad()
def fold_gates(model: nn.Module) -> HeadSet:
    """Make a gated model's test-time function its own and take the gates off: each head's
    test-time gate (ẑ under the voita rule, 1 or 0 under binary) multiplies its columns of
    out_proj. Returns the closed heads (now contributing nothing), for remove_heads."""
    gates = model.gates
    closed = gates.closed()
    for key, gate in gates.test_gates().items():
        module = gates.modules_[key]
        scale = gate.to(module.out_proj.weight.dtype).repeat_interleave(module.head_dim)
        module.out_proj.weight.mul_(scale[None, :])
    model.gates = None
    for module in attention_modules(model).values():
        module.head_gate = None
    return closed


def gates_kept(model: nn.Module) -> dict[str, int]:
    """Heads per attention type whose test-time gate is open (ungated modules count whole)."""
    kept = count_heads(model)
    for (site, _), heads in model.gates.closed().items():
        kept[site] -= len(heads)
    return kept


def _name(key: tuple[str, int]) -> str:
    return f"{key[0]}_{key[1]}"


def iter_heads(model: nn.Module) -> Iterator[tuple[str, int, int]]:
    for (site, layer), module in attention_modules(model).items():
        for h in range(gated_heads(module)):
            yield site, layer, h
