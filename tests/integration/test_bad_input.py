"""Bad input, table-driven: every case exits 2 with one line naming the key or file and the fix,
no traceback, leaves an earlier finished run's files untouched and no run dir of its own."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.integration.test_cli import _assert_one_line_error, heads_lab
from tests.unit.test_data_sources import _corpus, _write

FAST = ["model=tiny", "trainer.max_steps=2", "trainer.max_tokens=1024", "eval.beam=1",
        "logger=none"]


def _local(root: Path) -> list[str]:
    return ["data=local", f"data.root={root}", "data.src=de", "data.tgt=en", "data.vocab_size=60"]


def _setup(case: str, where: Path, earlier: Path) -> list[str]:
    """Files a case needs (in `where`; `earlier`: the finished run, copied, never changed);
    returns extra arguments."""
    if case == "a-file":
        (where / "a-file").write_text("not a run dir")
        return []
    if case == "broken-overrides":
        (where / "run" / ".hydra").mkdir(parents=True)
        (where / "run" / ".hydra" / "overrides.yaml").write_text("model.heads: [\n")
        return []
    if case == "changed-overrides":  # the finished run, its overrides.yaml edited afterwards
        shutil.copytree(earlier, where / "run")
        with open(where / "run" / ".hydra" / "overrides.yaml", "a") as f:
            f.write("- model.heads=2\n")
        return []
    if case == "mismatch":
        root = _corpus(where / "c")
        _write(root / "train.en", ["x"] * 299)
        return _local(root)
    if case == "empty":
        root = _corpus(where / "c")
        _write(root / "train.de", [])
        _write(root / "train.en", [])
        return _local(root)
    if case == "undecodable":
        root = _corpus(where / "c")
        _write(root / "train.de", b"gut\n" * 150 + b"\xff\xfe kaputt\n" + b"gut\n" * 149)
        return _local(root)
    if case == "unwritable":
        (where / "a-file").write_text("not a dir")
        return [f"hydra.run.dir={where / 'a-file' / 'run'}"]
    if case == "corrupt-resume":
        run = where / "resume-me"
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "step_0000004.pt").write_bytes(b"half a checkpoint")
        return [f"hydra.run.dir={run}"]
    return []


# (setup, command and arguments, fragments the one line must contain: the key or file, the fix)
CASES = [
    ("heads-zero", None, ["train", "model.heads=0"], ["model.heads=0", "positive integer"]),
    ("heads-negative", None, ["train", "model.heads=-4"], ["model.heads=-4", "positive integer"]),
    ("heads-not-dividing", None, ["train", "model.heads=3"],
     ["model.heads=3 does not divide model.d_model=64", "model.head_dim"]),
    ("kv-not-dividing", None, ["train", "model.kv_heads=3"], ["model.kv_heads=3", "model.heads"]),
    ("unknown-attention", None, ["train", "model.attention=sparse"],
     ["model.attention", "sparse"]),
    ("dropout-one", None, ["train", "model.dropout=1.0"], ["model.dropout=1.0", "[0, 1)"]),
    ("dropout-negative", None, ["train", "model.dropout=-0.1"], ["model.dropout=-0.1", "[0, 1)"]),
    ("beam-zero", None, ["train", "eval.beam=0"], ["eval.beam=0", ">= 1"]),
    ("max-tokens-small", None, ["train", "trainer.max_tokens=100"],
     ["trainer.max_tokens=100 is smaller than the longest allowed sentence", "raise"]),
    ("unknown-key", None, ["train", "model.foo=1"], ["unknown config key 'model.foo'"]),
    ("unknown-added-key", None, ["train", "+trainer.max_step=5"],
     ["unknown config key 'trainer.max_step'"]),
    ("unknown-option", None, ["train", "model=huge"], ["model/huge", "base, small, tiny"]),
    ("optional-group", None, ["train", "mix=logits"],
     ["'mix' is an optional config group", "a leading +", "+mix=<option>"]),
    ("type-error", None, ["train", "model.heads=abc"],
     ["model.heads=abc", "could not be converted to Integer"]),
    ("bad-enum", None, ["train", "model.norm=middle"], ["model.norm", "middle"]),
    ("no-data-root", None, ["train", "data=local", "data.root=/does/not/exist"],
     ["train file is missing", "/does/not/exist"]),
    ("mismatch", "mismatch", ["train"], ["train.de has 300 lines but", "train.en has 299"]),
    ("empty-train", "empty", ["train"], ["the train split of data=local is empty", "gave 0 pairs",
                                         "check the files"]),
    ("undecodable", "undecodable", ["train"], ["train.de:151: not UTF-8", "on_decode_error=skip"]),
    ("unwritable-output", "unwritable", ["train"], ["cannot write", "a-file"]),
    ("corrupt-resume", "corrupt-resume", ["train"],
     ["holds no valid checkpoint", "step_0000004.pt", "delete that dir"]),
    ("precision", None, ["train", "trainer.precision=fp16"],
     ["trainer.precision=fp16", "expected one of [fp32, bf16, auto]"]),
    ("lr-zero", None, ["train", "trainer.lr=0"], ["trainer.lr=0", "> 0"]),
    ("save-every", None, ["train", "trainer.save_every=-1"], ["trainer.save_every=-1", ">= 0"]),
    ("resume-mode", None, ["train", "trainer.resume=maybe"],
     ["trainer.resume=maybe", "expected one of [auto, never]"]),
    ("no-stop", None, ["train", "trainer.max_steps=null", "trainer.max_epochs=null"],
     ["trainer.max_steps and trainer.max_epochs are both null", "set at least one"]),
    ("update-freq", None, ["train", "trainer.update_freq=0"], ["trainer.update_freq=0", ">= 1"]),
    ("average-last", None, ["train", "eval.average_last=0"], ["eval.average_last=0", ">= 1"]),
    ("sacrebleu-tokenizer", None, ["train", "eval.bleu_tokenize=foo"],
     ["eval.bleu_tokenize='foo' is not a sacrebleu tokenizer"]),
    ("eval-no-dir", None, ["eval", "/no/such/run"], ["no run dir /no/such/run", "give the dir"]),
    ("eval-not-a-run", "empty-dir", ["eval", "."], ["not a heads-lab run dir"]),
    ("eval-bad-override", None, ["eval", ".", "model.heads=2"],
     ["evaluation settings only", "model.heads=2"]),
    ("report-no-results", None, ["report", "."], ["no finished runs (results.json) under"]),
    ("report-samples", None, ["report", ".", "--samples", "0"],
     ["--samples 0", "at least 1 resample"]),
    ("admin-pre-norm", None, ["train", "model.init=admin"],
     ["model.init=admin is for post-norm models", "model.norm=post"]),
    ("train-fraction", None, ["train", "data.train_fraction=1.5"],
     ["data.train_fraction=1.5", "(0, 1]"]),
    ("patience-zero", None, ["train", "trainer.patience=0"], ["trainer.patience=0", ">= 1"]),
    ("time-budget-zero", None, ["train", "trainer.max_time=0"],
     ["trainer.max_time=0", "> 0 seconds", "null"]),
    ("typo-key", None, ["train", "model.head=8"], ["model.head", "did you mean model.heads?"]),
    ("typo-group", None, ["train", "modle.heads=8"], ["modle.heads", "did you mean model.heads?"]),
    ("typo-nested-key", None, ["train", "data.cleaning.max_ration=2"],
     ["did you mean data.cleaning.max_ratio?"]),
    ("typo-preset", None, ["train", "+experiment=tabel_a"],
     ["experiment/tabel_a", "did you mean +experiment=table_a?"]),
    ("mixes-on-mha", None, ["train", "model.mixes=weights"],
     ["model.mixes=weights needs model.attention=talking_heads", "model.mixes=null"]),
    ("append-a-set-key", None, ["train", "+model.heads=8"],
     ["An item is already at 'model.heads'", "drop the leading +"]),
    ("unknown-interpolation", None, ["train", "model.heads=${oops}"],
     ["Interpolation key 'oops' not found", "name one that exists"]),
    ("override-syntax", None, ["train", "model.heads=1,,8"],
     ["cannot read the override 'model.heads=1,,8'", "quote a value"]),
    ("group-removed", None, ["train", "~model"], ["model has no value", "model=<option>"]),
    ("info-override-syntax", None, ["info", "model.heads=1,,8"],
     ["Error parsing override 'model.heads=1,,8'", "write key=value"]),
    # values torch or numpy refused mid-run with a traceback (the run dir left behind)
    ("seed-negative", None, ["train", "seed=-1"], ["seed=-1 must be >= 0"]),
    ("adam-betas", None, ["train", "trainer.adam_betas=[1.5,0.9]"],
     ["trainer.adam_betas=[1.5, 0.9] must both be in [0, 1)"]),
    ("weight-decay", None, ["train", "trainer.weight_decay=-1"],
     ["trainer.weight_decay=-1.0 must be >= 0"]),
    ("output-length", None, ["train", "eval.max_len_a=-1"],
     ["eval.max_len_a=-1.0", "neither may be negative"]),
    ("prune-lr", None, ["prune", "RUN", "method=gates", "prune.lr=-1"], ["prune.lr=-1.0", "> 0"]),
    # a run dir given wrongly, or its config file broken or changed after training
    ("eval-a-file", "a-file", ["eval", "./a-file"], ["a-file is a file, not a run dir"]),
    ("eval-sweep", None, ["eval", "RUN", "eval.beam=1,2"],
     ["heads-lab eval runs no sweeps", "run it once per value"]),
    ("eval-unquoted-head-list", None, ["eval", "RUN", "eval.head_mask=enc:0:3,enc:1:2"],
     ["a value with commas goes in quotes", "\"eval.head_mask='enc:0:3,enc:1:2'\""]),
    ("eval-multirun", None, ["eval", "-m", "RUN", "eval.beam=2"],
     ["heads-lab eval runs no sweeps: drop -m"]),
    ("eval-broken-overrides", "broken-overrides", ["eval", "./run"],
     [".hydra/overrides.yaml is not a list of overrides", "restore it"]),
    ("eval-changed-overrides", "changed-overrides", ["eval", "./run"],
     ["was written by a model with model.heads=4", "now rebuilds model.heads=2",
      "set model.heads=4 there (a last line '- model.heads=4' overrides the rest)"]),
]
if not __import__("torch").cuda.is_available():
    CASES.append(("cuda-missing", None, ["train", "trainer.device=cuda"],
                  ["trainer.device=cuda: no CUDA device here", "use trainer.device=cpu"]))


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """A finished run in the working dir every case runs in, and a fingerprint of its files."""
    cwd = tmp_path_factory.mktemp("cwd")
    proc = heads_lab("train", *TINY, "trainer.max_steps=4", cwd=cwd)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (results,) = (cwd / "outputs").rglob("results.json")
    return cwd, results.parent, _fingerprint(results.parent)


def _fingerprint(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_table_has_at_least_25_cases():
    assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name,setup,args,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_loses_nothing(earlier_run, tmp_path, name, setup, args,
                                                        fragments):
    cwd, run_dir, before = earlier_run
    extra = _setup(setup, tmp_path, run_dir) if setup else []
    command, rest = args[0], args[1:]
    # "." and "./NAME": this case's dir and a file or dir in it; RUN: the earlier run
    rest = [str(tmp_path) if a == "." else str(tmp_path / a[2:]) if a.startswith("./") else
            str(run_dir) if a == "RUN" else a for a in rest]
    if command == "train":
        proc = heads_lab("train", *FAST, *extra, *rest, cwd=cwd)
    else:
        proc = heads_lab(command, *rest, cwd=cwd)
    _assert_one_line_error(proc, *fragments)
    assert _fingerprint(run_dir) == before  # the earlier run: every file as it was
    # no run dir left behind for `report` to list as "not started" (a config refused before Hydra
    # writes anything, a data error after: its .hydra/ and train.log removed)
    assert sorted((cwd / "outputs" / "runs").glob("*/*")) == [run_dir]


def test_a_sweep_without_multi30k_stops_before_its_first_job(earlier_run, tmp_path):
    """Multi30k neither in a data root nor reachable on the hub: the sweep's checks say so once,
    before any job starts or any dir is made (it once ran every job into the same error)."""
    cwd, run_dir, before = earlier_run
    sweep = tmp_path / "sweep"
    proc = heads_lab("train", "-m", *FAST, "data=multi30k", "model.heads=1,2",
                     f"hydra.sweep.dir={sweep}", cwd=cwd,
                     env={"HF_ENDPOINT": "http://127.0.0.1:9"},  # a hub that refuses at once
                     unset=("HEADS_LAB_DATA", "HF_HUB_OFFLINE"))
    _assert_one_line_error(proc, "sweep job model.heads=1:", "Multi30k files", "hub", "unreachable",
                           "HEADS_LAB_DATA", "(no job was run)")
    assert not sweep.exists() and _fingerprint(run_dir) == before


def test_a_run_whose_data_is_gone_says_it_is_read_back_with_that_data(tmp_path):
    """eval, analyze and prune read a run back with its corpus: when the files are gone, the one
    line says so before naming the missing file."""
    root = _corpus(tmp_path / "c")
    proc = heads_lab("train", *FAST, *_local(root), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (run,) = [p.parent for p in (tmp_path / "outputs").rglob("results.json")]
    root.rename(tmp_path / "moved")
    for command in ("eval", "analyze"):
        proc = heads_lab(command, str(run), cwd=tmp_path)
        _assert_one_line_error(proc, f"{run} is read back with the data it trained on (data=local",
                               "train file is missing", str(root),
                               "if the files moved, say where they are now: add "
                               "data.root=<their dir>")
    # and the fix it names works
    proc = heads_lab("eval", str(run), f"data.root={tmp_path / 'moved'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_a_refused_resume_keeps_the_earlier_runs_config(earlier_run, tmp_path):
    """Training into an unfinished run's dir with another model is refused; Hydra had already
    written the refused settings into the dir's .hydra/, so eval read the earlier run as the
    refused one (a 4-head checkpoint loads into a 2-head model: the shapes agree). The earlier
    files are put back, byte for byte."""
    cwd, run_dir, _ = earlier_run
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run_dir, unfinished)
    (unfinished / "results.json").unlink()
    before = _fingerprint(unfinished / ".hydra")
    proc = heads_lab("train", *TINY, "trainer.max_steps=4", "model.heads=2",
                     f"hydra.run.dir={unfinished}", cwd=cwd)
    _assert_one_line_error(proc, "was written by a run with model.heads=4, not 2")
    assert _fingerprint(unfinished / ".hydra") == before
    assert (unfinished / "checkpoints").is_dir()  # and nothing of the run was removed


def test_a_sacrebleu_test_set_it_cannot_fetch_stops_the_run_before_it_trains(tmp_path):
    """eval.sacrebleu_test offline and not yet downloaded: the run trained to the end and only
    then failed, with no results.json; now it stops before the first step, in one line, and
    leaves no run dir."""
    root = _corpus(tmp_path / "c")
    offline = {"SACREBLEU": str(tmp_path / "sacrebleu"), "https_proxy": "http://127.0.0.1:9",
               "http_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    proc = heads_lab("train", *FAST, *_local(root), "eval.sacrebleu_test=wmt14", cwd=tmp_path,
                     env=offline)
    _assert_one_line_error(proc, "sacrebleu could not fetch test set wmt14 (de-en)",
                           "eval.sacrebleu_test=null")
    assert "step 2/2" not in proc.stdout + proc.stderr
    assert not list(tmp_path.rglob("step_*.pt")) and not list(tmp_path.rglob("results.json"))
    assert not list((tmp_path / "outputs" / "runs").glob("*/*"))
