"""The attention variants, each declared once (torch-free): its kinds of heads and their counts,
parameters, FLOPs per matmul, the attention activations it keeps for backward, its label, the
config keys that give its shape, and whether its heads can be removed. cost.py, `heads-lab
info`, the run summary, the report, tracking and the analysis read them from here; the module
itself is `heads_lab.model.attention.MODULES[name]` (its `attend` and `keep_heads`).

Adding a variant: its module in model/attention.py, its entry here, its config fields (and
AttentionKind value) in schemas.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from heads_lab.config.sites import SITES, layers

BYTES_FP32 = 4


def _value(x) -> str:
    return str(getattr(x, "value", x))


def _mixes(cfg) -> tuple[bool, bool]:
    """(has P_l over the logits, has P_w over the weights) of a talking-heads config."""
    mixes = _value(cfg.mixes) if cfg.mixes is not None else "both"
    return mixes != "weights", mixes != "logits"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class Counts:
    """Heads projected to queries, keys and values, softmax heads, and heads into out_proj."""

    q: int
    k: int
    v: int
    h: int
    out: int


class Variant:
    """What every variant declares; multi-head attention is the base case."""

    name = ""
    # config keys of the head shape, as (short name, key), in the order tables show them
    shape: tuple[tuple[str, str], ...] = ()
    map_kind = "head"  # the heads whose softmax weights (attention maps) the module returns
    out_kind = "head"  # the heads masks, gates and removal act on (their outputs enter out_proj)

    def counts(self, cfg) -> Counts:
        raise NotImplementedError

    def kinds(self, cfg) -> dict[str, int]:
        """{kind: count} of its heads, in the order they act (heads_lab.model.heads.KIND_NAMES)."""
        return {"head": self.counts(cfg).h}

    def shape_values(self, cfg) -> dict[str, int]:
        """{shape key: the count it stands for}: a key left None (= model.heads) is given its
        value, so that two configs of one model compare equal (the report's rows)."""
        return {key: getattr(cfg, key.split(".", 1)[1]) or cfg.heads for _, key in self.shape}

    def mix_params(self, cfg) -> int:
        """Parameters beyond the projections (talking heads' mixes)."""
        return 0

    def score_flops(self, cfg, n: float, m: float) -> float:
        """Forward matmul FLOPs between the projections: n queries over m keys."""
        c, dk = self.counts(cfg), cfg.d_head
        return 2 * n * m * dk * c.q + 2 * n * m * dk * c.out  # QKᵀ (per query head), weights·V

    def activation_bytes(self, cfg, n: float, m: float) -> float:
        """Bytes of [heads, n, m] tensors one layer keeps for backward per sentence pair (fp32)."""
        raise NotImplementedError

    def label(self, cfg) -> str:
        raise NotImplementedError

    def removable(self, cfg) -> bool:
        return True

    def check(self, cfg) -> str | None:
        """What is wrong with the variant's own config fields (one line naming the key and the
        fix), or None."""
        return None

    def bench(self, quick: bool) -> list[tuple[str, dict]]:
        """(label, ModelConfig changes) of the rows `heads-lab bench` measures for it; its
        bf16 row is its first row's shape."""
        return []


class MultiHead(Variant):
    """Multi-head attention (Vaswani et al. 2017), with `kv_heads` shared key/value heads:
    grouped-query, and multi-query at 1 (Shazeer 2019)."""

    name = "mha"
    shape = (("h", "model.heads"), ("kv", "model.kv_heads"))

    def counts(self, cfg) -> Counts:
        h, kv = cfg.heads, cfg.kv_heads or cfg.heads
        return Counts(h, kv, kv, h, h)

    def activation_bytes(self, cfg, n: float, m: float) -> float:
        """The CPU matmul path (every translation length): the softmax weights, for softmax's
        backward, and with attention dropout its mask and the dropped weights too. (GPUs run
        the fused kernel, which keeps no n·m tensor and recomputes them in backward.)"""
        kept = 3 if cfg.attention_dropout > 0 else 1
        return BYTES_FP32 * n * m * self.counts(cfg).h * kept

    def label(self, cfg) -> str:
        c = self.counts(cfg)
        return _count(c.h, "head") + (f", {_count(c.k, 'key/value head')}" if c.k != c.h else "")

    def removable(self, cfg) -> bool:
        c = self.counts(cfg)
        return c.k == c.q  # shared key/value heads cannot go with one query head

    def check(self, cfg) -> str | None:
        for key in ("heads_k", "heads_v"):
            value = getattr(cfg, key)
            if value is not None and value != cfg.heads:
                return (f"model.{key}={value} needs model.attention=talking_heads (mha uses "
                        "model.heads for queries, keys and values)")
        for key in ("mix_init", "mixes"):
            if getattr(cfg, key) is not None:
                return (f"model.{key}={_value(getattr(cfg, key))} needs model.attention="
                        f"talking_heads (mha has no head mixes): drop it or set model.{key}=null")
        if cfg.kv_heads is not None and cfg.heads % cfg.kv_heads:
            divisors = [d for d in range(1, cfg.heads + 1) if cfg.heads % d == 0]
            return (f"model.heads={cfg.heads} is not a multiple of model.kv_heads={cfg.kv_heads}: "
                    f"kv_heads must divide heads (one of {divisors})")
        return None

    def bench(self, quick: bool) -> list[tuple[str, dict]]:
        heads = (1, 8, 32) if quick else (1, 2, 4, 8, 16, 32)
        return ([(f"mha h={h}", {"heads": h}) for h in heads]
                + [("mha h=8 kv_heads=1", {"heads": 8, "kv_heads": 1})])


class TalkingHeads(Variant):
    """Talking-heads attention (Shazeer et al. 2020): h_K query/key heads, h softmax heads, h_V
    value heads, mixed across heads before (P_l [h_K, h]) and after (P_w [h, h_V]) the softmax."""

    name = "talking_heads"
    shape = (("h_K", "model.heads_k"), ("h", "model.heads"), ("h_V", "model.heads_v"))
    map_kind = "softmax"
    out_kind = "value"

    def counts(self, cfg) -> Counts:
        hk, hv = cfg.heads_k or cfg.heads, cfg.heads_v or cfg.heads
        return Counts(hk, hk, hv, cfg.heads, hv)

    def kinds(self, cfg) -> dict[str, int]:
        c = self.counts(cfg)
        return {"qk": c.k, "softmax": c.h, "value": c.v}

    def mix_params(self, cfg) -> int:
        c, (logits, weights) = self.counts(cfg), _mixes(cfg)
        return c.k * c.h * logits + c.h * c.v * weights

    def score_flops(self, cfg, n: float, m: float) -> float:
        return super().score_flops(cfg, n, m) + 2 * n * m * self.mix_params(cfg)  # the mixes

    def activation_bytes(self, cfg, n: float, m: float) -> float:
        """J (for P_l's gradient, when P_l is there), W (softmax's backward) and U (for V's
        gradient; it is W itself when there is no P_w); with attention dropout, instead of U,
        its mask and dropped copy."""
        c, (logits, weights) = self.counts(cfg), _mixes(cfg)
        kept = c.k * logits + c.h + (2 * c.v if cfg.attention_dropout > 0 else c.v * weights)
        return BYTES_FP32 * n * m * kept

    def label(self, cfg) -> str:
        c, (logits, weights) = self.counts(cfg), _mixes(cfg)
        only = "" if logits and weights else f", {'logits' if logits else 'weights'} mix only"
        return f"talking heads h_K {c.k}, h {c.h}, h_V {c.v}{only}"

    def removable(self, cfg) -> bool:
        return False  # every head is mixed into every other; mask instead

    def check(self, cfg) -> str | None:
        if cfg.kv_heads is not None:
            return (f"model.kv_heads={cfg.kv_heads} applies to model.attention=mha; talking heads "
                    "set their key and value heads with model.heads_k and model.heads_v")
        c, (logits, weights) = self.counts(cfg), _mixes(cfg)
        if not weights and c.v != c.h:
            return (f"model.mixes=logits needs model.heads_v = model.heads ({c.h}), not {c.v}: "
                    "without P_w nothing maps softmax heads to value heads (set "
                    "model.heads_v=null)")
        if not logits and c.k != c.h:
            return (f"model.mixes=weights needs model.heads_k = model.heads ({c.h}), not {c.k}: "
                    "without P_l nothing maps query/key heads to softmax heads (set "
                    "model.heads_k=null)")
        return None

    def bench(self, quick: bool) -> list[tuple[str, dict]]:
        return [(f"talking_heads h={h}", {"heads": h}) for h in (8, 32)]


VARIANTS: dict[str, Variant] = {v.name: v for v in (MultiHead(), TalkingHeads())}


def variant(cfg, site: str) -> Variant:
    """The variant of a ModelConfig at `site` (model.attention, where model.talking_heads_in
    names the site; multi-head attention elsewhere). A language model's lm-self is a decoder's
    self-attention: named by lm-self or by dec-self (so the default list, every translator
    site, gives a talking-heads LM talking heads too)."""
    name = getattr(cfg.attention, "value", cfg.attention)
    named = site in cfg.talking_heads_in or (site == "lm-self" and "dec-self" in cfg.talking_heads_in)
    if name != "mha" and not named:
        return VARIANTS["mha"]
    return VARIANTS[name]


def shape_keys() -> tuple[tuple[str, str], ...]:
    """Every variant's shape keys, once each, h first then in registry order (report columns,
    short names in run names)."""
    seen: dict[str, str] = {"model.heads": "h"}
    for v in VARIANTS.values():
        for short, key in v.shape:
            seen.setdefault(key, short)
    return tuple((short, key) for key, short in seen.items())


def out_heads(cfg, task: str = "translate") -> dict[tuple[str, int], int]:
    """Heads of the out kind per (site, layer) of a ModelConfig: what head specs address, known
    before a model exists (task=lm: its lm-self layers, model.layers of them)."""
    if str(task) == "lm":
        depth = cfg.layers if cfg.layers is not None else cfg.decoder_layers
        return {("lm-self", i): variant(cfg, "lm-self").counts(cfg).out for i in range(depth)}
    return {(site, i): variant(cfg, site).counts(cfg).out for site in SITES
            for i in range(layers(cfg, site))}
