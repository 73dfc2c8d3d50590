"""Every fixed set of choices in the config, as enums: a typo fails when the config is
composed, with the choices named. `Choice` values also compare, format and serialise as their
strings (`precision == "bf16"`)."""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A config value out of a fixed set (a typo fails when the config is composed, naming the
    choices). It compares, hashes, formats and serialises as its string: `precision == "bf16"`."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Precision(Choice):
    fp32 = "fp32"
    bf16 = "bf16"  # autocast: bf16 matmuls, fp32 weights, optimizer and loss
    auto = "auto"  # bf16 where it is native (CUDA with bf16, a CPU with AVX512-BF16 or AMX), else fp32


class Resume(Choice):
    auto = "auto"  # continue from the newest valid checkpoint in the run dir
    never = "never"


class Init(Choice):
    xavier = "xavier"
    admin = "admin"  # Liu et al. 2020, post-norm: x = LN(ω⊙x + f(x)), ω from a profiling pass


class EvalCheckpoint(Choice):
    """Which weights `train` evaluates at its end."""

    last = "last"  # the final step's
    best = "best"  # the best validation loss's (checkpoints/best.pt)


class Mixes(Choice):
    """Which of talking heads' two mixes a layer has (Shazeer et al. 2020: "roughly equally
    important – removing either harms")."""

    both = "both"  # P_l over the logits and P_w over the weights
    logits = "logits"  # P_l only: W is what the values read (h_V = h)
    weights = "weights"  # P_w only: the logits are J (h = h_K)


class MixInit(Choice):
    """How talking heads' mixing projections P_l [h_K, h] and P_w [h, h_V] start."""

    identity = "identity"  # eye(rows, cols) (+ N(0, 0.01²) where rows ≠ cols)
    normal = "normal"  # N(0, 1/rows): the fan-in scaling of the paper's Mesh TF code


class Tokenizer(Choice):
    bpe = "bpe"
    unigram = "unigram"


class NormalForm(Choice):
    NFC = "NFC"
    NFKC = "NFKC"
    NFD = "NFD"
    NFKD = "NFKD"
    none = "none"


class OnDecodeError(Choice):
    error = "error"
    skip = "skip"


class FileFormat(Choice):
    text = "text"  # one file per split and side
    tsv = "tsv"  # one file per split, source<TAB>target


class TaskKind(Choice):
    """What a model is trained for (`task=`): the names the `hf:` task kinds share."""

    translate = "translate"  # an encoder-decoder translator (the default)
    lm = "lm"  # a decoder-only causal language model
    mlm = "mlm"  # a masked-LM encoder: analysed as hf: models, not trained here


class Schedule(Choice):
    inverse_sqrt = "inverse_sqrt"  # linear warm-up, then lr · sqrt(warmup / step) (Vaswani)
    cosine = "cosine"  # linear warm-up, then a cosine down to trainer.min_lr at max_steps


class SplitName(Choice):
    train = "train"
    valid = "valid"
    test = "test"


class EvalSplit(Choice):
    valid = "valid"
    test = "test"


class PruneMethod(Choice):
    importance = "importance"  # Michel et al. 2019
    gates = "gates"  # Voita et al. 2019


class GateRule(Choice):
    voita = "voita"  # alive iff ẑ > 0, output × ẑ (Voita et al.'s code)
    binary = "binary"  # alive iff ẑ > 0.5, output × 1


class Norm(Enum):
    pre = "pre"  # LN(x) inside the residual branch (stable without long warm-up)
    post = "post"  # LN(x + f(x)), as in Vaswani et al. 2017


class Activation(Enum):
    relu = "relu"
    gelu = "gelu"


class WandbMode(Enum):
    online = "online"
    offline = "offline"
    disabled = "disabled"
