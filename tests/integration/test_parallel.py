"""Data-parallel training: torchrun with 2 CPU processes (gloo) against one process with the same
global batch (update_freq=2): the same losses within float tolerance, one run dir, rank 0 alone
writing results and checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import TINY
from tests.integration.test_cli import heads_lab

RUN = [*TINY, "trainer.max_steps=12", "trainer.valid_every=6", "trainer.save_every=6",
       "trainer.threads=1", "model.dropout=0.0"]


def test_two_cpu_processes_match_one_process_with_the_same_global_batch(tmp_path):
    single = heads_lab("train", *RUN, "trainer.update_freq=2", f"hydra.run.dir={tmp_path / 'one'}",
                       cwd=tmp_path)
    assert single.returncode == 0, single.stderr + single.stdout

    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    for _ in range(2):  # a port taken between torchrun's pick and its bind: try again
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
             "-m", "heads_lab", "train", *RUN, "trainer.update_freq=1"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode == 0 or not any(s in proc.stderr for s in (
                "Address already in use", "EADDRINUSE", "RendezvousConnectionError")):
            break
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    found = sorted((tmp_path / "outputs").rglob("results.json"))
    assert len(found) == 1, found  # both ranks wrote into one run dir, rank 0 the results
    ddp = json.loads(found[0].read_text())
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    assert ddp["train"]["data_parallel"] == 2 and one["train"]["data_parallel"] == 1
    assert ddp["train"]["tokens"] == one["train"]["tokens"]  # the same global batches
    for a, b in zip(ddp["train"]["valid_history"], one["train"]["valid_history"], strict=True):
        assert a["step"] == b["step"]
        assert a["valid/loss"] == pytest.approx(b["valid/loss"], rel=1e-4)
    assert ddp["metrics"]["train/loss"] == pytest.approx(one["metrics"]["train/loss"], rel=1e-4)
    steps = sorted(p.name for p in (found[0].parent / "checkpoints").glob("step_*.pt"))
    assert steps == ["step_0000006.pt", "step_0000012.pt"]
