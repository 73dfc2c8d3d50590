"""Runs that survive, as a user meets them: SIGKILL mid-training and SIGTERM, each followed by
running the same command again, end with exactly the numbers of an uninterrupted run; `heads-lab
eval` re-evaluates from the checkpoints, with averaging."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from heads_lab.training import checkpoint
from tests.conftest import TINY
from tests.integration.test_cli import EXE, heads_lab

pytestmark = pytest.mark.serial  # signals, kills and timings: alone in `make test-slow`

# Long enough to be killed mid-way; checkpoints every 4 steps, dropout on (RNG must resume).
RUN = [*TINY, "trainer.max_steps=40", "trainer.save_every=4", "trainer.keep_last=3",
       "trainer.valid_every=10", "model.dropout=0.2"]
# Numbers that must match exactly (timings, speeds and memory may not).
EXACT = ("train/loss", "valid/loss", "valid/ppl", "test/loss", "test/bleu", "test/chrf")


def _start(run_dir: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([EXE, "train", *RUN, f"hydra.run.dir={run_dir}"], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ}, start_new_session=True)


def _wait_for_checkpoint(run_dir: Path, proc: subprocess.Popen, after: int = 0) -> int:
    """Block until a step checkpoint newer than `after` exists; its step."""
    deadline = time.time() + 240
    while time.time() < deadline:
        steps = [int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*.pt")]
        if steps and max(steps) > after:
            return max(steps)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    cwd = tmp_path_factory.mktemp("whole")
    proc = heads_lab("train", *RUN, f"hydra.run.dir={cwd / 'run'}", cwd=cwd)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads((cwd / "run" / "results.json").read_text())


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_sigkill_then_sigterm_then_resume_equals_an_uninterrupted_run(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, tmp_path)
    killed_after = _wait_for_checkpoint(run_dir, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # no chance to clean up
    proc.wait()
    assert not (run_dir / "results.json").exists()

    proc = _start(run_dir, tmp_path)  # the same command again: resumes, then gets SIGTERM
    _wait_for_checkpoint(run_dir, proc, after=killed_after)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    if proc.returncode != 0:  # else it finished before the signal landed: still must be exact
        assert proc.returncode == 143, err  # 128 + SIGTERM: stopped, not finished
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and "stopped by SIGTERM at step" in lines[0], err
        assert "Traceback" not in err
        assert not (run_dir / "results.json").exists()
        proc = _start(run_dir, tmp_path)
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err + out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["train"]["resumed_from"] is not None
    # its summary says which times count every process and which this one only
    assert "time train (every process) / eval / total (this process)" in " ".join(out.split())
    assert results["train"]["steps"] == uninterrupted["train"]["steps"] == 40
    for key in EXACT:
        assert results["metrics"][key] == uninterrupted["metrics"][key], key
    assert results["train"]["valid_history"] == uninterrupted["train"]["valid_history"]
    assert len(list((run_dir / "checkpoints").glob("step_*.pt"))) == 3  # keep_last
    assert (run_dir / "checkpoints" / "best.pt").is_file()


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_a_stopped_runs_progress_bar_ends_where_the_signal_stopped_it(tmp_path):
    """The bar's last line, on a terminal (piped output has the plain lines alone), shows the
    step SIGTERM stopped training at (it showed the last logged step, here 0, as the signal ends
    training between two logged steps)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([EXE, "train", *RUN, f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TTY_COMPATIBLE": "1", "COLUMNS": "200"},
                            start_new_session=True)  # rich draws its bar as on a terminal
    _wait_for_checkpoint(run_dir, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, err
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out + err)  # the terminal's codes out
    (line,) = [line for line in shown.splitlines() if line.startswith("error: ")]
    stopped_at = int(line.split("at step ", 1)[1].split(";", 1)[0])
    assert stopped_at > 0  # (typically 5 or 6: the first checkpoint is at 4, the first log at 10)
    bars = [chunk.split("\r")[-1] for chunk in shown.split("\n")]
    bars = [bar for bar in bars if bar.startswith("train ")]
    assert bars and f" step {stopped_at}/40 " in bars[-1], (bars, stopped_at)


def test_eval_reevaluates_and_averages_without_touching_the_run(uninterrupted, tmp_path):
    run_dir = Path(uninterrupted["run_dir"])
    before = (run_dir / "results.json").read_bytes()
    proc = heads_lab("eval", str(run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (first,) = sorted((run_dir / "evals").glob("*/eval.json"))
    again = json.loads(first.read_text())
    for key in ("test/bleu", "test/chrf", "test/loss"):  # the final checkpoint, as trained
        assert again["metrics"][key] == uninterrupted["metrics"][key], key

    time.sleep(1.1)  # a new eval dir per second
    proc = heads_lab("eval", str(run_dir), "eval.average_last=3", "eval.beam=1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    averaged = json.loads(sorted((run_dir / "evals").glob("*average_last=3*/eval.json"))[0]
                          .read_text())
    assert averaged["checkpoints"] == ["step_0000040.pt", "step_0000036.pt", "step_0000032.pt"]
    assert averaged["decoding"]["beam"] == 1
    assert averaged["metrics"]["test/loss"] != uninterrupted["metrics"]["test/loss"]
    assert (run_dir / "results.json").read_bytes() == before


def test_a_run_killed_during_its_evaluation_is_evaluated_again_with_its_trainings_peak_memory(
        uninterrupted, tmp_path):
    """Killed after its last checkpoint, while decoding the test set: the same command again
    trains no more and evaluates; the numbers are the uninterrupted run's, and its peak memory is
    the training processes' (kept in the checkpoint), not only the evaluation's."""
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted["run_dir"], run_dir)
    (run_dir / "results.json").unlink()  # as if killed before writing it
    last = max((run_dir / "checkpoints").glob("step_*.pt"))
    state = checkpoint.load(last)
    assert state["progress"]["peak_mem_mb"] > 0  # the training process's, as saved
    state["progress"]["peak_mem_mb"] = 1e6  # far above any process here: only the record has it
    checkpoint.save(last, state)
    proc = heads_lab("train", *RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert results["train"]["resumed_from"] == results["train"]["steps"] == 40
    for key in EXACT:
        assert results["metrics"][key] == uninterrupted["metrics"][key], key
    assert results["metrics"]["cost/peak_mem_mb"] == 1e6


def _assert_group_gone(pgid: int) -> None:
    """Every process of the stopped sweep's group exits within 10 s."""
    for _ in range(200):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError("processes of the stopped sweep are still running")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # all gone, as they should be
        pass


# Loaded by every process of the sweep (PYTHONPATH): once the file SLOW exists, job 1's
# checkpoints take 3 s to land, so job 0 finishes its stop well before job 1 does.
SLOW_SAVE = """
import os, time
_replace = os.replace
def _slow_replace(src, dst, *args, **kwargs):
    if str(src).endswith(".pt.tmp") and "/1_" in str(src) and os.path.exists({slow!r}):
        time.sleep(3)
    return _replace(src, dst, *args, **kwargs)
os.replace = _slow_replace
"""


# (SIGTERM to the sweep's process with the launcher named on the command line is the first
# case's path but for where the launcher was chosen, which the other two cases cover: left out
# to keep CI within its time)
@pytest.mark.parametrize("chosen_by,stop,n_jobs", [("a config's defaults", "SIGTERM", 2),
                                                    ("command line", "SIGINT", 4),
                                                    ("command line", "SIGTERM to one worker", 2)])
@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_a_stop_signal_to_a_local_launcher_sweep_stops_its_workers_and_the_sweep_resumes(
        chosen_by, stop, n_jobs, tmp_path, request):
    """`kill <pid>` of a sweep whose jobs run in joblib's workers (hydra/launcher=local), as a
    batch system or a user stops it, Ctrl-C (SIGINT to the whole process group, as a terminal
    sends it; here with a worker that has no job), or SIGTERM to one worker: every running job
    saves its checkpoint and stops (they used to be orphaned and train on; later, the first job
    to stop made joblib kill the other workers, one in the middle of its save), no further job
    starts, the command exits 128 + the signal saying how to resume, and the same command then
    resumes the stopped jobs and runs the rest. The launcher may be chosen on the command line
    or by a config (a user's experiment preset)."""
    from heads_lab.sweeps.signals import catches, children

    sweep = tmp_path / "sweep"
    if chosen_by == "command line":
        launcher = ["hydra/launcher=local"]
    else:
        (tmp_path / "conf" / "experiment").mkdir(parents=True)
        (tmp_path / "conf" / "experiment" / "on_workers.yaml").write_text(
            "# @package _global_\ndefaults:\n  - override /hydra/launcher: local\n")
        launcher = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "+experiment=on_workers"]
    args = [EXE, "train", "-m", *[o for o in TINY if not o.startswith("trainer.max_steps")],
            "trainer.max_steps=80", "trainer.save_every=4", *launcher,
            f"hydra.launcher.n_jobs={n_jobs}", "trainer.threads=1", "seed=1,2,3",
            f"hydra.sweep.dir={sweep}"]
    running = min(n_jobs, 3)
    slow = tmp_path / "slow"
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SLOW_SAVE.format(slow=str(slow)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    request.addfinalizer(lambda: _kill_group(proc.pid))  # a failed check leaves nothing running
    deadline = time.time() + 240
    while len({p.parent.parent for p in sweep.glob("*/checkpoints/step_*.pt")}) < running:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)  # the running jobs are inside their training loops
    if "worker" not in stop:  # (there the slow job's stop, 3 s before the others are told,
        slow.touch()         # would let the fast job run to its end first)
    workers = [p for p in children(proc.pid) if catches(p, signal.SIGTERM)]
    assert len(workers) == running, workers  # the workers in a job; not the idle one
    if stop == "SIGTERM":
        proc.send_signal(signal.SIGTERM)  # to the sweep's own process only, not its group
    elif stop == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals every process
    else:
        os.kill(workers[0], signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    name = stop.split()[0]
    assert proc.returncode == 128 + signal.Signals[name], err + out
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: sweep stopped by {name}: run the "
                                                   f"same command with hydra.sweep.dir={sweep} "
                                                   "to resume"), err
    jobs = [line for line in err.splitlines() if " at step " in line]
    assert len(jobs) == running and all(
        line.startswith("error: job ") and "hydra.run.dir" not in line and
        f"run the same sweep command with hydra.sweep.dir={sweep}" in line for line in jobs), err
    _assert_group_gone(proc.pid)  # nothing runs on (workers, their resource trackers)
    stopped = set()
    for line in jobs:  # each stop's checkpoint was written whole, the slow one too
        step, saved = re.search(r" at step (\d+); saved checkpoint (\S+);", line).groups()
        assert Path(saved).is_file() and Path(saved).name == f"step_{int(step):07d}.pt", line
        stopped.add(Path(saved).parent.parent)
        assert json.loads((Path(saved).parent.parent / "stopped.json").read_text())["signal"] \
            == re.search(r"stopped by (\w+)", line).group(1)
    assert not list(sweep.glob("**/*.tmp")), "a checkpoint write was cut short"
    assert not (sweep / ".stopping").exists()
    for d in set(sweep.glob("[0-9]*_*")) - stopped:  # finished before the stop (the fast job
        if not (d / "results.json").exists():       # may), or never started (Hydra made its dir)
            assert not (d / "checkpoints").exists()
            assert "not started" in json.loads((d / "stopped.json").read_text())["error"]
    slow.unlink(missing_ok=True)

    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    results = {p.parent: json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))}
    assert [r["train"]["steps"] for r in results.values()] == [80, 80, 80]
    assert {d for d, r in results.items() if r["train"]["resumed_from"] is not None} == stopped
    assert not list(sweep.glob("*/stopped.json"))  # each job that ran again removed its own


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_a_stop_signal_to_a_submitit_local_sweep_stops_its_jobs_and_the_sweep_resumes(
        stop, tmp_path, request):
    """hydra/launcher=submitit_local runs each job as a process of its own: SIGTERM to the
    sweep's process (it used to leave the jobs training on, orphaned) or Ctrl-C (SIGINT to the
    process group: it used to end in submitit's traceback) stops every job at a checkpoint, the
    command exits 128 + the signal saying how to resume, and the same command resumes them."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="the submitit launcher: pip install 'heads-lab[launchers]'")
    sweep = tmp_path / "sweep"
    args = [EXE, "train", "-m", *[o for o in TINY if not o.startswith("trainer.max_steps")],
            "trainer.max_steps=400", "trainer.save_every=4", "hydra/launcher=submitit_local",
            "trainer.threads=1", "seed=1,2", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    request.addfinalizer(lambda: _kill_group(proc.pid))
    deadline = time.time() + 240
    while len({p.parent.parent for p in sweep.glob("*/checkpoints/step_*.pt")}) < 2:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    if stop == "SIGTERM":
        proc.send_signal(signal.SIGTERM)  # the sweep's own process only
    else:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals every process
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.Signals[stop], err + out
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: sweep stopped by {stop}: run the "
                                                   f"same command with hydra.sweep.dir={sweep}")
    _assert_group_gone(proc.pid)  # nothing of the sweep trains on
    jobs = sorted(sweep.glob("[0-9]*_*"))
    assert len(jobs) == 2 and not list(sweep.glob("*/results.json"))
    assert all("stopped by" in json.loads((d / "stopped.json").read_text())["error"] for d in jobs)
    assert f"sweep {sweep}: 2 stopped;" in out

    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    results = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))]
    assert [r["train"]["steps"] for r in results] == [400, 400]
    assert all(r["train"]["resumed_from"] is not None for r in results)



@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_two_trainings_into_one_run_dir_the_second_stops_and_a_killed_runs_lock_does_not_stay(
        uninterrupted, tmp_path):
    """Two real processes, one hydra.run.dir: the second stops at once in one line (exit 2),
    having written nothing — the first run's .hydra/ keeps its settings and it finishes with its
    own numbers; a run killed with SIGKILL leaves no lock behind: the same command resumes."""
    run_dir = tmp_path / "run"
    first = _start(run_dir, tmp_path)
    _wait_for_checkpoint(run_dir, first)
    second = heads_lab("train", *RUN, "model.heads=1", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert second.returncode == 2, second.stderr + second.stdout
    lines = [x for x in second.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "is in use by another " \
        f"heads-lab (pid {first.pid} " in lines[0] and "choose another hydra.run.dir" in lines[0]
    assert "model.heads=1" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    os.killpg(first.pid, signal.SIGKILL)  # no chance to clean up: the kernel drops its lock
    first.wait()
    proc = heads_lab("train", *RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert results["train"]["resumed_from"] is not None
    for key in EXACT:
        assert results["metrics"][key] == uninterrupted["metrics"][key], key


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_resume_never_over_a_run_that_trained_moves_it_aside_and_says_so(tmp_path):
    """trainer.resume=never where another setting's run stopped: that run moves whole (its
    checkpoints, its .hydra/ and log) to <dir>.prev-<time>, a line says where, and the new run
    starts in an empty dir: no step checkpoint of the old run beside the new one's."""
    run_dir = tmp_path / "run"
    proc = _start(run_dir, tmp_path)
    old_step = _wait_for_checkpoint(run_dir, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    old = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()}
    new = heads_lab("train", *RUN, "model.heads=2", "trainer.max_steps=8", "trainer.resume=never",
                    f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert new.returncode == 0, new.stderr + new.stdout
    (aside,) = tmp_path.glob("run.prev-*")
    assert f"trainer.resume=never: the run that was in {run_dir}" in new.stderr
    assert str(aside) in new.stderr
    assert {p.name: p.read_bytes() for p in (aside / "checkpoints").iterdir()} == old
    assert "model.heads=2" not in (aside / ".hydra" / "overrides.yaml").read_text()
    steps = {int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*.pt")}
    assert max(steps) == 8 and old_step not in steps - {4, 8}
    for path in (run_dir / "checkpoints").glob("step_*.pt"):
        assert checkpoint.load(path)["config"]["model"]["heads"] == 2


def _truncate(path: Path) -> None:
    """A checkpoint cut short, as a full disk leaves it: a file of its own (best.pt, a hard link
    to a step checkpoint, keeps its bytes)."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[:1000])


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_a_corrupt_newest_checkpoint_is_set_aside_on_resume_and_eval_falls_back_to_best(
        uninterrupted, tmp_path):
    """The newest step checkpoint truncated: the resumed run sets it aside (never rotating out
    the valid one it resumed from) and ends with the uninterrupted run's numbers; `eval` of a run
    whose every step checkpoint is truncated reads best.pt and says so, not 'no weights'."""
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted["run_dir"], run_dir)
    (run_dir / "results.json").unlink()
    steps = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    newest = steps[-1]
    _truncate(newest)
    proc = heads_lab("train", *RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert (run_dir / "checkpoints" / (newest.name + ".corrupt")).is_file()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["train"]["resumed_from"] == int(steps[-2].stem.split("_")[1])
    for key in EXACT:
        assert results["metrics"][key] == uninterrupted["metrics"][key], key
    for path in (run_dir / "checkpoints").glob("step_*.pt"):
        checkpoint.load(path)  # every step checkpoint left in the rotation is valid
        _truncate(path)
    ev = heads_lab("eval", str(run_dir), cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr + ev.stdout
    assert "reading checkpoints/best.pt, the best validation's weights (step" in ev.stderr + \
        ev.stdout


# Loaded by the run's process (PYTHONPATH): its test set's translation marks that it started,
# then waits a minute before translating.
SLOW_EVAL = """
import pathlib, time
import heads_lab.training.evaluate as evaluate
_translate = evaluate.translate
def _slow_translate(*args, **kwargs):
    pathlib.Path({started!r}).touch()
    time.sleep(60)
    return _translate(*args, **kwargs)
evaluate.translate = _slow_translate
"""


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_ctrl_c_during_the_final_evaluation_says_how_to_resume(uninterrupted, tmp_path):
    """Interrupted (SIGINT) while the test set is decoded: one line naming the command that
    resumes it, exit 130; that command evaluates it (its training had ended)."""
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted["run_dir"], run_dir)
    (run_dir / "results.json").unlink()
    # resumes at its last step: straight to the evaluation, which here says when it starts
    # and then waits, so the signal lands in it (a tiny model decodes its test set in no time)
    hook, started = tmp_path / "hook", tmp_path / "evaluating"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_EVAL.format(started=str(started)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([EXE, "train", *RUN, f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True,  # Ctrl-C as a terminal's user sends it,
                            # whatever started the tests (a shell's background job ignores it)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not started.exists() and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"error: interrupted; run the same command with hydra.run.dir={run_dir} to resume" \
        in err
    assert not (run_dir / "results.json").exists()
    again = heads_lab("train", *RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr + again.stdout
