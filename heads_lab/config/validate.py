"""The checks of a config that types alone cannot express: relations between values (heads
dividing d_model, a mix that needs h_V = h, ...), each failing with a `ConfigError` whose one line
names the key and the fix. `validate()` runs them one group at a time, before any work."""

from __future__ import annotations

from sacrebleu.metrics import BLEU
from sacrebleu.utils import get_available_testsets, get_langpairs_for_testset

from heads_lab.config.schemas import (
    ATTENTION_SITES,
    Norm,
    RunConfig,
    SyntheticDataConfig,
    TatoebaDataConfig,
    TextFilesDataConfig,
)
from heads_lab.config.sites import ALL_SITES, parse_head_mask
from heads_lab.config.variants import VARIANTS, out_heads
from heads_lab.errors import ConfigError


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(run: RunConfig) -> None:
    """Checks the schemas cannot express, one group at a time. Raises ConfigError naming the
    key and the fix."""
    _check_task(run)
    _check_model(run.model, run.task)
    _check_trainer(run.trainer)
    _check_analysis_prune(run.analysis, run.prune)
    _check_data(run.data, run.trainer, run.model, str(run.task))
    _check_eval(run.eval, run.data, run.model, str(run.task))
    _check_optimiser(run)


TRANSLATOR_DATA = ("local", "multi30k", "hf", "tatoeba", "synthetic", "wmt14", "wmt16",
                   "iwslt2017")
LM_DATA = ("shakespeare", "repeats")  # text for a language model only (heads_lab/data/lm.py)


def _check_task(run) -> None:
    """task=lm: settings of a translator's (cross-attention, BLEU, its sites) refused, and its
    text's blocks within the model's positions; task=mlm is not trained here; a language
    model's data refused for a translator. prune.sites left at its default (every translator
    site) becomes a language model's one site, lm-self."""
    task, m, d, e, t = run.task, run.model, run.data, run.eval, run.trainer
    _check(task != "mlm", "task=mlm: masked-LM encoders are analysed as pretrained models "
           "(heads-lab analyze hf:bert-base-uncased); heads-lab trains task=translate and task=lm")
    _check(t.schedule != "cosine" or t.max_steps is not None, "trainer.schedule=cosine decays "
           "to trainer.max_steps: set trainer.max_steps (or use schedule=inverse_sqrt)")
    _check(t.optimizer in ("adam", "adamw"), f"trainer.optimizer={t.optimizer!r}: choose adam or "
           "adamw")
    _check(0.0 <= t.min_lr <= 1.0, f"trainer.min_lr={t.min_lr} must be in [0, 1] (a share of "
           "trainer.lr)")
    if task == "translate":
        _check(d.name not in LM_DATA, f"data={d.name} is text for a language model: add task=lm "
               "(a translator needs a parallel corpus, e.g. data=multi30k)")
        return
    sites = [s for s in run.prune.sites if s != "lm-self"]
    _check(not sites or list(run.prune.sites) == list(ATTENTION_SITES),
           f"prune.sites={list(run.prune.sites)}: task=lm has no {sites[0] if sites else ''} "
           "attention (no encoder, no cross-attention); its heads are at lm-self")
    if list(run.prune.sites) == list(ATTENTION_SITES):  # the default, every site: its own
        run.prune.sites = ["lm-self"]
    crossing = [s for s in ("enc-self", "dec-enc") if s in m.talking_heads_in
                and list(m.talking_heads_in) != list(ATTENTION_SITES)]
    _check(not crossing, f"model.talking_heads_in={list(m.talking_heads_in)}: task=lm has no "
           f"{crossing[0] if crossing else ''} attention; name lm-self")
    _check(not e.sacrebleu_test and not e.bleu_tokenize, "task=lm is scored by perplexity and "
           "bits per byte, not BLEU: drop eval.sacrebleu_test / eval.bleu_tokenize")
    _check(m.init != "admin", "model.init=admin profiles a translator's encoder and decoder: a "
           "language model (task=lm) takes model.init=xavier")
    if d.name == "shakespeare":
        _check(d.block_size >= 1 and d.block_size + 1 <= m.max_positions,
               f"data.block_size={d.block_size} needs {d.block_size + 1} positions (the BOS and "
               f"the block), more than model.max_positions={m.max_positions}: lower the block "
               f"or raise model.max_positions")
    _check(d.held_out >= 1, f"data.held_out={d.held_out} must be >= 1 sentence")


def _check_model(m, task: str = "translate") -> None:
    keys = ("d_model", "heads", "d_ff", "encoder_layers", "decoder_layers", "max_positions")
    if task == "lm":  # no encoder; d_ff=0: attention-only layers
        keys = ("d_model", "heads", "max_positions")
        _check(m.d_ff >= 0, f"model.d_ff={m.d_ff} must be >= 0 (0: attention-only layers)")
        layers = m.layers if m.layers is not None else m.decoder_layers
        _check(layers >= 1, f"model.layers={layers} must be a positive integer")
    for key in keys:
        value = getattr(m, key)
        _check(value >= 1, f"model.{key}={value} must be a positive integer")
    if m.head_dim is None:
        _check(
            m.d_model % m.heads == 0,
            f"model.heads={m.heads} does not divide model.d_model={m.d_model}: choose heads from "
            f"{_divisors(m.d_model)} or set model.head_dim",
        )
    else:
        _check(m.head_dim >= 1, f"model.head_dim={m.head_dim} must be a positive integer")
    _check(m.relative_positions >= 0, f"model.relative_positions={m.relative_positions} must be "
           "0 (off) or the largest relative offset K that gets its own bias")
    _check(m.positions in ("sinusoidal", "none"), f"model.positions={m.positions!r}: choose "
           "sinusoidal or none")
    _check(m.positions != "none" or task == "lm", "model.positions=none: an encoder has no "
           "order without positions; it is for a causal language model (task=lm)")
    for key in ("heads_k", "heads_v", "kv_heads"):
        value = getattr(m, key)
        _check(value is None or value >= 1, f"model.{key}={value} must be a positive integer")
    problem = VARIANTS[m.attention.value].check(m)  # the variant's own fields
    _check(problem is None, problem or "")
    unknown = [site for site in m.talking_heads_in if site not in ALL_SITES]
    _check(not unknown, f"model.talking_heads_in has {unknown}: choose from {list(ALL_SITES)}")
    for key in ("dropout", "attention_dropout"):
        value = getattr(m, key)
        _check(0.0 <= value < 1.0, f"model.{key}={value} must be in [0, 1)")
    _check(m.init != "admin" or m.norm == Norm.post,
           "model.init=admin is for post-norm models (Liu et al. 2020): set model.norm=post")


def _check_trainer(t) -> None:
    _check(
        t.max_steps is not None or t.max_epochs is not None,
        "trainer.max_steps and trainer.max_epochs are both null: set at least one",
    )
    for key in ("max_steps", "max_epochs"):
        value = getattr(t, key)
        _check(value is None or value >= 1, f"trainer.{key}={value} must be >= 1 (or null)")
    _check(t.patience is None or t.patience >= 1, f"trainer.patience={t.patience} must be >= 1 "
           "validations (or null: no early stop)")
    _check(t.max_time is None or t.max_time > 0, f"trainer.max_time={t.max_time} must be > 0 "
           "seconds of training (or null: no time budget)")
    _check(t.lr > 0, f"trainer.lr={t.lr} must be > 0")
    _check(t.warmup_steps >= 0, f"trainer.warmup_steps={t.warmup_steps} must be >= 0")
    _check(t.update_freq >= 1, f"trainer.update_freq={t.update_freq} must be >= 1")
    _check(0.0 <= t.label_smoothing < 1.0, "trainer.label_smoothing must be in [0, 1)")
    _check(len(t.adam_betas) == 2, "trainer.adam_betas must be two numbers, e.g. [0.9,0.98]")
    _check(t.valid_every >= 1 and t.log_every >= 1, "trainer.valid_every/log_every must be >= 1")
    _check(t.threads is None or t.threads >= 1, f"trainer.threads={t.threads} must be >= 1")
    _check(t.clip_norm >= 0, f"trainer.clip_norm={t.clip_norm} must be >= 0 (0 = no clipping)")
    _check(t.save_every >= 0, f"trainer.save_every={t.save_every} must be >= 0 (0 = only at the "
           "end, at each best validation and on a stop signal)")
    _check(t.keep_last >= 1, f"trainer.keep_last={t.keep_last} must be >= 1")
    _check(t.max_bad_steps >= 1, f"trainer.max_bad_steps={t.max_bad_steps} must be >= 1")
    _check(
        t.device == "auto" or t.device == "cpu" or t.device.startswith("cuda"),
        f"trainer.device={t.device!r} is not a device: use auto, cpu, cuda or cuda:N",
    )


def _check_optimiser(run) -> None:
    """The seed, Adam's settings, the other learning rates and info's lengths: values torch or
    numpy would refuse only mid-run, with a traceback, or take and do nonsense with."""
    t, pr = run.trainer, run.prune
    _check(run.seed >= 0, f"seed={run.seed} must be >= 0 (numpy takes no negative seed)")
    _check(all(0.0 <= b < 1.0 for b in t.adam_betas),
           f"trainer.adam_betas={list(t.adam_betas)} must both be in [0, 1), e.g. [0.9,0.98]")
    _check(t.adam_eps > 0, f"trainer.adam_eps={t.adam_eps} must be > 0 (e.g. 1e-9)")
    _check(t.weight_decay >= 0, f"trainer.weight_decay={t.weight_decay} must be >= 0 (0 = none)")
    _check(t.dist_timeout_s >= 1, f"trainer.dist_timeout_s={t.dist_timeout_s} must be >= 1 second")
    for key, value, null in (("trainer.position_bias_lr", t.position_bias_lr, "trainer.lr"),
                             ("prune.lr", pr.lr, "the run's last"),
                             ("prune.gate_lr", pr.gate_lr, "the model's")):
        _check(value is None or value > 0, f"{key}={value} must be > 0 (or null: {null})")
    for key in ("src_len", "tgt_len"):
        value = getattr(run.cost, key)
        _check(value >= 1, f"cost.{key}={value} must be >= 1 token")


def _check_analysis_prune(a, pr) -> None:
    _check(a.max_sentences is None or a.max_sentences >= 1,
           f"analysis.max_sentences={a.max_sentences} must be >= 1 (or null for all)")
    _check(a.min_arcs >= 1, f"analysis.min_arcs={a.min_arcs} must be >= 1")
    _check(a.lrp_sentences is None or a.lrp_sentences >= 1,
           f"analysis.lrp_sentences={a.lrp_sentences} must be >= 1 (or null: every sentence)")
    _check(a.rare_top_k is None or a.rare_top_k >= 0, f"analysis.rare_top_k={a.rare_top_k} "
           "must be >= 0 (Voita et al.: 500; 0 or null: count every sentence)")
    _check(not (a.treebank and a.conllu), "analysis.treebank and analysis.conllu both set: "
           "analysis.treebank analyses a treebank's own sentences, analysis.conllu parses of "
           "analysis.split's; choose one")
    _check(a.treebank or not a.treebank_ref, "analysis.treebank_ref needs analysis.treebank (the "
           "CoNLL-U file whose '# <ref> = ...' lines hold the translations, e.g. text_en)")
    for key in ("positional_threshold", "rare_threshold", "syntactic_margin"):
        value = getattr(a, key)
        _check(0.0 <= value <= 1.0, f"analysis.{key}={value} must be in [0, 1]")
    _check(0.0 < pr.step <= 0.5, f"prune.step={pr.step} must be in (0, 0.5] (a fraction of heads)")
    unknown = [site for site in pr.sites if site not in ALL_SITES]
    _check(pr.sites and not unknown,
           f"prune.sites={list(pr.sites)}: choose some of {list(ALL_SITES)}")
    _check(pr.l0_lambda >= 0, f"prune.l0_lambda={pr.l0_lambda} must be >= 0")
    _check(pr.temperature > 0, f"prune.temperature={pr.temperature} must be > 0")
    _check(len(pr.stretch) == 2 and pr.stretch[0] < 0 < 1 < pr.stretch[1],
           f"prune.stretch={list(pr.stretch)} must be [γ < 0, ζ > 1], e.g. [-0.1,1.1]")
    _check(pr.steps >= 1, f"prune.steps={pr.steps} must be >= 1")
    _check(0.0 < pr.init_keep < 1.0, f"prune.init_keep={pr.init_keep} must be in (0, 1): "
           "σ(log α) at the start, 0.9 or Voita et al.'s 0.5 (log α = 0)")
    _check(all(i >= 0 for i in a.sentences),
           f"analysis.sentences={list(a.sentences)} must be sentence numbers >= 0 (0 = the first)")
    _check(a.max_tokens is None or a.max_tokens >= 2,
           f"analysis.max_tokens={a.max_tokens} must be >= 2 (or null: texts as they are)")
    _check(a.role_sequences >= 1, f"analysis.role_sequences={a.role_sequences} must be >= 1")
    _check(a.role_length >= 2, f"analysis.role_length={a.role_length} must be >= 2 tokens")
    _check(pr.eval_sentences is None or pr.eval_sentences >= 1,
           f"prune.eval_sentences={pr.eval_sentences} must be >= 1 (or null for all)")


def _check_data(d, t, m, task: str = "translate") -> None:
    _check(d.max_len >= 1, f"data.max_len={d.max_len} must be >= 1")
    _check(
        t.max_tokens >= d.max_len + 1,
        f"trainer.max_tokens={t.max_tokens} is smaller than the longest allowed sentence "
        f"(data.max_len={d.max_len} + EOS): raise trainer.max_tokens or lower data.max_len",
    )
    _check(task == "lm" or d.max_len + 2 <= m.max_positions,
           "data.max_len + 2 must not exceed model.max_positions")
    capture = str(t.capture).lower()  # (a bool from a YAML true/false reads as 'True'/'False')
    _check(capture in ("auto", "true", "false"), f"trainer.capture={t.capture}: use auto (on "
           "for a CUDA device, off on a CPU), true or false")
    _check(not (t.compile and capture == "true"), "trainer.compile=true and trainer.capture=true: "
           "capture compiles the whole step itself; set trainer.compile=false")
    _check(t.pad_multiple >= 1, f"trainer.pad_multiple={t.pad_multiple} must be >= 1 (1: no "
           "padding; 8 suits a captured step on a GPU)")
    # the longest input: BOS + sentence + EOS (translator); BOS + block or sentence (LM)
    longest, what = ((d.block_size + 1, "data.block_size + 1") if task == "lm"
                     and d.name == "shakespeare" else (d.max_len + 1, "data.max_len + 1")
                     if task == "lm" else (d.max_len + 2, "data.max_len + 2"))
    _check(-(-longest // t.pad_multiple) * t.pad_multiple <= m.max_positions,
           f"trainer.pad_multiple={t.pad_multiple} pads the longest sentence ({what} = "
           f"{longest}) past model.max_positions={m.max_positions}: lower "
           "trainer.pad_multiple or raise model.max_positions")
    _check(d.vocab_size >= 16, f"data.vocab_size={d.vocab_size} must be >= 16")
    c = d.cleaning
    _check(c.max_ratio is None or c.max_ratio >= 1,
           f"data.cleaning.max_ratio={c.max_ratio} must be >= 1 (or null for no ratio filter)")
    _check(0.0 < d.train_fraction <= 1.0, f"data.train_fraction={d.train_fraction} must be in "
           "(0, 1]: the share of the training pairs to train on (1 = all)")
    _check(d.max_train_pairs is None or d.max_train_pairs >= 1,
           f"data.max_train_pairs={d.max_train_pairs} must be >= 1 (or null for all)")
    if isinstance(d, TextFilesDataConfig):
        needed = ("{split}", "{lang}") if d.format == "text" else ("{split}",)
        _check(all(k in d.pattern for k in needed),
               f"data.pattern={d.pattern!r} must contain {' and '.join(needed)}")
    if isinstance(d, TatoebaDataConfig):
        _check({d.src, d.tgt} == {"de", "en"}, f"data=tatoeba is German–English: data.src={d.src} "
               f"and data.tgt={d.tgt} must be de and en (either way round)")
        for key in ("valid_sentences", "test_sentences"):
            _check(getattr(d, key) >= 1, f"data.{key}={getattr(d, key)} must be >= 1")
    if isinstance(d, SyntheticDataConfig):
        for key in ("train_size", "valid_size", "test_size", "nouns", "verbs", "adjectives",
                    "adverbs"):
            _check(getattr(d, key) >= 1, f"data.{key}={getattr(d, key)} must be >= 1")
        _check(d.zipf >= 0, f"data.zipf={d.zipf} must be >= 0 (0 = every word equally likely)")
        _check(d.max_depth >= 0, f"data.max_depth={d.max_depth} must be >= 0 (0 = no nesting)")
        for key, value in vars(d).items():
            if key.startswith("p_"):
                _check(0.0 <= value <= 1.0, f"data.{key}={value} must be a probability in [0, 1]")


def _check_eval(e, d, m, task: str = "translate") -> None:
    _check(e.average_last >= 1, f"eval.average_last={e.average_last} must be >= 1")
    _check(e.context >= 0, f"eval.context={e.context} must be >= 0 (0 = each block from its BOS)")
    if e.context:
        _check(task == "lm" and d.name == "shakespeare", f"eval.context={e.context} reads a "
               "document's held-out blocks after the text before them: it needs task=lm "
               "data=shakespeare (sentences are scored each from its BOS); drop eval.context")
        _check(1 + e.context + d.block_size <= m.max_positions, f"eval.context={e.context} and "
               f"data.block_size={d.block_size} need {1 + e.context + d.block_size} positions "
               f"(BOS, context, block), more than model.max_positions={m.max_positions}: lower "
               "eval.context")
    _check(e.beam >= 1, f"eval.beam={e.beam} must be >= 1 (1 = greedy)")
    _check(e.lenpen >= 0, f"eval.lenpen={e.lenpen} must be >= 0")
    _check(e.max_sentences >= 1, f"eval.max_sentences={e.max_sentences} must be >= 1")
    _check(e.max_len_a >= 0 and e.max_len_b >= 0, f"eval.max_len_a={e.max_len_a} and "
           f"eval.max_len_b={e.max_len_b}: an output may be a · source length + b tokens long, "
           "so neither may be negative (e.g. 1.5 and 10)")
    if e.sacrebleu_test is not None:
        _check(e.split == "test", "eval.sacrebleu_test replaces the test split: set eval.split=test")
        check_sacrebleu_test(e.sacrebleu_test, d.src, d.tgt)
    if e.bleu_tokenize is not None:
        _check(e.bleu_tokenize in BLEU.TOKENIZERS,
               f"eval.bleu_tokenize={e.bleu_tokenize!r} is not a sacrebleu tokenizer: use one of "
               f"{sorted(BLEU.TOKENIZERS)} (or null for 13a)")
    if e.head_mask:
        parse_head_mask(e.head_mask, out_heads(m, task))  # raises ConfigError, one line


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0 and k <= 64]


def check_sacrebleu_test(name: str, src: str, tgt: str) -> None:
    """Refuse an unknown test set or language pair without touching the network."""

    if name not in get_available_testsets():
        raise ConfigError(f"eval.sacrebleu_test={name!r} is not a sacrebleu test set (e.g. wmt14, "
                          "wmt20, iwslt17; `sacrebleu --list` shows all)")
    pairs = get_langpairs_for_testset(name)
    if f"{src}-{tgt}" not in pairs:
        raise ConfigError(f"sacrebleu test set {name} has no {src}-{tgt} (data.src-data.tgt); it "
                          f"has {sorted(pairs)}")
