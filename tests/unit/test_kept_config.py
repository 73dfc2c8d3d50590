"""An earlier run's .hydra/ kept through a refused start (sweeps/kept_config.py)."""

from __future__ import annotations

from types import SimpleNamespace

from heads_lab.sweeps import kept_config


def _run_dir(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step_0000004.pt").write_bytes(b"weights")
    (run / ".hydra" / "overrides.yaml").write_text("- model.heads=4\n")
    return run


def test_a_start_refused_before_it_trained_gets_the_earlier_files_back(tmp_path, monkeypatch):
    run = _run_dir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    kept_config.KeepEarlierConfig().on_run_start(SimpleNamespace(hydra=SimpleNamespace(
        run=SimpleNamespace(dir=str(run)))))
    (run / ".hydra" / "overrides.yaml").write_text("- model.heads=2\n")  # Hydra's rewrite
    assert kept_config.restore(run)
    assert (run / ".hydra" / "overrides.yaml").read_text() == "- model.heads=4\n"
    assert not kept_config.restore(run)  # kept once, put back once


def test_a_run_that_wrote_a_checkpoint_keeps_its_new_files(tmp_path, monkeypatch):
    """It trained (a resume the check allowed, stopped later by an error): its config is the
    new one. Judged by the checkpoints' listing, not by clocks."""
    run = _run_dir(tmp_path)
    kept_config.keep(run)
    (run / ".hydra" / "overrides.yaml").write_text("- trainer.max_steps=8\n")
    (run / "checkpoints" / "step_0000006.pt").write_bytes(b"more weights")
    assert not kept_config.restore(run)
    assert (run / ".hydra" / "overrides.yaml").read_text() == "- trainer.max_steps=8\n"


def test_under_torchrun_only_rank_0_keeps_the_files(tmp_path, monkeypatch):
    """The ranks share rank 0's run dir: a later rank could read the files Hydra rewrote."""
    run = _run_dir(tmp_path)
    monkeypatch.setenv("RANK", "1")
    kept_config.KeepEarlierConfig().on_run_start(SimpleNamespace(hydra=SimpleNamespace(
        run=SimpleNamespace(dir=str(run)))))
    assert run.resolve() not in kept_config.KEPT
