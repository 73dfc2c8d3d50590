"""The GPU check's dry run on CPU (scripts/gpu_check.py run --cpu): the same parts as on a GPU,
so the prepared call cannot rot between GPU windows. The CUDA tests skip here with their reason;
the bench and a two-run table_a study run tiny, and the report is written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # a minute, and timed: `make test-slow`

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "run", "--cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    return out, proc


def test_dry_run_passes_every_part_and_says_how_long_each_took(dry_run):
    out, proc = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "gpu_check.json").read_text())
    parts = {p["part"]: p for p in summary["parts"]}
    assert list(parts) == ["install", "environment", "tests", "bench", "bench_large", "profile",
                           "table_a"]
    assert all(p["status"] == "ok" and p["seconds"] >= 0 for p in parts.values()), parts
    assert summary["total_s"] <= summary["budget_s"]
    assert "| table_a | ok |" in (out / "summary.md").read_text()


def test_dry_run_skips_the_cuda_tests_with_their_reason(dry_run):
    out, _ = dry_run
    suite = ET.parse(out / "cuda_tests.xml").getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) >= 8 and int(suite.get("skipped")) == len(cases)
    reasons = {c.find("skipped").get("message") for c in cases}
    assert all("no CUDA device" in r for r in reasons), reasons


def test_dry_run_writes_the_bench_the_profile_and_the_study_report(dry_run):
    out, _ = dry_run
    profile = json.loads((out / "profile.json").read_text())
    assert profile["what"] == "train" and profile["rows"] and (out / "trace.json").is_file()
    large = json.loads((out / "bench_large.json").read_text())
    assert large["workload"]["batch"] == 8 and all("greedy" not in r for r in large["rows"])
    bench = json.loads((out / "bench.json").read_text())
    assert bench["device"] == "cpu" and {"torch.nn.Transformer h=8", "mha h=8"} <= {
        r["name"] for r in bench["rows"]}
    runs = sorted((out / "table_a").glob("*/results.json"))
    assert len(runs) == 2
    assert {json.loads(r.read_text())["config"]["model"]["heads"] for r in runs} == {1, 4}
    report = (out / "table_a" / "report.md").read_text()
    assert "h=1" in report and "h=4" in report


def test_a_used_output_folder_is_refused(tmp_path):
    (tmp_path / "old.txt").write_text("an earlier check")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "run", "--cpu",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "is not empty; give a new or empty --out folder" in proc.stderr
    assert (tmp_path / "old.txt").read_text() == "an earlier check"


def test_the_studies_part_runs_each_preset_with_its_overrides_and_reports_it(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "run", "--cpu",
                           "--out", str(out), "--parts", "studies", "--study",
                           "talking_heads_mix mix=mha,logits seed=1 hydra.launcher.n_jobs=1",
                           "--study", "heads_by_data seed=1 data.train_fraction=1.0 model.heads=2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = {p["part"]: p for p in json.loads((out / "gpu_check.json").read_text())["parts"]}
    assert list(parts) == ["install", "environment", "studies"]
    assert parts["studies"]["status"] == "ok"
    assert "talking_heads_mix: 2 runs finished (exit 0, report exit 0" in parts["studies"]["detail"]
    runs = [json.loads(p.read_text()) for p in sorted((out / "talking_heads_mix").glob("*/results.json"))]
    assert sorted(r["config"]["model"]["attention"] for r in runs) == ["mha", "talking_heads"]
    assert {r["config"]["seed"] for r in runs} == {1}
    command = (out / "logs" / "talking_heads_mix.log").read_text().splitlines()[0]
    assert command.count("hydra.launcher.n_jobs=") == 1 and "hydra.launcher.n_jobs=1" in command
    report = (out / "talking_heads_mix" / "report.md").read_text()
    assert "mixes=logits" in report
    # no study writes checkpoints, and one that evaluates its best validation's weights
    # (heads_by_data: eval.checkpoint=best) is evaluated on them all the same, kept in memory
    assert "heads_by_data: 1 runs finished (exit 0, report exit 0" in parts["studies"]["detail"]
    (hbd,) = [json.loads(p.read_text()) for p in (out / "heads_by_data").glob("*/results.json")]
    assert hbd["train"]["evaluated"] == {"checkpoint": "best", "step": hbd["train"]["best_step"]}
    best = min(hbd["train"]["valid_history"], key=lambda h: h["valid/loss"])
    assert hbd["metrics"]["valid/loss"] == best["valid/loss"]
    for log in ("talking_heads_mix", "heads_by_data"):
        command = (out / "logs" / f"{log}.log").read_text().splitlines()[0]
        assert "trainer.save_checkpoint=false" in command
    assert not list(out.rglob("*.pt"))


def test_the_studies_part_without_a_study_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "run", "--cpu",
                           "--out", str(tmp_path / "out"), "--parts", "studies"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--parts studies needs at least one --study 'PRESET [OVERRIDE ...]'" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_study_stopped_at_the_time_left_keeps_and_reports_its_finished_runs(tmp_path):
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    opts = argparse.Namespace(out=str(tmp_path / "out"), cpu=True, jobs=2, budget=540.0,
                              study=["kv_heads seed=1,2,3", "table_a"])
    check = gpu_check.Check(opts)
    calls = []

    def sh(name, cmd, timeout):  # the sweep finishes one run, then meets the time left
        calls.append(name)
        if name == "kv_heads":
            run = check.out / "kv_heads" / "0_run"
            run.mkdir(parents=True)
            (run / "results.json").write_text("{}")
            raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, 0 if name.endswith("_report") else 1)

    check.sh = sh
    status, detail = check.studies(600.0)
    assert calls == ["kv_heads", "kv_heads_report", "table_a"]
    assert "kv_heads: 1 runs finished (stopped at the time left, report exit 0" in detail
    assert "table_a: 0 runs finished (exit 1" in detail
    assert status == "failed"  # table_a's sweep failed; kv_heads alone would say "cut"
    check.opts.study = ["kv_heads"]
    (check.out / "kv_heads" / "0_run" / "results.json").unlink()
    (check.out / "kv_heads" / "0_run").rmdir()
    assert check.studies(600.0)[0] == "cut"


def test_the_last_study_on_a_gpu_runs_to_the_end_and_its_report_waits(tmp_path, monkeypatch):
    """On a GPU the last study's sweep gets all the time left, not that less its report's 30 s
    (a run cut for a report is lost; the report can be made from the files later): with no time
    left after it, its report is not made and the detail says how to make it; with 20 s left it
    is made in them; a report that meets the end is stopped, not failed. An earlier study still
    leaves 30 s for its report."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    clock = [1000.0]
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: clock[0])
    opts = argparse.Namespace(out=str(tmp_path / "out"), cpu=False, jobs=3, budget=540.0,
                              study=["kv_heads", "table_a"])
    check = gpu_check.Check(opts)
    calls = []

    def sh(name, cmd, timeout):
        calls.append((name, timeout))
        if name == "kv_heads_report":
            return subprocess.CompletedProcess(cmd, 0)
        run = check.out / name / "0_run"
        run.mkdir(parents=True)
        (run / "results.json").write_text("{}")
        clock[0] += 100.0 if name == "kv_heads" else timeout  # table_a: to the very end
        if name == "kv_heads":
            return subprocess.CompletedProcess(cmd, 0)
        raise subprocess.TimeoutExpired(cmd, timeout)

    check.sh = sh
    status, detail = check.studies(500.0)
    assert [c[0] for c in calls] == ["kv_heads", "kv_heads_report", "table_a"]
    assert calls[0][1] == 470.0  # the first study: 500 s less its report's 30
    assert calls[2][1] == 400.0  # the last: all 400 s left
    assert f"table_a: 1 runs finished (stopped at the time left, no time left for its report: " \
        f"heads-lab report {check.out / 'table_a'}" in detail
    assert status == "cut"
    # with 20 s left after it, the last study's report is made, in the time left
    shutil.rmtree(check.out / "kv_heads")
    shutil.rmtree(check.out / "table_a")
    calls.clear()

    def early(name, cmd, timeout):  # every sweep finishes its run; table_a 20 s before the end
        calls.append((name, timeout))
        if not name.endswith("_report"):
            (check.out / name / "0_run").mkdir(parents=True)
            (check.out / name / "0_run" / "results.json").write_text("{}")
            clock[0] += timeout - 20 if name == "table_a" else 1
        return subprocess.CompletedProcess(cmd, 0)

    check.sh = early
    status, detail = check.studies(500.0)
    assert [c[0] for c in calls] == ["kv_heads", "kv_heads_report", "table_a", "table_a_report"]
    assert calls[3][1] == 20.0 and "table_a: 1 runs finished (exit 0, report exit 0" in detail
    assert status == "ok"

    # a report that meets the end is stopped, not a failure: its runs are kept
    def slow_report(name, cmd, timeout):
        if name == "table_a_report":
            raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, 0)

    check.opts.study, check.sh = ["table_a"], slow_report
    status, detail = check.studies(500.0)
    assert f"report stopped at the time left: heads-lab report {check.out / 'table_a'}" in detail
    assert status == "cut"

def test_a_small_budget_still_gives_a_part_the_time_it_takes_whole(tmp_path):
    """--parts tests,studies --budget 230: the tests' 20 % share (46 s) cut them on an H100 (they
    take ~50 s); a part gets the larger of its share and its whole time, while the later parts
    can still start, and the last part gets what is left."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    parts = tuple(p for p in gpu_check.GPU_PARTS if p[0] in ("tests", "studies"))
    # not 46: its whole time (100 s), less what the studies need to start (219 - 120 = 99)
    assert gpu_check.allowance(parts, 0, 219.0, 230.0) == 99.0
    assert gpu_check.allowance(parts, 0, 400.0, 230.0) == 100.0  # its whole time
    assert gpu_check.allowance(parts, 0, 540.0, 540.0) == 108.0  # a large budget: its share
    assert gpu_check.allowance(parts, 0, 150.0, 230.0) == 30.0  # the studies must still start
    assert gpu_check.allowance(parts, 1, 159.0, 230.0) == 159.0  # the last: what is left


def test_the_peers_and_captured_profile_parts_measure_what_a_gpu_run_trains(tmp_path):
    """--parts bench_peers,profile_captured (not default parts): on a GPU every variant captured
    beside the peers at two batch sizes, and the captured step's profile; their dry run the
    peers' rows, tiny, into bench_peers_<tokens>.json, and the captured step's profile."""
    pytest.importorskip("transformers", reason="the hf extra (make test installs it)")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "run", "--cpu",
                           "--out", str(out), "--parts", "bench_peers,profile_captured"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = {p["part"]: p for p in json.loads((out / "gpu_check.json").read_text())["parts"]}
    assert parts["bench_peers"]["status"] == parts["profile_captured"]["status"] == "ok", parts
    profile = json.loads((out / "profile_captured.json").read_text())
    assert profile["variant"] == "mha h=8 captured" and (out / "trace_captured.json").is_file()
    rows = {r["name"]: r for r in json.loads((out / "bench_peers_24.json").read_text())["rows"]}
    assert {"torch.nn.Transformer h=8", "Marian h=8", "mha h=8"} <= set(rows)
    assert all(r["tokens_per_s"] > 0 for r in rows.values())
    decoded = {name: (rows[name][f"greedy{suffix}"], rows[name][f"beam4{suffix}"])  # sentences/s
               for name, suffix in (("torch.nn.Transformer h=8", "_uncached"), ("Marian h=8", ""),
                                    ("mha h=8", ""))}  # torch.nn has no key/value cache
    assert all(greedy > 0 and beam > 0 for greedy, beam in decoded.values()), decoded


def test_the_lease_plans_first_call_composes_runs_and_returns_few_files(tmp_path):
    """The lease plan's first call (--parts base_size --pack; module doc of gpu_check.py), dry:
    table_a_tatoeba_base's four runs (h = 1 and 8 × seeds 1 and 2) at once with a time horizon,
    each validated and tested, their report; what comes back is ≤ 8 files, ≤ 2 folders deep."""
    import tarfile

    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "run", "--cpu",
                           "--out", str(out), "--parts", "base_size", "--pack"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(p.relative_to(out).parts) <= 3 for p in files), files
    assert {p.name for p in files} == {"summary.md", "gpu_check.json", "pack.tar.gz"}
    parts = {p["part"]: p for p in json.loads((out / "gpu_check.json").read_text())["parts"]}
    assert parts["base_size"]["status"] == "ok", parts
    with tarfile.open(out / "pack.tar.gz") as tar:
        names = tar.getnames()
        results = [json.load(tar.extractfile(n)) for n in names if n.endswith("results.json")]
    assert "base_size/report.md" in names and "logs/base_size.log" in names
    assert sorted((r["config"]["model"]["heads"], r["config"]["seed"]) for r in results) == [
        (1, 1), (1, 2), (8, 1), (8, 2)]
    for r in results:  # the preset's schedule, the horizon a time budget, every run tested
        assert r["config"]["trainer"]["lr"] == pytest.approx(6.99e-4, rel=1e-2)
        assert r["config"]["trainer"]["max_time"] is not None and "test/bleu" in r["metrics"]
