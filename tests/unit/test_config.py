"""The real config tree composes, types are enforced when composing, relations by validate()."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ValidationError

from heads_lab.config.compose import to_object
from heads_lab.config.schemas import AttentionKind, ModelConfig, Norm, SyntheticDataConfig, WandbConfig
from heads_lab.config.validate import validate
from heads_lab.errors import ConfigError
from tests.conftest import compose


def test_defaults_compose_to_typed_groups():
    run = to_object(compose())
    validate(run)
    assert isinstance(run.model, ModelConfig) and isinstance(run.data, SyntheticDataConfig)
    assert isinstance(run.logger, WandbConfig) and run.logger.mode.value == "offline"
    assert run.model.heads == 4 and run.model.d_head == run.model.d_model // 4 == 32
    assert run.model.norm is Norm.pre and run.model.attention is AttentionKind.mha
    assert run.eval.beam == 4 and run.eval.lenpen == 0.6


@pytest.mark.parametrize("option", ["model=tiny", "model=small", "model=base", "model=transformer_base",
                                    "logger=none", "logger=wandb"])
def test_every_group_option_composes_and_validates(option):
    validate(to_object(compose([option])))


def test_overrides_reach_the_typed_config():
    run = to_object(compose(["model.heads=2", "model.head_dim=48", "model.norm=post", "seed=7",
                             "trainer.max_tokens=2000", "eval.beam=1"]))
    assert (run.model.heads, run.model.d_head, run.model.norm) == (2, 48, Norm.post)
    assert (run.seed, run.trainer.max_tokens, run.eval.beam) == (7, 2000, 1)


def test_wrong_type_fails_when_composing():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["model.heads=abc"])
    assert isinstance(err.value.__cause__, ValidationError)


@pytest.mark.parametrize("override", ["model.foo=1", "trainer.max_step=5", "bogus=1"])
def test_unknown_key_fails_when_composing(override):
    with pytest.raises(ConfigCompositionException) as err:
        compose([override])
    assert isinstance(err.value.__cause__, ConfigAttributeError)
    assert override.split("=")[0] in str(err.value)


@pytest.mark.parametrize("override, choices", [
    ("model.norm=middle", "[pre, post]"), ("trainer.precision=fp16", "[fp32, bf16, auto]"),
    ("trainer.resume=maybe", "[auto, never]"), ("data.tokenizer=wordpiece", "[bpe, unigram]"),
    ("analysis.split=dev", "[train, valid, test]"), ("eval.split=train", "[valid, test]"),
    ("prune.method=random", "[importance, gates]"), ("prune.gate_eval=soft", "[voita, binary]"),
    ("model.init=kaiming", "[xavier, admin]"),
])
def test_choices_are_checked_when_composing_and_name_the_choices(override, choices):
    from heads_lab.config.messages import one_line

    with pytest.raises(ConfigCompositionException) as err:
        compose([override])
    line = one_line(err.value)
    assert f"bad value in override {override}" in line and choices in line
    assert "\n" not in line


@pytest.mark.parametrize("overrides,message", [
    (["model.heads=3"], "model.heads=3 does not divide model.d_model=128"),
    (["model.heads=0"], "model.heads=0 must be a positive integer"),
    (["model.heads=-2"], "model.heads=-2 must be a positive integer"),
    (["model.dropout=1.0"], "model.dropout=1.0 must be in [0, 1)"),
    (["eval.beam=0"], "eval.beam=0 must be >= 1"),
    (["trainer.pad_multiple=0"], "trainer.pad_multiple=0 must be >= 1"),
    (["trainer.compile=true", "trainer.capture=true"], "set trainer.compile=false"),
    (["trainer.capture=maybe"], "trainer.capture=maybe: use auto (on for a CUDA device"),
    (["trainer.pad_multiple=16", "data.max_len=60", "model.max_positions=63"],
     "trainer.pad_multiple=16 pads the longest sentence"),
    (["trainer.max_steps=null"], "trainer.max_steps and trainer.max_epochs are both null"),
    (["trainer.max_tokens=64"], "trainer.max_tokens=64 is smaller than the longest allowed"),
    (["data.p_plural=1.5"], "data.p_plural=1.5 must be a probability"),
    (["trainer.device=tpu"], "trainer.device='tpu' is not a device"),
    (["model.kv_heads=3"], "model.heads=4 is not a multiple of model.kv_heads=3"),
    (["model.kv_heads=0"], "model.kv_heads=0 must be a positive integer"),
    (["model.relative_positions=-1"], "model.relative_positions=-1 must be 0 (off) or the largest"),
    (["model.attention=talking_heads", "model.kv_heads=2"],
     "model.kv_heads=2 applies to model.attention=mha"),
    (["model.heads_k=2"], "model.heads_k=2 needs model.attention=talking_heads"),
    (["model.mix_init=normal"], "model.mix_init=normal needs model.attention=talking_heads"),
    (["model.mixes=logits"], "model.mixes=logits needs model.attention=talking_heads"),
    (["model.attention=talking_heads", "model.mixes=logits", "model.heads_v=2"],
     "model.mixes=logits needs model.heads_v = model.heads (4), not 2"),
    (["model.attention=talking_heads", "model.mixes=weights", "model.heads_k=8"],
     "model.mixes=weights needs model.heads_k = model.heads (4), not 8"),
    (["model.attention=talking_heads", "model.heads_v=0"], "model.heads_v=0 must be a positive"),
    (["model.attention=talking_heads", "model.talking_heads_in=[enc]"],
     "model.talking_heads_in has ['enc']"),
    # values torch or numpy refused only mid-run, with a traceback, or took and did nonsense with
    (["seed=-1"], "seed=-1 must be >= 0"),
    (["trainer.adam_betas=[1.5,0.9]"], "trainer.adam_betas=[1.5, 0.9] must both be in [0, 1)"),
    (["trainer.adam_eps=0"], "trainer.adam_eps=0.0 must be > 0"),
    (["trainer.weight_decay=-1"], "trainer.weight_decay=-1.0 must be >= 0"),
    (["trainer.position_bias_lr=-1"], "trainer.position_bias_lr=-1.0 must be > 0 (or null: "
     "trainer.lr)"),
    (["prune.lr=-1"], "prune.lr=-1.0 must be > 0 (or null: the run's last)"),
    (["prune.gate_lr=0"], "prune.gate_lr=0.0 must be > 0 (or null: the model's)"),
    (["eval.max_len_b=-1"], "eval.max_len_b=-1: an output may be a · source length + b tokens"),
    (["cost.tgt_len=0"], "cost.tgt_len=0.0 must be >= 1 token"),
    (["data.zipf=-1"], "data.zipf=-1.0 must be >= 0"),
    (["analysis.sentences=[0,-1]"], "analysis.sentences=[0, -1] must be sentence numbers >= 0"),
])
def test_validate_names_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(to_object(compose(overrides)))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_head_dim_allows_heads_that_do_not_divide_d_model():
    run = to_object(compose(["model.heads=3", "model.head_dim=64"]))
    validate(run)
    assert run.model.d_head == 64


@pytest.mark.parametrize("preset", sorted(p.stem for p in (Path(__file__).parents[2] / "conf" /
                                                          "experiment").glob("*.yaml")))
def test_every_experiment_preset_composes_and_validates(preset):
    run = to_object(compose([f"+experiment={preset}"] +
                            (["+depth=shallow"] if preset == "deep_vs_shallow" else [])))
    validate(run)
    assert run.name == preset or preset.startswith(run.name)


def test_a_config_written_before_new_settings_stands_for_their_old_behaviour():
    from heads_lab.config.compose import written_before

    old = {"model.attention": "mha", "model.heads": 8, "trainer.max_steps": 1000}
    added = {"data.train_fraction": 1.0, "eval.checkpoint": "last", "trainer.capture": False,
             "trainer.pad_multiple": 1, "task": "translate", "trainer.schedule": "inverse_sqrt",
             "trainer.min_lr": 0.1, "trainer.optimizer": "adam", "data.block_size": 256,
             "data.held_out": 2000, "data.seed": 0, "model.positions": "sinusoidal"}
    assert written_before(old) == added  # each as every run before it did
    new = {**old, "data.train_fraction": 0.1, "eval.checkpoint": "best",
           "trainer.capture": True, "trainer.pad_multiple": 8, "task": "lm",
           "trainer.schedule": "cosine", "trainer.min_lr": 0.0, "trainer.optimizer": "adamw",
           "data.block_size": 128, "data.held_out": 10, "data.seed": 3,
           "model.positions": "none"}
    assert written_before(new) == {}  # present keys are never overridden
    talking = {"model.attention": "talking_heads", "model.heads": 4, "model.heads_v": 8}
    assert written_before(talking)["model.mix_init"] == "identity"


@pytest.mark.parametrize("data", ["local", "multi30k", "hf", "tatoeba", "synthetic"])
@pytest.mark.parametrize("logger", ["none", "wandb", "tensorboard"])
def test_every_key_that_train_help_lists_has_its_help_text(data, logger):
    """`heads-lab train --help` lists every key with its help (CONTRIBUTING's rule), also a
    key a data source or logger redefines only to change its default (its parent's help)."""
    from heads_lab.config.compose import describe_keys

    lines = describe_keys(to_object(compose([f"data={data}", f"logger={logger}"])))
    assert len(lines) > 100
    assert [line for line in lines if "  # " not in line] == []
    by_key = {line.split(" = ")[0].strip(): line for line in lines}
    assert "# joint subword vocabulary" in by_key["data.vocab_size"]  # its parent's help


def test_settings_a_command_does_not_read_are_named():
    """prune.* settings set on the command line but not read by the command with this config:
    one warning each; the ones it reads, and other keys, none."""
    from heads_lab.config.schemas import PruneConfig, PruneMethod
    from heads_lab.config.unread import unread_prune_settings

    no_gates, gates = PruneConfig(), PruneConfig(l0_lambda=0.05)
    args = ["prune.gate_lr=0.1", "prune.step=0.2", "prune.l0_lambda=0", "model.heads=4"]
    assert unread_prune_settings(args, "train", no_gates) == [
        "prune.gate_lr=0.1 has no effect on this training: head gates train only with "
        "prune.l0_lambda > 0",
        "prune.step=0.2 has no effect on this training: it is a setting of heads-lab prune, "
        "which reads it from this run's config"]
    assert unread_prune_settings(["+prune.gate_lr=0.1", "prune.sites=[enc-self]"], "train",
                                 gates) == []
    assert unread_prune_settings(["prune.steps=9"], "train", gates) == [
        "prune.steps=9 has no effect on this training: it is a setting of heads-lab prune, which "
        "does not prune a run trained with gates"]
    assert unread_prune_settings(["prune.gate_lr=0.1", "prune.step=0.2"], "prune",
                                 no_gates, pretrained=True) == [
        "prune.gate_lr=0.1 has no effect with method=importance: prune hf:... runs "
        "method=importance only"]
    importance = ["method=importance", "prune.step=0.2", "prune.sites=[enc-self]",
                  "prune.split=test", "prune.steps=9", "prune.init_keep=0.5"]
    assert unread_prune_settings(importance, "prune", no_gates) == [
        "prune.steps=9 has no effect with method=importance: only method=gates reads it",
        "prune.init_keep=0.5 has no effect with method=importance: only method=gates reads it"]
    by_gates = PruneConfig(method=PruneMethod.gates, l0_lambda=0.05)
    assert unread_prune_settings(["prune.method=gates", "prune.step=0.2", "prune.split=test",
                                  "prune.lr=1e-4", "prune.sites=[enc-self]"], "prune",
                                 by_gates) == [
        "prune.step=0.2 has no effect with method=gates: only method=importance reads it",
        "prune.split=test has no effect with method=gates: only method=importance reads it"]


def test_training_settings_another_setting_turns_off_are_named():
    """Set on the command line but turned off by another setting: model.talking_heads_in under
    mha, trainer.position_bias_lr without relative positions, a patience too long for the run's
    validations, and the text cleaning of the (generated) synthetic pair: a warning each; the
    same settings where they act, none."""
    from heads_lab.config.unread import unread_train_settings

    args = ["model.talking_heads_in=[enc-self]", "trainer.position_bias_lr=0.1",
            "trainer.patience=2", "data.cleaning.dedup=true", "data.cleaning.max_ratio=2",
            "data.max_train_pairs=3"]
    run = to_object(compose(["trainer.max_steps=300", "trainer.valid_every=100",
                             *args]))
    assert unread_train_settings(args, run) == [
        "model.talking_heads_in=[enc-self] has no effect on this training: model.attention=mha "
        "has no talking heads",
        "trainer.position_bias_lr=0.1 has no effect on this training: model.relative_positions=0 "
        "gives no position biases",
        "data.cleaning.dedup=true has no effect on this training: data=synthetic is generated "
        "clean (only data.cleaning.max_ratio applies)",
        "data.max_train_pairs=3 has no effect on this training: data=synthetic generates "
        "data.train_size training pairs: set that instead"]
    acting = to_object(compose(["model.attention=talking_heads", "model.relative_positions=4",
                                "trainer.max_steps=300", "trainer.valid_every=100",
                                "trainer.patience=2", "data=tatoeba"]))
    assert unread_train_settings(args, acting) == []
    short = to_object(compose(["trainer.max_steps=300", "trainer.valid_every=100",
                               "trainer.patience=3"]))
    assert unread_train_settings(["trainer.patience=3"], short) == [
        "trainer.patience=3 has no effect on this training: this run validates 3 time(s) (every "
        "trainer.valid_every=100 of trainer.max_steps=300), too few for 3 validations without "
        "improvement"]


def test_analyze_names_the_settings_it_will_not_read():
    """`analyze` warns, as prune does, of an analysis setting it will not act on: a treebank's
    translation comment without a treebank, a split or parse beside a treebank, LRP's bound with
    LRP off; for a pretrained model a checkpoint step and LRP. Settings it reads say nothing."""
    from heads_lab.config.schemas import AnalysisConfig
    from heads_lab.config.unread import unread_analysis_settings

    plain = AnalysisConfig()
    assert unread_analysis_settings(["analysis.treebank_ref=text_en", "analysis.lrp=false",
                                     "analysis.max_sentences=9"], plain, False) == [
        "analysis.treebank_ref=text_en has no effect on this analysis: it names a comment of "
        "analysis.treebank's sentences, and none is given"]
    treebank = AnalysisConfig(treebank="pud.conllu", lrp=False)
    got = unread_analysis_settings(["analysis.split=valid", "analysis.conllu=x.conllu",
                                    "analysis.lrp_sentences=50", "analysis.treebank_ref=text_en"],
                                   treebank, False)
    assert [line.split(" has no")[0] for line in got] == [
        "analysis.split=valid", "analysis.conllu=x.conllu", "analysis.lrp_sentences=50"]
    hf = unread_analysis_settings(["analysis.step=200", "analysis.lrp=true"], plain, True)
    assert [line.split(": ", 1)[1] for line in hf] == [
        "a pretrained model has no checkpoints of its training",
        "LRP is not measured for pretrained models (its rules follow heads-lab's own layers)"]
    assert unread_analysis_settings(["analysis.step=200"], plain, False) == []
