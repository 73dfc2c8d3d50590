"""Run dir naming and one-line error messages."""

from __future__ import annotations

import os

import pytest

from heads_lab.config.compose import expand_sweeps
from heads_lab.config.compose import run_dir_suffix as _dir_suffix


def test_dir_suffix():
    assert _dir_suffix("") == ""
    assert _dir_suffix("model.heads=8,seed=2") == "_model.heads=8,seed=2"
    assert _dir_suffix("data.root=/a/b c") == "_data.root=-a-b-c"
    # a quoted override (a value holding commas) names its dir without the quotes
    assert _dir_suffix("eval.head_mask='enc:0:3,dec:1:0'") == "_eval.head_mask=enc:0:3,dec:1:0"
    assert _dir_suffix('data.pattern="{split}.tsv"') == "_data.pattern={split}.tsv"
    long_a, long_b = "x=" + "1" * 300, "x=" + "1" * 299 + "2"
    assert len(_dir_suffix(long_a)) <= 151 and _dir_suffix(long_a) != _dir_suffix(long_b)


def test_expand_sweeps():
    assert expand_sweeps(["a=1,2", "b=x", "c=3,4"]) == [
        ["a=1", "b=x", "c=3"], ["a=1", "b=x", "c=4"], ["a=2", "b=x", "c=3"], ["a=2", "b=x", "c=4"]]
    assert expand_sweeps([]) == [[]]
    assert expand_sweeps(["+experiment=x", "m.l=[1,2]"]) == [["+experiment=x", "m.l=[1,2]"]]


def test_run_dir_probe_survives_ranks_probing_the_same_dir_at_once(tmp_path):
    # torchrun's ranks all check rank 0's run dir at start-up; a shared probe file name let one
    # rank delete another's probe ("cannot write to the run dir: No such file or directory")
    import threading

    from heads_lab.errors import ConfigError
    from heads_lab.output.files import ensure_writable

    errors = []

    def probe():
        try:
            for _ in range(300):
                ensure_writable(tmp_path, "the run dir")
        except ConfigError as err:
            errors.append(err)

    threads = [threading.Thread(target=probe) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and list(tmp_path.iterdir()) == []  # no probe left behind
    with pytest.raises(ConfigError, match="cannot write to the run dir .*a-file"):
        (tmp_path / "a-file").write_text("")
        ensure_writable(tmp_path / "a-file" / "run", "the run dir")


def test_sweep_jobs_leave_out_hydra_settings_as_a_jobs_results_do(monkeypatch):
    """A sweep run again with `hydra/launcher=local` must still recognise its finished jobs,
    whose results.json lists only task overrides (this once refused the resume)."""
    from heads_lab.sweeps.jobs import sweep_jobs

    jobs = sweep_jobs(["-m", "model.heads=1,4", "hydra/launcher=local", "+hydra.launcher.n_jobs=2",
                       "hydra.sweep.dir=/tmp/x", "seed=3"])
    assert jobs == [{"model.heads": "1", "seed": "3"}, {"model.heads": "4", "seed": "3"}]


def test_a_sweeps_workers_see_the_commands_start_time_and_it_is_removed_after(monkeypatch):
    """joblib/submitit/SLURM workers resolve the dated sweep dir from HEADS_LAB_START_TIME: it
    must be this command's start time while the command runs, and gone (or the caller's) after."""
    from heads_lab.commands.cli import _shared_start_time
    from heads_lab.config.compose import start_time

    monkeypatch.delenv("HEADS_LAB_START_TIME", raising=False)
    with _shared_start_time():
        assert os.environ["HEADS_LAB_START_TIME"] == start_time().isoformat()
    assert "HEADS_LAB_START_TIME" not in os.environ
    monkeypatch.setenv("HEADS_LAB_START_TIME", "2026-01-02T03:04:05")
    with _shared_start_time():
        pass
    assert os.environ["HEADS_LAB_START_TIME"] == "2026-01-02T03:04:05"


def test_a_job_of_a_stopping_sweep_does_not_start_and_says_so(monkeypatch, tmp_path):
    """A sweep on worker processes that got a stop signal writes its STOPPING file; a job that
    comes up after it (a worker still starting, or joblib's in-process 1-worker mode) does not
    start and leaves a stopped.json saying so; a finished job is left to be skipped; outside
    such a sweep nothing changes."""
    import json

    from omegaconf import OmegaConf

    from heads_lab.sweeps import jobs as sweeps
    from heads_lab.sweeps.signals import STOPPING, SWEEP_PID_ENV

    job_dir = tmp_path / "sweep" / "1_seed=2"
    job_dir.mkdir(parents=True)
    cfg = OmegaConf.create({"runtime": {"output_dir": str(job_dir)},
                            "sweep": {"dir": str(tmp_path / "sweep")},
                            "overrides": {"task": ["seed=2"]}, "job": {"num": 1}})
    monkeypatch.delenv(SWEEP_PID_ENV, raising=False)
    (tmp_path / "sweep" / STOPPING).write_text("SIGUSR2")
    assert not sweeps.not_started(cfg)  # not a sweep on workers: never
    monkeypatch.setenv(SWEEP_PID_ENV, str(os.getpid()))  # the sweep's own process
    assert sweeps.not_started(cfg)
    stopped = json.loads((job_dir / "stopped.json").read_text())
    assert stopped["signal"] == "SIGUSR2" and stopped["error"].startswith("not started")
    (job_dir / "stopped.json").unlink()
    (job_dir / "results.json").write_text("{}")
    assert not sweeps.not_started(cfg) and not (job_dir / "stopped.json").exists()
    (job_dir / "results.json").unlink()
    (tmp_path / "sweep" / STOPPING).unlink()
    assert not sweeps.not_started(cfg)  # not stopping


def test_a_jobs_error_line_goes_to_stderr_in_one_write_newline_included(monkeypatch):
    """A sweep's workers share stderr: a line written as text, then newline (print's two
    writes) let two stopped jobs' lines run together in CI. One write each keeps them apart."""
    from heads_lab.sweeps.signals import say_line

    class Stream:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append(text)

        def flush(self):
            self.writes.append("<flush>")

    stream = Stream()
    monkeypatch.setattr("sys.stderr", stream)
    say_line("error: job 2 (seed=3): stopped by SIGTERM at step 15")
    say_line("error: job 0 (seed=1): stopped by SIGTERM at step 6")
    assert stream.writes == ["error: job 2 (seed=3): stopped by SIGTERM at step 15\n", "<flush>",
                             "error: job 0 (seed=1): stopped by SIGTERM at step 6\n", "<flush>"]


def test_a_stopped_single_run_says_how_to_resume_it_with_its_own_dir(tmp_path, capsys):
    """A stop signal to a single run: exit 128 + the signal and one line naming the run's own dir
    (a run dir's name holds `=`: typed as printed, Hydra reads the dir back), not a placeholder."""
    import shlex
    import signal
    from types import SimpleNamespace

    from hydra.types import RunMode

    from heads_lab.sweeps.jobs import user_errors
    from heads_lab.sweeps.overrides import dir_override
    from heads_lab.training.state import Preempted

    run_dir = tmp_path / "2026-11-22" / "14-03-12_model.heads=8"
    cfg = SimpleNamespace(mode=RunMode.RUN, runtime=SimpleNamespace(output_dir=str(run_dir)))
    with pytest.raises(SystemExit) as stopped, user_errors(cfg):
        raise Preempted("SIGTERM", 12, run_dir / "checkpoints" / "step_0000012.pt")
    assert stopped.value.code == 128 + signal.SIGTERM
    (line,) = capsys.readouterr().err.splitlines()
    head = (f"error: stopped by SIGTERM at step 12; saved checkpoint "
            f"{run_dir / 'checkpoints' / 'step_0000012.pt'}; run the same command with ")
    assert line.startswith(head) and line.endswith(" to resume"), line
    (typed,) = shlex.split(line[len(head):-len(" to resume")])
    assert dir_override(typed, "hydra.run.dir") == run_dir


def test_a_launcher_whose_plugin_is_missing_names_its_extra():
    """hydra/launcher=ray where the Ray plugin is not installed (Hydra's own error, its option
    lists without ray): one line naming the extra that installs it."""
    from hydra.errors import MissingConfigException

    from heads_lab.config.compose import compose
    from heads_lab.config.messages import one_line

    with pytest.raises(MissingConfigException) as real:
        compose(["hydra/launcher=nosuch"])
    text = str(real.value).replace("nosuch", "ray").replace("\tray\n", "").replace(
        "\tray_aws\n", "")
    line = one_line(MissingConfigException(text))
    assert line.startswith("hydra/launcher=ray needs its Hydra plugin: pip install "
                           "'heads-lab[ray]' (installed now: basic, joblib, local, slurm")
    assert "\n" not in line
    # a misspelt launcher is still a misspelling
    assert "did you mean hydra/launcher=local?" in one_line(real.value.__class__(
        str(real.value).replace("nosuch", "locl")))


def test_an_output_dirs_label_keeps_whole_overrides_and_counts_the_rest(tmp_path):
    from heads_lab.output.files import output_dir

    long = ["analysis.max_sentences=40", "analysis.heatmaps=[enc:1:0,dec-enc:0:*]",
            "analysis.sentences=[0,3]", "analysis.lrp=false"]
    name = output_dir(tmp_path, "analysis", long).name
    label = name.split("_", 2)[2]
    assert label == "analysis.max_sentences=40,analysis.heatmaps=-enc-1-0,dec-enc-0---,+2"
    assert len(label) <= 84  # 80 and the count
    first = output_dir(tmp_path, "prune", ["prune.step=0.5", "prune.l0_lambda=0.1"],
                       first=("prune.l0_lambda=",))
    assert first.name.endswith("_prune.l0_lambda=0.1,prune.step=0.5")
    assert output_dir(tmp_path, "evals", []).name.endswith("_defaults")


def test_a_sweep_job_is_named_by_what_the_sweep_varies(monkeypatch):
    from heads_lab.sweeps import jobs as sweeps

    monkeypatch.setenv(sweeps.SWEEP_KEYS_ENV, '["model.heads", "seed"]')
    label = sweeps.job_label(["model=tiny", "model.heads=4", "seed=2"], 3)
    assert label == "model.heads=4,seed=2"
    assert sweeps.job_title(3, label) == "job 3 (model.heads=4,seed=2)"
    monkeypatch.setenv(sweeps.SWEEP_KEYS_ENV, "[]")  # `-m` with nothing varying
    label = sweeps.job_label(["model=tiny"], 0)
    assert label == "job 0" and sweeps.job_title(0, label) == "job 0"  # was 'job 0 (0)'


def test_a_sweeps_last_line_counts_its_jobs_against_a_file_written_at_its_start(tmp_path):
    """Finished now or earlier (skipped) is told by file times against a file the sweep wrote
    at its start (the same file clock); the report command is quoted for the shell."""
    import json

    from heads_lab.sweeps import end as sweeps

    sweep = tmp_path / "my sweep"
    (sweep / "0_a").mkdir(parents=True)
    (sweep / "0_a" / "results.json").write_text("{}")
    os.utime(sweep / "0_a" / "results.json", (1, 1))  # a job finished by an earlier sweep
    started = sweeps._start_mark(sweep)
    assert (sweep / ".sweep_started").stat().st_mtime == started
    for job, name, error in (("1_b", "results.json", ""), ("2_c", "stopped.json", "stopped by "
                             "SIGTERM at step 5"), ("3_d", "stopped.json", "not started: the sweep "
                             "was stopped by SIGTERM")):
        (sweep / job).mkdir()
        (sweep / job / name).write_text(json.dumps({"error": error}))
    before = list(sweeps.FAILED_JOBS)
    sweeps.FAILED_JOBS[:] = ["model.heads=3"]
    try:
        line = sweeps.sweep_summary(sweep, started, sweep / ".submitit")
        (sweep / "0_a" / "results.json").unlink()
        (sweep / "1_b" / "results.json").unlink()
        nothing = sweeps.sweep_summary(sweep, started)
    finally:
        sweeps.FAILED_JOBS[:] = before
    assert line == (f"sweep {sweep}: 1 finished, 1 finished earlier (skipped), 1 failed, "
                    f"1 stopped, 1 not started; its table: heads-lab report '{sweep}'; the "
                    f"launcher's logs: {sweep / '.submitit'}")
    # nothing finished: no report command to fail on
    assert nothing == f"sweep {sweep}: 1 failed, 1 stopped, 1 not started"


def test_a_prune_run_inside_a_sweep_job_does_not_make_the_sweep_dir_refused(tmp_path):
    """heads-lab prune method=gates keeps a results.json of its own in <job>/prune/...: running
    the sweep again into its dir skips its finished jobs as before, and a rerun into a single
    run's dir is refused naming the run, not the prune dir inside it."""
    import json

    from heads_lab.sweeps.jobs import refuse_finished_run_dir

    sweep = tmp_path / "sweep"
    for n, heads in enumerate((2, 4)):
        job = sweep / f"{n}_model.heads={heads}"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "config.yaml").write_text("{}")
        (job / "results.json").write_text(json.dumps({"overrides": [f"model.heads={heads}"]}))
    gates = sweep / "0_model.heads=2" / "prune" / "12-00-00_prune.method=gates"
    gates.mkdir(parents=True)
    (gates / "results.json").write_text(json.dumps({"overrides": ["prune.method=gates"]}))
    refuse_finished_run_dir(["-m", "model.heads=2,4", f"hydra.sweep.dir={sweep}"])  # no error
    with pytest.raises(Exception, match="already holds a finished run") as err:
        refuse_finished_run_dir(["-m", "model.heads=2,8", f"hydra.sweep.dir={sweep}"])
    assert "1_model.heads=4" in str(err.value) and "/prune/" not in str(err.value)
    assert ("(results.json) of other settings (it has model.heads=4; the nearest job of this "
            "sweep has model.heads=2)" in str(err.value))  # (2 and 8: as near; the first)
    with pytest.raises(Exception, match="it has trainer.threads at its default; the nearest job "
                       "of this sweep has trainer.threads=1"):
        refuse_finished_run_dir(["-m", "model.heads=2,4", "trainer.threads=1",
                                 f"hydra.sweep.dir={sweep}"])
    with pytest.raises(Exception, match="already holds a finished run") as err:
        refuse_finished_run_dir([f"hydra.run.dir='{sweep / '0_model.heads=2'}'"])
    assert str(err.value).startswith(f"{sweep / '0_model.heads=2'} already holds")


def test_a_mistyped_option_of_an_optional_group_is_suggested_with_its_plus(tmp_path):
    """+experiment=table_b: the suggestion keeps the + (experiment is not in train.yaml's
    defaults); the optional groups listed are exactly the conf/ groups outside those defaults."""
    import yaml

    from heads_lab.config.compose import config_dir
    from heads_lab.config.messages import OPTIONAL_GROUPS
    from tests.integration.test_cli import _assert_one_line_error, heads_lab

    root = config_dir()
    defaults = {next(iter(d)) for d in yaml.safe_load((root / "train.yaml").read_text())[
        "defaults"] if isinstance(d, dict)}
    groups = {p.name for p in root.iterdir() if p.is_dir()}
    assert set(OPTIONAL_GROUPS) == groups - defaults
    _assert_one_line_error(heads_lab("info", "+experiment=table_b", cwd=tmp_path),
                           "(did you mean +experiment=table_a?); choose +experiment= one of:")
    _assert_one_line_error(heads_lab("info", "model=tin", cwd=tmp_path), "(did you mean model=tiny?)")


def test_a_stop_passed_on_to_the_schedulers_handler_survives_slurms_sigterm(monkeypatch):
    """SLURM's requeue sends SIGTERM to the job's processes, the `scontrol requeue` that
    submitit's handler runs among them (once seen: CalledProcessError, died with SIGTERM): the
    handler runs with SIGTERM ignored, in this process and in the commands it starts."""
    import signal
    import subprocess
    import sys

    from heads_lab.sweeps import signals as sweep_signals

    seen = []

    def handler(signum, frame):
        code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print('alive')"
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        seen.append((signum, signal.getsignal(signal.SIGTERM), child.returncode, child.stdout))

    monkeypatch.setattr(sweep_signals, "scheduler_handler", lambda name: handler)
    before = signal.getsignal(signal.SIGTERM)
    sweep_signals.pass_on("SIGUSR2")
    assert seen == [(signal.SIGUSR2, signal.SIG_IGN, 0, "alive\n")]
    assert signal.getsignal(signal.SIGTERM) is before  # as it was, after
