"""Heads as units, the one place that controls them: address them (site, layer, head), mask them,
weigh them (importance multipliers), gate them with Hard Concrete variables (Voita et al. 2019),
record their attention maps, and remove them for real.

Everything acts through PyTorch hooks that a context manager installs and removes, so no module
carries a control attribute. A head's output o_h [batch, query, head_dim] enters the output
projection scaled by g_h: y = W_o · concat_h(g_h · o_h), the scale applied by a forward pre-hook
on `out_proj`:
- `masked(model, heads)`: g_h = 0 for the masked heads (`eval.head_mask`, pruning curves);
- `multipliers(model)`: g = ξ, ones that require grad (importance, Michel et al. 2019);
- `HardConcreteGates` (attached by `install_gates`): g sampled once per forward in train mode,
  the test-time gate in eval mode; the trainer adds its `loss()` as an extra term.
`recording(model)` collects the per-head softmax weights a forward returns with need_weights.
Removing heads is the attention module's own `keep_heads`; it computes what the masked model
did (tests check it) with fewer FLOPs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from heads_lab.config.sites import ALL_SITES, SITES, HeadSet, format_heads, parse_head_mask  # noqa: F401 (re-export)
from heads_lab.config.variants import VARIANTS
from heads_lab.errors import ConfigError
from heads_lab.model.attention import Attention

# Kinds of heads. Multi-head attention (grouped/multi-query too) has one: a query head with its
# softmax and its output ("head"). Talking heads have three, of different counts: h_K query/key
# heads (the logits J), h softmax heads (the weights W, the attention maps) and h_V value heads
# (the outputs O that masks, gates and removal act on). Numbers of different kinds never pair.
KIND_NAMES = {"head": "heads", "qk": "query/key heads (h_K)", "softmax": "softmax heads (h)",
              "value": "value heads (h_V)"}


def attention_modules(model: nn.Module) -> dict[tuple[str, int], Attention]:
    """Every attention module of a Transformer by (site, layer), in the order of SITES; a
    language model's (heads_lab.model.lm) at lm-self."""
    out: dict[tuple[str, int], Attention] = {}
    for i, layer in enumerate(model.encoder):
        out[("enc-self", i)] = layer.self_attn
    for i, layer in enumerate(model.decoder):
        out[("dec-self", i)] = layer.self_attn
    for i, layer in enumerate(model.decoder):
        out[("dec-enc", i)] = layer.cross_attn
    for i, layer in enumerate(getattr(model, "layers", ())):
        out[("lm-self", i)] = layer.self_attn
    return out


def head_kinds(module: Attention) -> dict[str, int]:
    """{kind: count} of `module`'s heads as it is now (pruning shrinks them), in the order they
    act (see KIND_NAMES)."""
    return module.kinds()


def map_kind(module: Attention) -> str:
    """The kind whose attention maps (softmax weights) the module returns."""
    return VARIANTS[module.variant].map_kind


def out_kind(module: Attention) -> str:
    """The kind that masks, Hard Concrete gates and removal act on (module.out_heads of them)."""
    return VARIANTS[module.variant].out_kind


def head_counts(model: nn.Module) -> dict[tuple[str, int], int]:
    """Heads of the out kind per (site, layer): what head specs and masks address."""
    return {key: m.out_heads for key, m in attention_modules(model).items()}


def count_heads(model: nn.Module) -> dict[str, int]:
    """Heads per site (of the out kind), e.g. {"enc-self": 24, ...}."""
    modules = attention_modules(model)
    out = dict.fromkeys(SITES if not any(s == "lm-self" for s, _ in modules) else ("lm-self",), 0)
    for (site, _), module in modules.items():
        out[site] += module.out_heads
    return out


# --- head-output multipliers ---------------------------------------------------------------

def _scale_outputs(module: Attention, gate: Callable[[], Tensor | None]):
    """A forward pre-hook on module.out_proj multiplying each head's output by gate()[h] (None:
    unchanged); returns its handle. The product is the one the heads' [batch, heads, query,
    head_dim] output would get, element for element."""
    def hook(_, inputs):
        g = gate()
        if g is None:
            return None
        (x,) = inputs  # [batch, query, out_heads · head_dim]
        return (x * g.to(x.dtype).repeat_interleave(module.head_dim),)

    return module.out_proj.register_forward_pre_hook(hook)


@contextlib.contextmanager
def _hooks() -> Iterator[list]:
    handles: list = []
    try:
        yield handles
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def masked(model: nn.Module, heads: HeadSet | None) -> Iterator[None]:
    """Within the block, the outputs of `heads` (of the out kind) are zero."""
    with _hooks() as handles:
        for key, module in attention_modules(model).items():
            if heads and heads.get(key):
                gate = torch.ones(module.out_heads, device=module.out_proj.weight.device)
                gate[heads[key]] = 0.0
                handles.append(_scale_outputs(module, lambda g=gate: g))
        yield


@contextlib.contextmanager
def multipliers(model: nn.Module, masked_heads: HeadSet | None = None,
                sites=ALL_SITES) -> Iterator[dict[tuple[str, int], Tensor]]:
    """ξ per (site, layer): ones (zeros for `masked_heads`) multiplying the out-kind heads'
    outputs, requiring grad for the modules in `sites`, so ∂L/∂ξ is each head's importance."""
    xi: dict[tuple[str, int], Tensor] = {}
    with _hooks() as handles:
        for (site, layer), module in attention_modules(model).items():
            gate = torch.ones(module.out_heads, device=module.out_proj.weight.device)
            if masked_heads and masked_heads.get((site, layer)):
                gate[masked_heads[(site, layer)]] = 0.0
            xi[site, layer] = gate.requires_grad_(site in sites)
            handles.append(_scale_outputs(module, lambda g=xi[site, layer]: g))
        yield xi


@contextlib.contextmanager
def recording(model: nn.Module) -> Iterator[dict[tuple[str, int], Tensor]]:
    """Collects, per (site, layer), the per-head softmax weights [batch, heads, query, key] of
    the module's last call with need_weights=True (the maps' kind: softmax heads for talking
    heads)."""
    maps: dict[tuple[str, int], Tensor] = {}
    with _hooks() as handles:
        for key, module in attention_modules(model).items():
            def hook(_, __, output, key=key):
                if output[1] is not None:
                    maps[key] = output[1]
            handles.append(module.register_forward_hook(hook))
        yield maps


# --- planted heads (the positive control of the map measures) -----------------------------

Plant = Callable[[Tensor], Tensor]  # src ids [batch, src] → weights [batch, src, src]


@contextlib.contextmanager
def planted(model: nn.Module, plants: dict[tuple[int, int], Plant]) -> Iterator[None]:
    """Within the block, encoder self-attention head `head` of layer `layer` attends with the
    weights plant(src) [batch, query, key] (src: the token ids of the batch being encoded; rows
    sum to 1 over the sentence's own keys) instead of its own softmax: its output is those
    weights times its values, so the model computes with the planted head and `recording`, the
    map measures and importance see it (LRP, which steps through the module's parts itself,
    does not). The other heads are untouched. Multi-head attention (one key/value head per query
    head) only: where a head's role is known, `analyze` must find it."""
    src: list[Tensor] = []
    modules = attention_modules(model)
    with _hooks() as handles:
        # the encoder runs right after the source is embedded: remember the ids it was given
        def remember(_, inputs):
            src[:] = [inputs[0]]
        handles.append(model.embed.register_forward_pre_hook(remember))
        for layer in {layer for layer, _ in plants}:
            module = modules[("enc-self", layer)]
            if VARIANTS[module.variant].map_kind != "head" or module.k_heads != module.q_heads:
                raise ConfigError("planted heads need plain multi-head attention")
            heads = {h: fn for (lay, h), fn in plants.items() if lay == layer}

            def hook(mod, args, kwargs, output, heads=heads):
                x, mask = args[0], kwargs.get("mask")
                q, k, v = mod.project(x, None, None)
                o, weights = mod.attend(q, k, v, mask, False, True)
                weights = weights.clone()
                for h, fn in heads.items():
                    weights[:, h] = fn(src[0]).to(weights)
                o = torch.matmul(weights, v)
                return mod.merge(o), (weights if kwargs.get("need_weights") else None)
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
        yield


# --- removal -------------------------------------------------------------------------------

def remove_heads(model: nn.Module, heads: HeadSet) -> HeadSet:
    """Remove `heads` (of the out kind) for real, each module by its own `keep_heads`: the model
    is smaller and faster and computes what the masked one did. Variants whose heads cannot go
    one by one (grouped key/value heads, talking heads) raise ConfigError. A module left with no
    head keeps out_proj's bias only. Returns the heads kept per module (original indices), for
    rebuilding the pruned model."""
    kept: HeadSet = {}
    for key, module in attention_modules(model).items():
        drop = set(heads.get(key, []))
        kept[key] = [h for h in range(module.out_heads) if h not in drop]
        if drop:
            module.keep_heads(kept[key])
    return kept


def apply_kept(model: nn.Module, kept: HeadSet) -> None:
    """Rebuild a pruned model's shapes from `remove_heads`' return value (before loading its
    weights): every module keeps len(kept[key]) heads."""
    modules = attention_modules(model)
    drop = {key: [h for h in range(modules[key].out_heads) if h not in hs]
            for key, hs in kept.items() if key in modules}
    remove_heads(model, drop)


# --- Hard Concrete gates -------------------------------------------------------------------

class HardConcreteGates(nn.Module):
    """One Hard Concrete gate per head of every attention module (Louizos et al. 2018, as used
    by Voita et al. 2019): log α per head; with u ~ U(0, 1),
      s = σ((log u − log(1 − u) + log α) / β),  z = min(1, max(0, s·(ζ − γ) + γ))
    while training. At test time the deterministic ẑ = min(1, max(0, σ(log α)(ζ − γ) + γ)) decides
    (`rule`): "voita", as Voita et al.'s code, keeps a head iff ẑ > 0 (log α > −ln(−ζ/γ), −2.40
    for the default stretch) and scales its output by ẑ; "binary" keeps it iff ẑ > 0.5
    (log α > 0 for the default stretch) at 1. The L0 term of a module is Σ_h P(z_h ≠ 0) =
    Σ_h σ(log α_h − β log(−γ/ζ)); `penalty` averages it over the gated modules, as Voita et
    al.'s code does (the paper writes L_C = Σ_h (1 − P(g_h = 0)) over all heads: the same up to
    the number of gated modules, which λ absorbs). log α starts at logit(init_keep).

    For the trainer it is an extra loss term: `loss()` (λ · penalty), `metrics()` and
    `param_groups()` (log α's own learning rate)."""

    def __init__(self, model: nn.Module, sites: tuple[str, ...] = ALL_SITES, temperature: float = 0.33,
                 stretch: tuple[float, float] = (-0.1, 1.1), init_keep: float = 0.9,
                 l0_lambda: float = 0.0, lr: float | None = None, rule: str = "voita"):
        super().__init__()
        if rule not in ("voita", "binary"):
            raise ValueError(f"gate rule {rule!r}: voita or binary")
        self.beta, (self.gamma, self.zeta) = temperature, stretch
        self.l0_lambda, self.lr = l0_lambda, lr  # lr: the gates' own (None: the model's)
        self.rule = rule
        modules = attention_modules(model)
        self.keys = [key for key in modules if key[0] in sites]
        # σ(log α) = init_keep at the start: every gate open at test time
        start = math.log(init_keep / (1 - init_keep))
        self.log_alpha = nn.ParameterDict({
            _name(key): nn.Parameter(torch.full((modules[key].out_heads,), start))
            for key in self.keys})
        self._sample: dict[tuple[str, int], Tensor] = {}
        self._on = True  # off inside `suspended()`

    def sample(self, log_alpha: Tensor) -> Tensor:
        u = torch.rand_like(log_alpha).clamp(1e-6, 1 - 1e-6)
        s = torch.sigmoid((u.log() - (-u).log1p() + log_alpha) / self.beta)
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def expected(self, log_alpha: Tensor) -> Tensor:
        return (torch.sigmoid(log_alpha) * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def test_gates(self) -> dict[tuple[str, int], Tensor]:
        """Each gated module's test-time gate [heads] under `rule`: ẑ (voita) or ẑ > 0.5 (binary);
        0 is a closed head."""
        return {key: self._test_gate(key) for key in self.keys}

    def _test_gate(self, key: tuple[str, int]) -> Tensor:
        z = self.expected(self.log_alpha[_name(key)]).detach()
        return z if self.rule == "voita" else (z > 0.5).to(z.dtype)

    def prob_open(self, log_alpha: Tensor) -> Tensor:
        """P(z ≠ 0) per head."""
        return torch.sigmoid(log_alpha - self.beta * math.log(-self.gamma / self.zeta))

    def penalty(self) -> Tensor:
        """Σ_h P(z_h ≠ 0) per gated module, averaged over the modules."""
        return torch.stack([self.prob_open(self.log_alpha[_name(k)]).sum()
                            for k in self.keys]).mean()

    def closed(self) -> HeadSet:
        """The heads whose test-time gate is 0."""
        return {key: [int(h) for h in (gate == 0).nonzero().flatten()]
                for key, gate in self.test_gates().items()}

    # the trainer's extra loss term
    def loss(self) -> Tensor:
        return self.l0_lambda * self.penalty()

    def metrics(self) -> dict[str, float]:
        return {"train/l0": self.penalty().item(),
                "train/heads_open": float(sum((g > 0).sum() for g in self.test_gates().values()))}

    def param_groups(self, lr: float) -> list[tuple[list[nn.Parameter], float]]:
        return [(list(self.parameters()), self.lr or lr)]

    # how the gates act on the model
    def attach(self, model: nn.Module) -> None:
        """Hooks: a pre-hook on the model resamples every gate once per forward in train mode
        (before the embedding's dropout, in the order of `keys`), and each gated module's
        outputs are scaled by its sample (train mode) or its test-time gate (eval mode)."""
        model.register_forward_pre_hook(lambda m, _: self._resample() if m.training else None)
        modules = attention_modules(model)
        for key in self.keys:
            _scale_outputs(modules[key], lambda key=key, m=modules[key]: self._gate(key, m))

    def _resample(self) -> None:
        self._sample = {key: self.sample(self.log_alpha[_name(key)]) for key in self.keys}

    def _gate(self, key: tuple[str, int], module: nn.Module) -> Tensor | None:
        if not self._on:
            return None
        return self._sample[key] if module.training else self._test_gate(key)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Within the block the gates do nothing (every head at 1)."""
        self._on = False
        try:
            yield
        finally:
            self._on = True


def install_gates(model: nn.Module, prune_cfg, l0_lambda: float | None = None
                  ) -> HardConcreteGates:
    """Hard Concrete gates from a PruneConfig, attached to `model` (a child module named gates,
    so checkpoints hold log α) and acting through hooks."""
    gates = HardConcreteGates(
        model, tuple(prune_cfg.sites), prune_cfg.temperature, tuple(prune_cfg.stretch),
        init_keep=prune_cfg.init_keep,
        l0_lambda=prune_cfg.l0_lambda if l0_lambda is None else l0_lambda, lr=prune_cfg.gate_lr,
        rule=prune_cfg.gate_eval,
    ).to(next(model.parameters()).device)
    return attach_gates(model, gates)


def attach_gates(model: nn.Module, gates: HardConcreteGates) -> HardConcreteGates:
    """Put `gates` on `model`: a child module named gates (checkpoints hold log α), acting
    through the hooks of HardConcreteGates.attach."""
    model.add_module("gates", gates)
    gates.attach(model)
    return gates


def gates_of(model: nn.Module) -> HardConcreteGates | None:
    """The model's Hard Concrete gates, if it has any."""
    return model._modules.get("gates")


@torch.no_grad()
def fold_gates(model: nn.Module) -> HeadSet:
    """Make a gated model's test-time function its own and take the gates off: each head's
    test-time gate (ẑ under the voita rule, 1 or 0 under binary) multiplies its columns of
    out_proj. Returns the closed heads (now contributing nothing), for remove_heads."""
    gates = gates_of(model)
    closed = gates.closed()
    modules = attention_modules(model)
    for key, gate in gates.test_gates().items():
        module = modules[key]
        scale = gate.to(module.out_proj.weight.dtype).repeat_interleave(module.head_dim)
        module.out_proj.weight.mul_(scale[None, :])
    _detach(model)
    return closed


def _detach(model: nn.Module) -> None:
    """Take the gates and every hook they installed off `model`."""
    del model._modules["gates"]
    model._forward_pre_hooks.clear()
    for module in attention_modules(model).values():
        module.out_proj._forward_pre_hooks.clear()


def gates_kept(model: nn.Module) -> dict[str, int]:
    """Heads per attention type whose test-time gate is open (ungated modules count whole)."""
    return kept_after(count_heads(model), gates_of(model).closed())


def kept_after(total: dict[str, int], gone: HeadSet) -> dict[str, int]:
    """Heads per site (count_heads) left once `gone` are masked or closed."""
    kept = dict(total)
    for (site, _), heads in gone.items():
        kept[site] -= len(heads)
    return kept


def _name(key: tuple[str, int]) -> str:
    return f"{key[0]}_{key[1]}"
