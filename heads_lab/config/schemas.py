"""Typed config schemas: one dataclass per config group option. Plain dataclasses (no Hydra),
so every stage can take them as inputs; heads_lab.config.compose registers them with Hydra's
ConfigStore and checks what types alone cannot."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING

from heads_lab.config.choices import (  # noqa: F401 (re-exported: config users import them here)
    Activation,
    Choice,
    EvalCheckpoint,
    EvalSplit,
    FileFormat,
    GateRule,
    Init,
    Mixes,
    MixInit,
    Norm,
    NormalForm,
    OnDecodeError,
    Precision,
    PruneMethod,
    Resume,
    Schedule,
    SplitName,
    TaskKind,
    Tokenizer,
    WandbMode,
)
from heads_lab.config.data_schemas import (  # noqa: F401 (re-exported: the data/ group)
    CleaningConfig,
    DataConfig,
    HFDataConfig,
    Multi30kDataConfig,
    RepeatsDataConfig,
    ShakespeareDataConfig,
    SyntheticDataConfig,
    TatoebaDataConfig,
    TextFilesDataConfig,
)
from heads_lab.config.fields import opt
from heads_lab.config.sites import SITES
from heads_lab.config.variants import variant


class AttentionKind(Enum):  # one value per entry of heads_lab.config.variants.VARIANTS
    mha = "mha"  # multi-head; grouped/multi-query with kv_heads
    talking_heads = "talking_heads"  # Shazeer et al. 2020: heads_k, heads, heads_v + head mixing


ATTENTION_SITES = SITES  # enc-self, dec-self, dec-enc: Voita's e, d, d-e (heads_lab.config.sites)


@dataclass
class ModelConfig:
    d_model: int = opt(256, "model width")
    heads: int = opt(8, "h: softmax heads (query heads for mha)")
    head_dim: int | None = opt(None,
        "d_k = d_v; None = d_model / heads (Table 3 (A) keeps h·d_k fixed)")
    attention: AttentionKind = opt(AttentionKind.mha, "mha (multi-head; grouped/multi-query with "
                                   "kv_heads) | talking_heads (heads_lab.config.variants)")
    heads_k: int | None = opt(None, "h_K, talking heads' query/key heads; None = heads")
    heads_v: int | None = opt(None, "h_V, talking heads' value heads; None = heads")
    kv_heads: int | None = opt(None,
        "mha key/value heads (grouped-query; 1 = multi-query); None = heads")
    mix_init: MixInit | None = opt(None,
        "talking heads' mixes P_l, P_w: identity | normal (N(0, 1/fan-in), Shazeer et al.'s code); "
        "None = identity where a mix is square (the layer starts as multi-head attention), "
        "normal where its head counts differ (an identity would leave the surplus heads unused)")
    mixes: Mixes | None = opt(None,
        "talking heads' mixes: both | logits (P_l only; needs heads_v = heads) | weights (P_w "
        "only; needs heads_k = heads); None = both")
    talking_heads_in: list[str] = field(default_factory=lambda: list(ATTENTION_SITES), metadata={
        "help": "the sites that use talking heads (the others: mha); task=lm's lm-self where "
        "lm-self or dec-self is named"})
    d_ff: int = opt(1024, "feed-forward inner width (task=lm: 0 = attention-only layers)")
    encoder_layers: int = opt(3, "encoder layers")
    decoder_layers: int = opt(3, "decoder layers")
    layers: int | None = opt(None, "task=lm: the decoder-only model's layers (null = "
                             "model.decoder_layers)")
    dropout: float = opt(0.1, "residual, embedding and FFN dropout")
    attention_dropout: float = opt(0.0, "on the attention weights")
    activation: Activation = opt(Activation.relu, "relu | gelu")
    norm: Norm = opt(Norm.pre, "pre (LN inside the residual branch) | post (LN(x + f(x)), Vaswani et al.)")
    init: Init = opt(Init.xavier, "xavier | admin (post-norm only: x = LN(ω⊙x + f(x)), ω from a "
                     "profiling pass; Liu et al. 2020)")
    max_positions: int = opt(1024, "longest sequence (sinusoidal position table)")
    relative_positions: int = opt(0,
        "Self-attention: a learned bias per head and relative offset, clipped to ±K (0 = off; the "
        "sinusoidal absolute positions stay unless model.positions=none)")
    positions: str = opt("sinusoidal", "absolute positions added to the embeddings: sinusoidal "
                         "(Vaswani et al.) | none (a causal model's order then comes from its "
                         "mask and model.relative_positions' biases only)")

    @property
    def d_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.heads

    def head_counts(self, site: str) -> dict[str, int]:
        """Head counts at a site: q, k, v (projected), h (softmax) and out (into out_proj), as
        the site's attention variant declares them (heads_lab.config.variants)."""
        return asdict(variant(self, site).counts(self))



@dataclass
class TrainerConfig:
    max_steps: int | None = opt(300, "stop at max_steps or max_epochs, whichever comes first")
    max_epochs: int | None = opt(None, "stop after this many epochs (null: max_steps decides)")
    patience: int | None = opt(None, "stop early after this many validations in a row without a "
                               "new best validation loss (null: never)")
    max_time: float | None = opt(None,
        "a time budget in seconds of training updates (validation, checkpoints and evaluation "
        "not counted; kept across resumes): the run stops there, validates, saves and is "
        "evaluated as at max_steps (results.json: train.stopped_by); null = none")
    max_tokens: int = opt(4096,
        "batch size in tokens (padded source or target, whichever is larger)")
    update_freq: int = opt(1, "accumulate gradients over this many batches per step")
    lr: float = opt(3e-3, "peak learning rate, reached after warmup_steps")
    position_bias_lr: float | None = opt(0.05, "model.relative_positions' biases (null = lr)")
    warmup_steps: int = opt(200, "then the schedule's decay")
    schedule: Schedule = opt(Schedule.inverse_sqrt, "after the warm-up: inverse_sqrt (lr · "
                             "sqrt(warmup / step), Vaswani et al.) | cosine (down to "
                             "trainer.min_lr · lr at trainer.max_steps)")
    min_lr: float = opt(0.1, "schedule=cosine: the last step's learning rate, as a share of lr")
    optimizer: str = opt("adam", "adam (weight decay added to the gradient) | adamw (decoupled "
                         "weight decay, on the weight matrices and embeddings only)")
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98],
                                    metadata={"help": "Adam (β1, β2)"})
    adam_eps: float = opt(1e-9, "Adam ε")
    weight_decay: float = opt(0.0, "Adam weight decay")
    label_smoothing: float = opt(0.1, "label smoothing ε")
    clip_norm: float = opt(0.0, "0 = no gradient clipping")
    valid_every: int = opt(100, "steps between validations (and at the end)")
    log_every: int = opt(50, "steps between train/* metrics")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    precision: Precision = opt(Precision.fp32, "fp32 | bf16 | auto (bf16 where native, else fp32; "
                               "the presets' default) (bf16 autocast: bf16 matmuls, fp32 weights "
                               "and loss; needs a GPU or a CPU with native bf16)")
    threads: int | None = opt(None, "CPU threads; None = all cores")
    compile: bool = opt(False,
        "torch.compile the training forward (decoding stays eager): 1.30x eager on an H200, "
        "0.86x on this project's CPU (README, On a GPU)")
    capture: str = opt("auto",
        "auto | true | false: the whole step's forward, loss and backward as one compiled "
        "function with static shapes (CUDA graphs on a GPU: mode=reduce-overhead); auto: on for "
        "a CUDA device's plain training (not with trainer.compile=true, head gates or "
        "data-parallel ranks), off on a CPU, where it is slower than eager; pair it with "
        "pad_multiple (e.g. 8) on a GPU (README, On a GPU)")
    pad_multiple: int = opt(1,
        "pad each training batch's rows and source and target lengths to a multiple of this "
        "(1: no padding), so a captured step meets few shapes")
    save_checkpoint: bool = opt(True, "write checkpoints (run_dir/checkpoints/) at all")
    save_every: int = opt(500,
        "steps between checkpoints; also saved at the end, at each new best validation and on "
        "SIGTERM/SIGINT/SIGUSR2 (0: only those)")
    keep_last: int = opt(2, "step checkpoints kept (plus checkpoints/best.pt)")
    resume: Resume = opt(Resume.auto, "auto: continue from the newest valid checkpoint in the run "
                         "dir | never")
    max_bad_steps: int = opt(5, "stop after this many non-finite (skipped) steps in a row")
    dist_timeout_s: int = opt(1800, "data-parallel (torchrun): seconds a rank waits for a lost "
                              "or frozen peer before the run stops (resumable)")


@dataclass
class EvalConfig:
    beam: int = opt(4, "1 = greedy")
    lenpen: float = opt(0.6, "GNMT length penalty α: score / ((5 + |y|) / 6)^α")
    max_len_a: float = opt(1.5, "output length limit: a · source length + b")
    max_len_b: int = opt(10, "output length limit: a · source length + b")
    max_sentences: int = opt(128, "sentences per decoding batch")
    split: EvalSplit = opt(EvalSplit.test, "the split scored: valid | test")
    bleu_tokenize: str | None = opt(None, "sacrebleu tokenizer; None = sacrebleu's default (13a)")
    sacrebleu_test: str | None = opt(None, "e.g. wmt14: test on sacrebleu's copy of a standard set")
    average_last: int = opt(1, "`heads-lab eval`: average the weights of the last N checkpoints")
    context: int = opt(0, "task=lm on documents: each held-out block is read after up to this "
                       "many tokens of the text before it, only its own tokens scored (a sliding "
                       "window whose stride is data.block_size); 0 = none, each block from its BOS")
    head_mask: str | None = opt(None, "heads zeroed at evaluation, e.g. enc:0:3,dec-enc:2:*")
    checkpoint: EvalCheckpoint = opt(EvalCheckpoint.last, "which weights `train` evaluates at "
                                     "its end: last (the final step's) | best (the best "
                                     "validation loss's: checkpoints/best.pt, or a copy kept in "
                                     "memory with trainer.save_checkpoint=false; valid/ppl is "
                                     "then that validation's)")


@dataclass
class LoggerConfig:
    name: str = opt("none", "wandb | tensorboard | none")
    tensorboard: bool = opt(False, "also write TensorBoard event files to <run dir>/tensorboard "
                            "(logger=tensorboard alone; logger=wandb logger.tensorboard=true both); "
                            "`tensorboard --logdir <sweep dir>/tensorboard` compares a sweep's runs")


@dataclass
class WandbConfig(LoggerConfig):
    name: str = "wandb"
    project: str = opt("heads-lab", "the wandb project")
    entity: str | None = opt(None, "the wandb team or user; None = your default")
    mode: WandbMode = opt(WandbMode.offline, "offline (files under the run dir; `wandb sync` "
                          "uploads them) | online | disabled")
    group: str | None = opt(None, "the wandb group; None = the experiment's name (a sweep's runs "
                            "share it)")
    job_type: str = opt("train", "the wandb job type")
    tags: list[str] = field(default_factory=list, metadata={"help":
        "wandb tags besides the run's own (tags)"})
    notes: str | None = opt(None, "the wandb run's notes")


@dataclass
class PathsConfig:
    cache_dir: str | None = opt(None,
        "tokenizers and preprocessed data; None = $HEADS_LAB_CACHE, else "
        "$XDG_CACHE_HOME/heads-lab or ~/.cache/heads-lab")


@dataclass
class CostConfig:
    """Lengths (subword tokens) at which `heads-lab info` counts FLOPs and attention memory;
    training runs use their data's mean lengths instead."""

    src_len: float = opt(20.0, "source length, subword tokens (heads-lab info)")
    tgt_len: float = opt(20.0, "target length, subword tokens (heads-lab info)")


@dataclass
class ReportConfig:
    """How `heads-lab report` reads a study (experiment presets set these): the base row the
    other rows are tested against, e.g. {model.heads: 8}, and published numbers beside ours."""

    base: dict[str, Any] = field(default_factory=dict, metadata={"help":
        "the row the others are tested against, e.g. {model.heads: 8} (experiment presets set "
        "it)"})
    paper: str | None = opt(None, "table_a: Vaswani et al. 2017, Table 3 (A)")
    x: str | None = opt(None, "the quality plot's x axis where several numeric settings vary, "
                        "e.g. data.train_fraction: one line per value of the others (model.heads); "
                        "where base names it too, each x has its own base row for p")


@dataclass
class AnalysisConfig:
    """`heads-lab analyze <run dir>`: what each head does (Voita et al. 2019, Clark et al. 2019,
    Michel et al. 2019), on `split` (teacher-forced on the reference translations)."""

    split: SplitName = opt(SplitName.test, "the split analysed: train | valid | test")
    max_sentences: int | None = opt(500,
        "the first N sentences of the split or treebank (null: all)")
    positional_threshold: float = opt(0.9,
        "positional: max weight on one relative offset this often")
    rare_threshold: float = opt(0.5, "rare-word: max weight on the rarest source token this often")
    rare_top_k: int | None = opt(500,
        "rare-word: count only sentences whose rarest token is not among the K most frequent "
        "training source tokens (Voita et al.: 500; null: every sentence)")
    syntactic_margin: float = opt(0.1, "syntactic: accuracy above the offset baseline by this much")
    min_arcs: int = opt(20, "syntactic: only relations with at least this many arcs label a head")
    step: int | None = opt(None, "analyse the checkpoint of this training step "
                           "(checkpoints/step_N.pt; null: the newest)")
    lrp: bool = opt(True, "layer-wise relevance per head (Voita et al.), one relevance pass per "
                    "sentence; needs target sentences")
    lrp_sentences: int | None = opt(200,
        "LRP on the first N analysed sentences only (null: all): its cost grows with the target "
        "tokens (one pass a sentence, its target positions batched), ~1 s for a 60-token "
        "sentence pair on one CPU core at d_model 256")
    conllu: str | None = opt(None, "a CoNLL-U file of the split's source sentences (real data)")
    treebank: str | None = opt(None, "a CoNLL-U file (.gz too) analysed on its own `# text` lines")
    treebank_ref: str | None = opt(None, "its comment holding translations (text_en): decoder too")
    heatmaps: list[str] = field(default_factory=list, metadata={"help":
        "heads to draw, e.g. [enc:0:3, dec-enc:2:*]"})
    sentences: list[int] = field(default_factory=lambda: [0], metadata={"help":
        "sentences for heatmaps/head view"})
    max_tokens: int | None = opt(None,
        "hf: models: cut each analysed text to its first N tokens (special tokens included); "
        "null: a text longer than the model's positions is refused")
    role_sequences: int = opt(10, "a language model's head roles (previous-token, duplicate-"
                              "token, induction): how many random token sequences, each repeated")
    role_length: int = opt(50, "a language model's head roles: tokens in each random sequence "
                           "(read twice after the BOS)")


@dataclass
class PruneConfig:
    """`heads-lab prune <run dir> method=importance|gates`, and gates trained from scratch by
    `heads-lab train prune.l0_lambda=...` (Voita et al. 2019)."""

    method: PruneMethod = opt(PruneMethod.importance, "importance (Michel et al. 2019) | gates "
                              "(Voita et al. 2019)")
    split: SplitName = opt(SplitName.valid, "where importance is measured")
    eval_split: SplitName = opt(SplitName.test, "where BLEU and PPL are measured at each step")
    eval_sentences: int | None = opt(500, "the first N sentences of eval_split (null = all)")
    step: float = opt(0.1, "importance: fraction of the heads pruned per step")
    sites: list[str] = field(default_factory=lambda: list(ATTENTION_SITES), metadata={"help":
        "heads to prune"})
    l0_lambda: float = opt(0.0,
        "gates: weight of the L0 penalty; > 0 in `train` gates from scratch")
    temperature: float = opt(0.33, "Hard Concrete β")
    stretch: list[float] = field(default_factory=lambda: [-0.1, 1.1], metadata={"help": "(γ, ζ)"})
    steps: int = opt(500, "gates from a trained run: fine-tuning steps with the gates")
    lr: float | None = opt(None,
        "gates from a trained run: the model's learning rate (null = the run's last one)")
    gate_lr: float | None = opt(0.05, "the gates' log α learning rate (null = the model's)")
    gate_eval: GateRule = opt(GateRule.voita,
        "which heads a trained gate keeps, ẑ = clamp(σ(log α)(ζ − γ) + γ, 0, 1) being its "
        "deterministic value: voita (Voita et al.'s code: alive iff ẑ > 0, i.e. log α > "
        "−ln(−ζ/γ), the kept head's output × ẑ) | binary (alive iff ẑ > 0.5, log α > 0 for the "
        "default stretch, output × 1)")
    init_keep: float = opt(0.9,
        "σ(log α) at the start: 0.9 (log α ≈ 2.2) | 0.5 (log α = 0, about where Voita's "
        "code starts)")


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    trainer: TrainerConfig = MISSING
    eval: EvalConfig = MISSING
    logger: LoggerConfig = MISSING
    paths: PathsConfig = field(default_factory=PathsConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    task: TaskKind = opt(TaskKind.translate, "translate (an encoder-decoder translator) | lm (a "
                         "decoder-only language model on one side of the data, or documents)")
    seed: int = opt(1, "the training seed: initial weights, dropout, batch order (not the data's "
                    "splits)")
    name: str = opt("train", "experiment name (wandb group when none is set)")
    tags: list[str] = field(default_factory=list, metadata={"help":
        "wandb tags (presets add theirs)"})
