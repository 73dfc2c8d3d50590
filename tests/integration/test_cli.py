"""`heads-lab` end to end, as a user runs it: a subprocess in a scratch working dir."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from tests.conftest import TINY

EXE = shutil.which("heads-lab", path=str(Path(sys.executable).parent)) or "heads-lab"


def heads_lab(*args: str, cwd: Path, env: dict | None = None, unset: tuple = (), timeout: int = 300):
    environ = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    return subprocess.run([EXE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=environ)


def _results(root: Path) -> list[Path]:
    return sorted(root.rglob("results.json"))


def _assert_one_line_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def tiny_run_dir(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("single")
    proc = heads_lab("train", *TINY, cwd=cwd)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (results,) = _results(cwd / "outputs")
    return results.parent


def test_help_lists_commands(tmp_path):
    proc = heads_lab("--help", cwd=tmp_path)
    assert proc.returncode == 0 and "train" in proc.stdout


def test_train_help_shows_hydra_config_groups(tmp_path):
    proc = heads_lab("train", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    for text in ("heads-lab train", "model: base, small, tiny, transformer_base",
                 "logger: none, tensorboard, wandb", "heads: 4"):
        assert text in proc.stdout, text
    # every key with its value and its help, for the config the overrides compose
    keys = heads_lab("train", "model=tiny", "trainer.precision=bf16", "--help", cwd=tmp_path).stdout
    for text in ("model.d_model = 64  # model width",
                 "trainer.precision = bf16  # fp32 | bf16",
                 "data.tokenizer = bpe  # SentencePiece model type: bpe | unigram",
                 "trainer.resume = auto  # auto: continue from the newest valid checkpoint",
                 "model.norm = pre  # pre (LN inside the residual branch)"):
        assert text in keys, text


def test_train_writes_results_with_finite_ppl_and_bleu(tiny_run_dir):
    assert tiny_run_dir.parent.parent.name == "runs"  # outputs/runs/<date>/<time>_<overrides>
    assert tiny_run_dir.name.split("_", 1)[1].startswith("data.adjectives=20,data.adverbs=10")
    assert len(tiny_run_dir.name) < 170  # long override lists are cut, with a hash
    results = json.loads((tiny_run_dir / "results.json").read_text())
    m = results["metrics"]
    for key in ("valid/ppl", "test/ppl", "test/bleu", "test/chrf", "train/loss",
                "train/tokens_per_s", "cost/params"):
        assert math.isfinite(m[key]), key
    assert m["test/ppl"] > 1 and 0 <= m["test/bleu"] <= 100
    assert results["status"] == "complete" and results["train"]["steps"] == 30
    assert results["config"]["model"]["heads"] == 4 and results["config"]["seed"] == 1
    assert results["config"]["trainer"]["capture"] == "auto"  # as asked (the default) ...
    assert results["train"]["captured"] is False  # ... and as it ran: eager, on a CPU
    assert results["sacrebleu"]["bleu_signature"].startswith("nrefs:1|case:mixed")
    assert results["env"]["versions"]["torch"] and results["env"]["versions"]["sacrebleu"]
    assert results["data"]["train"]["kept"] == 600
    for name in ("checkpoints/step_0000030.pt", "checkpoints/best.pt", "tokenizer.model",
                 "train.log", ".hydra/config.yaml"):
        assert (tiny_run_dir / name).exists(), name
    assert results["train"]["skipped_steps"] == 0 and results["train"]["resumed_from"] is None


def test_bleu_equals_sacrebleu_on_the_written_files(tiny_run_dir):
    results = json.loads((tiny_run_dir / "results.json").read_text())
    hyps = (tiny_run_dir / "hyps.test.txt").read_text(encoding="utf-8").splitlines()
    refs = (tiny_run_dir / "refs.test.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len(refs) == 40
    assert sum(bool(h.strip()) for h in hyps) > 30  # the model says something
    assert results["metrics"]["test/bleu"] > 0
    assert results["metrics"]["test/bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert results["metrics"]["test/chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score


def test_multirun_gives_one_run_dir_and_result_per_job(tmp_path):
    proc = heads_lab("train", "-m", *TINY, "model.heads=1,4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    found = _results(tmp_path / "outputs" / "multiruns")
    assert len(found) == 2
    heads = sorted(json.loads(p.read_text())["config"]["model"]["heads"] for p in found)
    assert heads == [1, 4]
    assert sorted(p.parent.name.split("_")[0] for p in found) == ["0", "1"]
    assert len({p.parent.parent for p in found}) == 1  # one multirun dir holds both jobs


def test_same_config_and_seed_give_the_same_numbers(tiny_run_dir, tmp_path):
    proc = heads_lab("train", *TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (again,) = _results(tmp_path / "outputs")
    first = json.loads((tiny_run_dir / "results.json").read_text())["metrics"]
    second = json.loads(again.read_text())["metrics"]
    for key in ("train/loss", "valid/loss", "test/loss", "test/bleu", "test/chrf"):
        assert first[key] == second[key], key
    assert (tiny_run_dir / "hyps.test.txt").read_bytes() == \
        (again.parent / "hyps.test.txt").read_bytes()


@pytest.mark.parametrize("args,fragments", [
    (["model.heads=3"], ["model.heads=3 does not divide model.d_model=128", "model.head_dim"]),
    (["model.foo=1"], ["unknown config key 'model.foo'"]),
    (["model.heads=abc"], ["model.heads=abc", "could not be converted to Integer"]),
    (["model=huge"], ["model/huge", "base, small, tiny, transformer_base"]),
    (["eval.beam=0"], ["eval.beam=0"]),
    (["+trainer.max_step=5"], ["unknown config key 'trainer.max_step'"]),
    (["data=hf", "data.dataset=json", "data.files.train=a.jsonl"],  # a map's new key: +
     ["unknown config key 'data.files.train'", "'data.files' is a map", "+data.files.train=a.jsonl"]),
    (["eval.bleu_tokenize=foo"], ["eval.bleu_tokenize='foo' is not a sacrebleu tokenizer"]),
    (["model.heads=3,4"], ["Ambiguous value", "add -m", "goes in quotes"]),
    (["data.vocab_size=20", "data.train_size=300"], ["data.vocab_size=20 is smaller than"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, fragments):
    proc = heads_lab("train", *args, "logger=none", cwd=tmp_path)
    _assert_one_line_error(proc, *fragments)


def test_unknown_command(tmp_path):
    _assert_one_line_error(heads_lab("trian", cwd=tmp_path),
                           "unknown command 'trian' (did you mean train?)")


def test_a_finished_run_is_never_overwritten(tiny_run_dir, tmp_path):
    before = (tiny_run_dir / "results.json").read_bytes()
    proc = heads_lab("train", *TINY, f"hydra.run.dir='{tiny_run_dir}'", cwd=tmp_path)
    _assert_one_line_error(proc, "already holds a finished run", "choose another hydra.run.dir")
    assert (tiny_run_dir / "results.json").read_bytes() == before


def test_a_bad_value_in_a_sweep_fails_before_any_job_runs(tmp_path):
    proc = heads_lab("train", "-m", *TINY, "model.heads=4,3", cwd=tmp_path)
    _assert_one_line_error(proc, "sweep job model.heads=3",
                           "model.heads=3 does not divide model.d_model=64", "no job was run")
    assert not (tmp_path / "outputs").exists()
    proc = heads_lab("train", "-m", *TINY, "model.heads=abc,4", cwd=tmp_path)
    _assert_one_line_error(proc, "sweep job model.heads=abc", "no job was run")


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
@pytest.mark.parametrize("launcher", ["basic", "joblib", "submitit_local", "ray"])
def test_a_job_failing_at_run_time_does_not_stop_the_sweep(launcher, tmp_path):
    """Whichever launcher ran the failed job (in this process, joblib's workers, submitit's
    separate processes, Ray's workers), the sweep exits 2 naming it, and the other job's results
    are there. (SLURM: tests/integration/test_slurm.py.)"""
    if launcher == "ray":
        pytest.importorskip("hydra_plugins.hydra_ray_launcher",
                            reason="the Ray launcher is not installed: pip install 'heads-lab[ray]'")
    proc = heads_lab("train", "-m", f"hydra/launcher={launcher}", *TINY, "trainer.threads=1",
                     "data.vocab_size=5000,300", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "1 job(s) of the sweep failed: data.vocab_size=5000 (" in proc.stderr
    if launcher != "submitit_local":  # submitit's jobs write their stderr to its log files
        assert "job 0 (data.vocab_size=5000): " in proc.stderr and "too large" in proc.stderr
    found = _results(tmp_path / "outputs")
    assert len({p.parent.parent for p in found}) == 1  # one sweep dir, whichever process ran a job
    assert [json.loads(p.read_text())["config"]["data"]["vocab_size"] for p in found] == [300]
    failed = [json.loads(p.read_text()) for p in (tmp_path / "outputs").rglob("failed.json")]
    assert [(f["job"], "too large" in f["error"]) for f in failed] == [("data.vocab_size=5000", True)]
    sweep = found[0].parent.parent.relative_to(tmp_path)  # each launcher ends on one line
    logs = f"; the launcher's logs: {sweep / '.submitit'}" if "submitit" in launcher else ""
    assert f"sweep {sweep}: 1 finished, 1 failed; its table: heads-lab report {sweep}{logs}\n" \
        in proc.stdout, proc.stdout[-2000:]


def test_a_failed_sweep_job_run_again_is_no_longer_failed(tmp_path):
    from tests.unit.test_data_sources import _corpus, _sentences, _write

    root, sweep = tmp_path / "corpus", tmp_path / "sweep"
    args = ("train", "-m", "model=tiny", "trainer.max_steps=2", "trainer.max_tokens=1024",
            "eval.beam=1", "logger=none", "data=local", f"data.root={root}", "data.src=de",
            "data.tgt=en", "data.vocab_size=60", "model.heads=2,4", f"hydra.sweep.dir={sweep}")
    _corpus(root)
    good = (root / "train.en").read_bytes()
    _write(root / "train.en", _sentences(299, 1, "en"))  # found, but one line short
    first = heads_lab(*args, cwd=tmp_path)  # both jobs fail reading it
    assert first.returncode == 2 and "2 job(s) of the sweep failed" in first.stderr
    assert len(list(sweep.glob("*/failed.json"))) == 2
    (root / "train.en").write_bytes(good)
    again = heads_lab(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert list(sweep.glob("*/failed.json")) == [] and len(list(sweep.glob("*/results.json"))) == 2
    assert f"sweep {sweep}: 2 finished; its table" in again.stdout
    once_more = heads_lab(*args[:-2], "model.heads=2,4,8", args[-1], cwd=tmp_path)
    assert f"sweep {sweep}: 1 finished, 2 finished earlier (skipped); its table" in once_more.stdout


def test_a_sweep_dir_holding_finished_runs_is_refused(tiny_run_dir, tmp_path):
    before = {p: p.read_bytes() for p in tiny_run_dir.rglob("*") if p.is_file()}
    proc = heads_lab("train", "-m", *TINY, "model.heads=2,4",
                     f"hydra.sweep.dir={tiny_run_dir.parent}", f"hydra.sweep.subdir='{tiny_run_dir.name}'",
                     cwd=tmp_path)
    _assert_one_line_error(proc, "already holds a finished run", "choose another hydra.sweep.dir")
    assert {p: p.read_bytes() for p in tiny_run_dir.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("multirun", [False, True])
def test_an_unquoted_dir_holding_an_equals_sign_is_refused_naming_the_quoting(tmp_path, multirun):
    """hydra.sweep.dir=runs/h=8 does not parse (Hydra: "mismatched input '='"): one line naming
    the override and the quotes that fix it, and no dir made from the half-read path."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    proc = heads_lab("train", *(["-m"] if multirun else []), *TINY,
                     f"{key}={tmp_path / 'runs' / 'seed=1,h=8'}", cwd=tmp_path)
    _assert_one_line_error(proc, f"cannot read the override '{key}=")
    assert "quote a value that holds '='" in proc.stderr
    assert not (tmp_path / "runs").exists() and list(tmp_path.iterdir()) == []


def test_a_quoted_run_dir_is_used_as_written(tmp_path):
    """The quoted value is the dir: quotes removed before the dir checks (the earlier check
    made a dir named '"' in the working dir)."""
    from heads_lab.sweeps.overrides import dir_override

    assert dir_override('hydra.run.dir="/runs/h=8"', "hydra.run.dir") == Path("/runs/h=8")
    assert dir_override("hydra.sweep.dir='/a/b=c,d=e'", "hydra.sweep.dir") == Path("/a/b=c,d=e")
    assert dir_override("hydra.run.dir=/x", "hydra.sweep.dir") is None
    # the resume advice names a dir so that, typed into a shell, Hydra reads it back
    import shlex

    from heads_lab.sweeps.signals import dir_arg

    assert dir_override("hydra.sweep.dir=2026", "hydra.sweep.dir") == Path("2026")
    assert dir_override("hydra.run.dir=out/${now:%H}", "hydra.run.dir") is None
    for path in ("/runs/plain", "/runs/seed=1,h=8", "/runs/a b", "/runs/it's", '/runs/a"b',
                 "/runs/$HOME`id`!", "/runs/ü#(x)~", "/runs/end\\"):
        (typed,) = shlex.split(dir_arg("hydra.sweep.dir", path))
        assert dir_override(typed, "hydra.sweep.dir") == Path(path)
    proc = heads_lab("train", *TINY, "trainer.max_steps=1", "trainer.valid_every=1",
                     f'hydra.run.dir="{tmp_path / "h=8"}"', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "h=8" / "results.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h=8"]


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=local", "hydra.launcher.n_jobs=2",
                                          "trainer.threads=1"]], ids=["basic", "local"])
def test_a_finished_sweep_job_is_skipped_or_rerun_with_its_results_kept(tmp_path, launcher):
    """--rerun reaches the jobs in launchers' worker processes too (hydra/launcher=local: two
    jobs, two joblib workers)."""
    args = ["train", "-m", *TINY, "trainer.max_steps=4", "model.heads=2,4", "logger=tensorboard",
            f"hydra.sweep.dir={tmp_path / 's'}", *launcher]
    assert heads_lab(*args, cwd=tmp_path).returncode == 0
    done = sorted((tmp_path / "s").rglob("results.json"))
    first = [d.read_bytes() for d in done]
    assert len(done) == 2
    again = heads_lab(*args, cwd=tmp_path)
    assert again.returncode == 0
    assert [d.read_bytes() for d in done] == first
    rerun = heads_lab(*args, "--rerun", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    for d, before in zip(done, first):
        (kept,) = d.parent.glob("previous-*/results.json")
        assert kept.read_bytes() == before and d.is_file() and d.read_bytes() != before
        # the trackers' files go aside too: the rerun's TensorBoard events start afresh
        assert len(list(kept.parent.glob("tensorboard/events.*"))) == 1
        assert len(list(d.parent.glob("tensorboard/events.*"))) == 1
    if not launcher:  # the basic launcher's jobs print into this process's stderr
        assert again.stderr.count("already complete: skipped") == 2


def _wandb_read(path: Path, *flags: str):
    """A local wandb run read back with wandb's own reader of its transaction log
    (`wandb leet inspect`): the summary object, or with no flags every record."""
    wandb_cli = Path(sys.executable).parent / "wandb"
    proc = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", *flags, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if flags:
        return json.loads(proc.stdout)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_wandb_one_offline_run_per_job_when_the_server_is_unreachable(tmp_path):
    """logger.mode=online without a network: a warning, then offline logging; one wandb run
    per sweep job, each finished, named by what the sweep varies and grouped by the sweep; read
    back with wandb's own tools, it holds the flat config and the summary metrics. The report
    run logs the table and plots into the same group."""
    args = [a for a in TINY if a != "logger=none"]
    proc = heads_lab("train", "-m", *args, "logger=wandb", "logger.mode=online", "seed=1,2",
                     "tags=[study,heads]", cwd=tmp_path,
                     env={"WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_API_KEY": "x" * 40},
                     unset=("WANDB_MODE",), timeout=240)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "unreachable" in proc.stdout + proc.stderr
    found = _results(tmp_path / "outputs")
    assert len(found) == 2
    (sweep_dir,) = (tmp_path / "outputs" / "multiruns").glob("*/*")
    group = f"train/{sweep_dir.parent.name}/{sweep_dir.name}"
    for path in found:
        results = json.loads(path.read_text())
        (run,) = (path.parent / "wandb").glob("offline-run-*")
        assert results["wandb"]["dir"] == str(run) and results["wandb"]["mode"] == "offline"
        summary = _wandb_read(run, "--summary")
        seed = results["config"]["seed"]
        assert summary["name"] == f"seed={seed}" == results["name"]
        assert summary["state"] == "finished" and summary["tags"] == ["study", "heads"]
        assert summary["config"]["model.heads"] == 4 and summary["config"]["seed"] == seed
        for key in ("test/bleu", "test/chrf", "valid/ppl", "cost/params"):
            assert summary["summary"][key] == pytest.approx(results["metrics"][key]), key
        (record,) = [r["run"] for r in _wandb_read(run) if r["type"] == "run"]
        assert record["run_group"] == group and record["job_type"] == "train"
        steps = [r["history"]["step"]["num"] for r in _wandb_read(run) if r["type"] == "history"]
        assert steps and max(steps) == results["train"]["steps"]

    proc = heads_lab("report", str(sweep_dir), "--samples", "50", "--wandb", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (report_run,) = (sweep_dir / "wandb").glob("offline-run-*")
    records = _wandb_read(report_run)
    (record,) = [r["run"] for r in records if r["type"] == "run"]
    assert record["job_type"] == "report" and record["run_group"] == group
    (logged,) = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert logged["report/table._type"] == "table-file"
    table = json.loads((report_run / "files" / logged["report/table.path"]).read_text())
    csv_rows = (sweep_dir / "report.csv").read_text().splitlines()
    assert table["columns"] == csv_rows[0].split(",")[:len(table["columns"])]
    assert len(table["data"]) == len(csv_rows) - 1 == 1  # one row: seeds 1 and 2 pooled
    assert logged["report/report_quality._type"] == "image-file"


def test_talking_heads_with_unequal_head_counts_train_end_to_end(tmp_path):
    proc = heads_lab("train", *TINY, "model.attention=talking_heads", "model.heads_k=2",
                     "model.heads=6", "model.heads_v=3", "model.head_dim=8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = _results(tmp_path / "outputs")
    results = json.loads(found.read_text())
    assert math.isfinite(results["metrics"]["test/ppl"])
    mixes_per_layer = 2 * 6 + 6 * 3  # h_K·h + h·h_V
    assert results["params"]["talking_heads"] == 3 * mixes_per_layer  # 1+1 layers: 3 attentions
    assert results["cost"]["params"]["total"] == results["params"]["total"]
    assert results["metrics"]["cost/attention_act_kb"] > 0


def test_a_time_budget_ends_the_run_with_a_checkpoint_and_results_that_say_so(tmp_path):
    # a budget spent by the first update, long before the first validation (step 15)
    proc = heads_lab("train", *TINY, "trainer.max_time=1e-6", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = _results(tmp_path / "outputs")
    results = json.loads(found.read_text())
    train = results["train"]
    assert (train["steps"], train["stopped_by"], train["max_time"]) == (1, "max_time", 1e-6)
    assert [h["step"] for h in train["valid_history"]] == [1]  # validated as at max_steps
    assert math.isfinite(results["metrics"]["test/bleu"]) and results["status"] == "complete"
    assert (found.parent / "checkpoints" / "step_0000001.pt").is_file()
    # the summary says why it stopped at step 1 of 30
    assert "stopped by max_time" in proc.stdout


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_a_training_subset_is_fixed_nested_and_recorded(tmp_path):
    import numpy as np

    from heads_lab.data import Split, train_subset

    split = Split(None, None, [[i + 4] for i in range(1000)], [[i + 4] for i in range(1000)])
    tenth, third = train_subset(split, 0.1)[1], train_subset(split, 0.3)[1]
    assert len(tenth) == 100 and len(third) == 300 and set(tenth) <= set(third)
    np.testing.assert_array_equal(tenth, train_subset(split, 0.1)[1])  # the same every time
    assert [list(s) for s in train_subset(split, 0.1)[0].src] == [[i + 4] for i in tenth]
    runs = {}
    for seed in (1, 2):
        (tmp_path / str(seed)).mkdir()
        proc = heads_lab("train", *TINY, "trainer.max_steps=2", "data.train_fraction=0.5",
                         f"seed={seed}", cwd=tmp_path / str(seed))
        assert proc.returncode == 0, proc.stderr + proc.stdout
        (found,) = _results(tmp_path / str(seed) / "outputs")
        runs[seed] = json.loads(found.read_text())["data"]["train"]
    assert runs[1]["fraction"] == 0.5 and runs[1]["kept"] == round(0.5 * runs[1]["of"])
    assert runs[1]["subset_sha256"] == runs[2]["subset_sha256"]  # the same sentences per seed
    (tmp_path / "small").mkdir()
    small = heads_lab("train", *TINY, "data.train_fraction=0.001", cwd=tmp_path / "small")
    _assert_one_line_error(small, "data.train_fraction=0.001 leaves 1 training pairs",
                           "less than one batch of trainer.max_tokens=1024")
    assert not list((tmp_path / "small").rglob("results.json"))


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_the_best_validation_weights_are_evaluated_when_asked(tmp_path):
    import torch

    from heads_lab.training import checkpoint
    from heads_lab.training.evaluate import perplexity
    from heads_lab.training.runs import load

    # a learning rate that climbs to 1.0 over the 30 steps: the model gets better, then diverges,
    # so the best validation is an early one and the last is far worse
    proc = heads_lab("train", *TINY, "eval.checkpoint=best", "trainer.valid_every=5",
                     "trainer.lr=1.0", "trainer.warmup_steps=30", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = _results(tmp_path / "outputs")
    results = json.loads(found.read_text())
    train = results["train"]
    best = min(train["valid_history"], key=lambda h: h["valid/loss"])
    last = train["valid_history"][-1]
    assert best["step"] < last["step"] == 30 and last["valid/loss"] > best["valid/loss"] + 1
    assert train["evaluated"] == {"checkpoint": "best", "step": best["step"]}
    assert train["best_step"] == best["step"]
    # eval, analyze and prune read a run back with the weights train evaluated: best.pt here
    t = load(found.parent, [])
    assert t.checkpoints == [f"best.pt (step {best['step']})"]
    state = checkpoint.load(checkpoint.checkpoint_dir(found.parent) / "best.pt")
    assert all(torch.equal(v, t.model.state_dict()[k]) for k, v in state["model"].items())
    with torch.no_grad():
        ppl = perplexity(t.model, t.corpus.splits["test"], 1024, torch.device("cpu"))
        valid = perplexity(t.model, t.corpus.splits["valid"], 1024, torch.device("cpu"))
    assert results["metrics"]["test/ppl"] == pytest.approx(ppl["ppl"], rel=1e-6)
    # the valid PPL reported is the evaluated weights' (the best validation), not the last one's
    assert results["metrics"]["valid/loss"] == best["valid/loss"]
    assert results["metrics"]["valid/ppl"] == pytest.approx(valid["ppl"], rel=1e-5)
    last_weights = load(found.parent, ["eval.checkpoint=last"])  # the newest step checkpoint
    assert last_weights.checkpoints == ["step_0000030.pt"]
    proc = heads_lab("analyze", str(found.parent), "analysis.max_sentences=8", "analysis.lrp=false",
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert f"weights: best.pt (step {best['step']})" in proc.stdout
    (analysis,) = (found.parent / "analysis").rglob("analysis.json")
    assert json.loads(analysis.read_text())["checkpoint"] == f"best.pt (step {best['step']})"
    (checkpoint.checkpoint_dir(found.parent) / "best.pt").unlink()
    proc = heads_lab("eval", str(found.parent), cwd=tmp_path)
    _assert_one_line_error(proc, "no checkpoints/best.pt", "eval.checkpoint=last")
    # without checkpoints the loop keeps the best weights in memory: the same run, the same
    # numbers, and nothing written under checkpoints/
    (tmp_path / "memory").mkdir()
    proc = heads_lab("train", *TINY, "eval.checkpoint=best", "trainer.valid_every=5",
                     "trainer.lr=1.0", "trainer.warmup_steps=30", "trainer.save_checkpoint=false",
                     cwd=tmp_path / "memory")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (kept,) = _results(tmp_path / "memory")
    memory = json.loads(kept.read_text())
    assert memory["train"]["evaluated"] == {"checkpoint": "best", "step": best["step"]}
    assert memory["train"]["valid_history"] == train["valid_history"]
    for key in ("test/ppl", "test/bleu", "test/chrf", "valid/loss"):
        assert memory["metrics"][key] == results["metrics"][key], key
    assert not list(kept.parent.rglob("*.pt"))
    for command in ("eval", "analyze"):  # nothing to read back: one line that says so
        proc = heads_lab(command, str(kept.parent), cwd=tmp_path)
        _assert_one_line_error(proc, "trained with trainer.save_checkpoint=false",
                               "trainer.save_checkpoint=true")


def test_a_log_file_console_gets_plain_unwrapped_lines(tmp_path):
    """stdout not a terminal (a SLURM .out, nohup): one line per log record and progress report,
    no padding, and a long path unbroken, its brackets too (they are not rich markup)."""
    proc = heads_lab("train", *TINY, "prune.sites=[enc-self]", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    lines = proc.stdout.splitlines()
    progress = [line for line in lines if " INFO step " in line and " tok/s " in line]
    assert [line.split("step ", 1)[1].split()[0] for line in progress] == ["10/30", "20/30", "30/30"]
    assert all(" elapsed 0:" in line and " ETA " in line for line in progress)
    assert not [line for line in lines if line.startswith("[") and line != line.rstrip()]
    assert not [line for line in lines if line.startswith("train ")]  # no rich bar beside them
    (found,) = _results(tmp_path / "outputs")
    assert f"results: {found}" in lines
    assert any(line.startswith("overrides: ") and "prune.sites=[enc-self]" in line for line in lines)
    # a setting the run does not read is named, whole, in a warning
    assert any(line.endswith("WARNING prune.sites=[enc-self] has no effect on this training: head "
                             "gates train only with prune.l0_lambda > 0") for line in lines), lines


def test_a_run_logs_a_progress_line_every_log_every_steps(tiny_run_dir):
    # not a terminal (a subprocess): train.log and stdout still show how far the run is
    lines = [line for line in (tiny_run_dir / "train.log").read_text().splitlines()
             if "  loss " in line and " tok/s " in line]
    steps = [line.split("step ", 1)[1].split()[0] for line in lines]
    assert steps == ["10/30", "20/30", "30/30"]
    assert all("elapsed 0:" in line and "ETA " in line and "lr " in line for line in lines)
    assert not any(line.endswith("ETA ?") for line in lines)  # the first from the updates' pace


def test_a_preset_runs_on_any_cpu_without_naming_the_precision(tmp_path):
    from heads_lab.training.device import native_bf16

    # table_a's sweep (trainer.precision=auto), shrunk: two jobs, a tiny model, no real data
    proc = heads_lab("train", "-m", "+experiment=table_a", *TINY, "data=synthetic",
                     "trainer.max_steps=2", "seed=1", "model.heads=1,4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    found = _results(tmp_path / "outputs")
    assert len(found) == 2
    for path in found:
        results = json.loads(path.read_text())
        assert results["config"]["trainer"]["precision"] == "auto"
        assert results["precision"] == ("bf16" if native_bf16() else "fp32")
    report = heads_lab("report", str(tmp_path / "outputs"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr



@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_auto_precision_resumes_in_what_the_checkpoint_trained_in(tmp_path):
    """A preset's trainer.precision=auto records the precision it computed in, in results.json
    and in each checkpoint; resumed, `auto` follows the checkpoint, not this machine: a run
    relabelled as trained in the other precision resumes in fp32 where bf16 is native, and is
    refused in one line, before any work, where bf16 is not (this CPU decides which is tested)."""
    from heads_lab.training import checkpoint
    from heads_lab.training.device import native_bf16

    run_dir = tmp_path / "run"
    args = ["train", "+experiment=table_a", *TINY, "data=synthetic", "seed=1",
            f"hydra.run.dir={run_dir}"]
    proc = heads_lab(*args, "trainer.max_steps=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    results = json.loads((run_dir / "results.json").read_text())
    # resumed in its own precision past a corrupt newer file, which is skipped with one warning
    # (auto_precision's scan of the checkpoints is silent; the resume's warns)
    (run_dir / "results.json").unlink()
    bad = checkpoint.step_path(run_dir, 9)
    bad.write_bytes(b"half a checkpoint")
    proc = heads_lab(*args, "trainer.max_steps=3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert (proc.stderr + proc.stdout).count("falling back to an earlier checkpoint") == 1
    results = json.loads((run_dir / "results.json").read_text())
    assert results["train"]["resumed_from"] == 2 and results["train"]["steps"] == 3
    bad.with_name(bad.name + ".corrupt").unlink()  # kept aside, out of the rotation
    state, path = checkpoint.latest(run_dir)
    assert state["precision"] == results["precision"] == ("bf16" if native_bf16() else "fp32")
    other = "fp32" if native_bf16() else "bf16"
    checkpoint.save(path, {**state, "precision": other})
    (run_dir / "results.json").unlink()
    proc = heads_lab(*args, "trainer.max_steps=4", cwd=tmp_path)
    if native_bf16():
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert json.loads((run_dir / "results.json").read_text())["precision"] == "fp32"
        assert "trained in fp32, so the run resumes in fp32" in proc.stderr + proc.stdout
    else:
        _assert_one_line_error(proc, f"{path.name} trained in bf16 (trainer.precision=auto), and "
                               "bf16 is not native here; resume it where it is")
        assert "data synthetic" not in proc.stderr + proc.stdout  # before the data is read
        assert not (run_dir / "results.json").exists()


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_a_run_read_back_with_auto_is_computed_in_the_precision_it_trained_in(
        tmp_path, monkeypatch, caplog):
    """eval and prune read a preset's run (trainer.precision=auto) back in the precision it
    trained in (the loaded checkpoint's record, else results.json's), not in what `auto` means on
    this machine: an fp32 run stays fp32 where bf16 is native; a bf16 run is read in fp32 where
    bf16 is not native, with a warning; a named precision is what it says. eval.json records the
    precision. analyze computes in fp32 whatever the run names, so bf16 is never refused there."""
    import heads_lab.training.device as device
    from heads_lab.commands import analyze
    from heads_lab.errors import ConfigError
    from heads_lab.training import checkpoint
    from heads_lab.training.runs import load

    run_dir = tmp_path / "run"
    proc = heads_lab("train", "+experiment=table_a", *TINY, "data=synthetic", "seed=1",
                     "trainer.device=cpu", "trainer.max_steps=2", "trainer.keep_last=2",
                     f"hydra.run.dir={run_dir}", cwd=tmp_path)  # native_bf16 is the CPU's
    assert proc.returncode == 0, proc.stderr + proc.stdout
    results = json.loads((run_dir / "results.json").read_text())
    saved = {path: checkpoint.load(path) for path in (run_dir / "checkpoints").glob("*.pt")}

    def label(trained: str | None, told: str | None) -> None:
        """The checkpoints record `trained` (None: not at all, as before the record), and
        results.json says `told`."""
        for path, state in saved.items():
            state = {k: v for k, v in state.items() if k != "precision"}
            checkpoint.save(path, state if trained is None else {**state, "precision": trained})
        (run_dir / "results.json").write_text(json.dumps({**results, "precision": told}))

    def read_back(native: bool, trained: str | None, *overrides: str, told: str | None = None,
                  computes: str | None = None) -> str:
        monkeypatch.setattr(device, "native_bf16", lambda: native)
        label(trained, told or trained)
        return str(load(run_dir, list(overrides), computes=computes).run.trainer.precision)

    with caplog.at_level(logging.INFO, logger="heads_lab.training.runs"):
        assert read_back(True, "fp32") == "fp32"
    assert "the run trained in fp32, so it is read back in fp32" in caplog.text
    assert read_back(False, "fp32") == "fp32"
    assert read_back(True, "bf16") == "bf16"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="heads_lab.training.runs"):
        assert read_back(False, "bf16") == "fp32"
    assert "the run trained in bf16, which is not native here: it is read back in fp32" in \
        caplog.text
    assert read_back(True, "fp32", "trainer.precision=bf16") == "bf16"
    assert read_back(True, "bf16", "trainer.precision=fp32") == "fp32"
    # the weights read say what they trained in; results.json only for a checkpoint that does not
    # (results.json may be another run's: leftovers of trainer.resume=never, analysis.step)
    assert read_back(True, "fp32", told="bf16") == "fp32"
    assert read_back(True, None, told="fp32") == "fp32"
    assert read_back(True, None, told="bf16") == "bf16"
    assert read_back(True, None, told="none") == "bf16"  # neither says: what auto is here
    # analyze computes in fp32: a run naming bf16 is read there on a CPU without native bf16,
    # where eval is refused in one line
    assert read_back(False, "bf16", "trainer.precision=bf16", computes="fp32") == "fp32"
    with pytest.raises(ConfigError, match="this CPU has no native bf16"):
        read_back(False, "bf16", "trainer.precision=bf16")
    label("bf16", "bf16")
    (run_dir / ".hydra" / "overrides.yaml").write_text(
        (run_dir / ".hydra" / "overrides.yaml").read_text() + "- trainer.precision=bf16\n")
    assert analyze.main([str(run_dir), "analysis.max_sentences=8"]) == 0
    (found,) = (run_dir / "analysis").rglob("analysis.json")
    assert json.loads(found.read_text())["sentences"] == 8
    monkeypatch.undo()
    (run_dir / ".hydra" / "overrides.yaml").write_text(
        (run_dir / ".hydra" / "overrides.yaml").read_text().replace("- trainer.precision=bf16\n", ""))
    label(results["precision"], results["precision"])
    proc = heads_lab("eval", str(run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = (run_dir / "evals").rglob("eval.json")
    assert json.loads(found.read_text())["precision"] == results["precision"]


def test_an_explicit_bf16_sweep_stops_once_before_its_first_job_without_native_bf16(monkeypatch):
    import heads_lab.training.device as device
    from heads_lab.errors import ConfigError
    from heads_lab.sweeps.jobs import check_sweep

    monkeypatch.setattr(device, "native_bf16", lambda: False)  # (this CPU may have it)
    with pytest.raises(ConfigError) as err:
        check_sweep(["-m", *TINY, "trainer.device=cpu", "trainer.precision=bf16",
                     "model.heads=1,4"])
    message = str(err.value)
    assert message.startswith("sweep job model.heads=1: trainer.precision=bf16: this CPU has no "
                              "native bf16") and message.endswith("(no job was run)")
    check_sweep(["-m", *TINY, "trainer.device=cpu", "trainer.precision=auto", "model.heads=1,4"])


def test_multi_query_trains_and_reports_costs(tmp_path):
    """model.kv_heads=1 reaches the model: its checkpoint holds one key/value head per layer,
    cost/params is that model's own count and the cost account's for it, below multi-head's."""
    from omegaconf import OmegaConf

    from heads_lab.config.cost import Lengths, account
    from heads_lab.config.schemas import ModelConfig
    from heads_lab.training.checkpoint import load

    proc = heads_lab("train", *TINY, "model.kv_heads=1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (found,) = _results(tmp_path / "outputs")
    result = json.loads(found.read_text())
    m, model = result["metrics"], result["config"]["model"]
    assert model["kv_heads"] == 1
    for key in ("cost/params", "cost/flops_per_token", "cost/decode_flops_per_token",
                "cost/peak_mem_mb", "cost/train_gflops_per_s", "train/tokens_per_s"):
        assert math.isfinite(m[key]) and m[key] > 0, key
    (ckpt,) = sorted((found.parent / "checkpoints").glob("best.pt"))
    weights = load(ckpt)["model"]
    assert m["cost/params"] == sum(w.numel() for w in weights.values())
    d, d_head = model["d_model"], model["d_model"] // model["heads"]
    proj = next(w for k, w in weights.items() if k.endswith("encoder.0.self_attn.in_proj.weight"))
    assert proj.shape == (d + 2 * d_head, d)  # heads queries, one key head, one value head
    def config(**over):  # the run's model config, its enums typed again
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), model, over))

    mqa, mha = config(), config(kv_heads=None)
    vocab = weights["embed.weight"].shape[0]
    lengths = Lengths(20, 20)
    assert account(mqa, vocab, lengths)["params"]["total"] == m["cost/params"] < \
        account(mha, vocab, lengths)["params"]["total"]


def test_info_prints_the_account_without_data_or_training(tmp_path):
    proc = heads_lab("info", "model=base", "model.heads=1,8,32", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for text in ("model.heads=1", "model.heads=8", "model.heads=32", "6,042,624", "FLOPs/token"):
        assert text in proc.stdout, text
    assert not (tmp_path / "outputs").exists()  # nothing written


def test_info_accounts_a_presets_own_sweep_once_per_distinct_config(tmp_path):
    """`info +experiment=table_a` shows the preset's sweep (5 head counts × 3 seeds) as five
    columns, one per head count: the seeds change no cost. The command line's list replaces
    the preset's, as in `train -m`."""
    proc = heads_lab("info", "+experiment=table_a", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "15 configs shown as 5: configs that differ only outside the model" in proc.stdout
    assert "the [heads, n, m] fp32 tensors" in proc.stdout  # the caption as written, no markup
    # stdout is a pipe here: every column's header whole, none cut to fit 80 columns
    assert all(f" model.heads={h} " in proc.stdout for h in (1, 4, 8, 16, 32))
    assert "…" not in proc.stdout
    rows = json.loads(heads_lab("info", "--json", "+experiment=table_a", cwd=tmp_path).stdout)
    assert [r["config"] for r in rows] == [f"model.heads={h}" for h in (1, 4, 8, 16, 32)]
    assert [r["model"]["d_k"] for r in rows] == [256, 64, 32, 16, 8]
    assert [r["configs"] for r in rows] == [3] * 5  # each stands for its three seeds
    rows = json.loads(heads_lab("info", "--json", "+experiment=table_a", "model.heads=1,8",
                                cwd=tmp_path).stdout)
    assert [r["model"]["heads"] for r in rows] == [1, 8]
    rows = json.loads(heads_lab("info", "--json", "model.attention=talking_heads",
                                "model.mixes=logits,weights", cwd=tmp_path).stdout)
    assert [r["config"] for r in rows] == ["model.mixes=logits", "model.mixes=weights"]
    proc = heads_lab("info", "model.heads=8", "seed=1,2", cwd=tmp_path)
    assert "2 configs shown as 1" in proc.stdout
    assert "model.heads=8" in proc.stdout and "seed=1" not in proc.stdout  # not one seed's


def test_info_help_is_its_own(tmp_path):
    proc = heads_lab("info", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: heads-lab info") and "--json" in proc.stdout


def test_info_json_answers_whether_heads_change_parameters(tmp_path):
    from heads_lab.config.cost import parameter_count
    from heads_lab.config.schemas import ModelConfig

    proc = heads_lab("info", "--json", "model=base", "model.heads=1,8,32",
                     "model.attention=mha,talking_heads", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {r["config"]: r for r in json.loads(proc.stdout)}
    assert len(rows) == 6
    mha = {rows[f"model.heads={h} model.attention=mha"]["params"]["total"] for h in (1, 8, 32)}
    assert mha == {parameter_count(ModelConfig(), 2000)["total"]} == {6_042_624}  # vocab 2000
    assert rows["model.heads=32 model.attention=talking_heads"]["model"] == {
        "attention": "talking_heads", "heads": 32, "heads_k": None, "heads_v": None,
        "kv_heads": None, "d_model": 256, "d_k": 8, "d_ff": 1024, "encoder_layers": 3,
        "decoder_layers": 3}  # what the table shows
    th32 = rows["model.heads=32 model.attention=talking_heads"]["params"]
    assert th32["talking_heads"] == 9 * (32 * 32 + 32 * 32)
    assert th32["total"] == rows["model.heads=32 model.attention=mha"]["params"]["total"] + \
        th32["talking_heads"]


def test_info_bad_config_is_one_line(tmp_path):
    _assert_one_line_error(heads_lab("info", "model.kv_heads=3", cwd=tmp_path),
                           "model.heads=4 is not a multiple of model.kv_heads=3")
    _assert_one_line_error(heads_lab("info", "--jsn", cwd=tmp_path),
                           "info: unknown option --jsn", "--json")
    _assert_one_line_error(heads_lab("info", str(tmp_path), cwd=tmp_path),
                           "is not a heads-lab run dir")
    _assert_one_line_error(heads_lab("info", str(tmp_path / "nope"), cwd=tmp_path),
                           f"info: no run dir {tmp_path / 'nope'}; give the dirs")
    _assert_one_line_error(heads_lab("info", "./nope", cwd=tmp_path), "info: no run dir ./nope")
    _assert_one_line_error(heads_lab("info", str(tmp_path), "model.heads=8", cwd=tmp_path),
                           "info: give either run dirs or config overrides, not both")


def test_info_of_a_run_dir_is_its_own_configs_account(tiny_run_dir, tmp_path):
    """`heads-lab info <run dir>` accounts the run's saved config: its parameters are the
    trained model's (results.json)."""
    proc = heads_lab("info", "--json", str(tiny_run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    results = json.loads((tiny_run_dir / "results.json").read_text())
    assert row["config"] == str(tiny_run_dir)
    assert row["params"]["total"] == results["params"]["total"] == results["metrics"]["cost/params"]
    assert row["model"]["heads"] == results["config"]["model"]["heads"]
    # at its training data's mean lengths, as the run's own account (not cost.src_len's 20)
    assert row["lengths"] == results["cost"]["lengths"] != {"src": 20.0, "tgt": 20.0}
    assert row["flops_per_token"] == results["cost"]["flops_per_token"]


def test_eval_errors_name_the_cause_and_leave_no_eval_dir(tmp_path):
    """A sacrebleu test set that cannot be downloaded, too few checkpoints to average, a failed
    job's dir: one line each naming the cause, and no evals/ dir left behind."""
    from tests.unit.test_data_sources import _corpus

    root = tmp_path / "corpus"
    _corpus(root)
    proc = heads_lab("train", "model=tiny", "trainer.max_steps=2", "trainer.max_tokens=1024",
                     "eval.beam=1", "logger=none", "data=local", f"data.root={root}",
                     "data.src=de", "data.tgt=en", "data.vocab_size=60", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (found,) = _results(tmp_path / "outputs")
    run = found.parent
    offline = {"SACREBLEU": str(tmp_path / "sacrebleu"), "https_proxy": "http://127.0.0.1:9",
               "http_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    _assert_one_line_error(heads_lab("eval", str(run), "eval.sacrebleu_test=wmt14", cwd=tmp_path,
                                     env=offline), "wmt14", "eval.sacrebleu_test=null")
    _assert_one_line_error(heads_lab("eval", str(run), "eval.average_last=2", cwd=tmp_path),
                           "has only 1 valid checkpoint(s)", "trainer.save_every=500")
    assert not (run / "evals").exists()
    failed = tmp_path / "failed"
    shutil.copytree(run / ".hydra", failed / ".hydra")
    (failed / "failed.json").write_text(json.dumps({"error": "data.vocab_size=5000 too large"}))
    _assert_one_line_error(heads_lab("eval", str(failed), cwd=tmp_path),
                           "is a failed run, with no checkpoints: data.vocab_size=5000 too large")


def test_output_to_a_pipe_whose_reader_left_ends_without_a_traceback(tmp_path):
    """`heads-lab info --json | head` ended in a BrokenPipeError traceback when head exited
    before heads-lab wrote; now it exits 141 (128 + SIGPIPE) silently, as other tools do."""
    for args in (["info", "model.heads=1,8", "--json"], ["--help"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before heads-lab writes
        try:
            proc = subprocess.run([EXE, *args], cwd=tmp_path, stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write)
        assert proc.returncode == 141, proc.stderr
        assert proc.stderr == ""
