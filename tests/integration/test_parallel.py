"""Data-parallel training: torchrun with 2 CPU processes (gloo) against one process with the same
global batch (update_freq=2): the same losses within float tolerance, one run dir, rank 0 alone
writing results and checkpoints."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.integration.test_cli import heads_lab

pytestmark = pytest.mark.serial  # signals, kills and timings: alone in `make test-slow`

RUN = [*TINY, "trainer.max_steps=12", "trainer.valid_every=6", "trainer.save_every=6",
       "trainer.threads=1", "model.dropout=0.0"]


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
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


# long enough to lose a node mid-way; a checkpoint every 20 steps
LONG = [*[o for o in RUN if not o.startswith(("trainer.max_steps", "trainer.valid_every",
                                               "trainer.save_every"))],
        "trainer.max_steps=200", "trainer.valid_every=50", "trainer.save_every=20"]
TIMEOUT_S = 20  # trainer.dist_timeout_s: how long a rank waits for a frozen peer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(run_dir: Path, cwd: Path) -> list[subprocess.Popen]:
    """Two torchrun "nodes" of one process each, meeting by c10d rendezvous on 127.0.0.1."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    port = _free_port()
    return [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
         f"--node-rank={rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
         f"--rdzv-id=heads-lab-{port}", "-m", "heads_lab", "train", *LONG,
         f"trainer.dist_timeout_s={TIMEOUT_S}", f"hydra.run.dir={run_dir}"],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True) for rank in (0, 1)]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _checkpoint_after(run_dir: Path, step: int, nodes: list[subprocess.Popen]) -> int:
    deadline = time.time() + 300
    while time.time() < deadline:
        steps = [int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*.pt")]
        if steps and max(steps) > step:
            return max(steps)
        assert all(n.poll() is None for n in nodes), [n.communicate() for n in nodes]
        time.sleep(0.1)
    raise AssertionError("no checkpoint appeared")


def _lost_peer_line(node: subprocess.Popen, started: float, limit: float) -> str:
    """Node 0 stops by itself within `limit` seconds, with one heads-lab line saying why."""
    out, err = node.communicate(timeout=limit + 120)
    took = time.time() - started
    assert node.returncode != 0 and took < limit, (took, err[-3000:])
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err[-3000:]
    assert "Traceback" not in err.split("error: ", 1)[0][-2000:]  # heads-lab's own part: no trace
    return lines[0]


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_two_nodes_lose_a_peer_stop_in_time_and_resume(tmp_path):
    """Two torchrun nodes train one run: killing one node, then freezing one, stops the other
    within trainer.dist_timeout_s with one line naming the step and the checkpoint; the same
    command resumes from the newest checkpoint, and the finished run matches one process with
    the same global batch."""
    single = heads_lab("train", *LONG, "trainer.update_freq=2", f"hydra.run.dir={tmp_path / 'one'}",
                       cwd=tmp_path, timeout=600)
    assert single.returncode == 0, single.stderr + single.stdout
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    run_dir = tmp_path / "run"

    nodes = _nodes(run_dir, tmp_path)  # 1: node 1 is killed (agent and worker: a dead machine)
    first = _checkpoint_after(run_dir, 0, nodes)
    for pid in [*_children(nodes[1].pid), nodes[1].pid]:
        os.kill(pid, signal.SIGKILL)
    nodes[1].wait()
    line = _lost_peer_line(nodes[0], time.time(), TIMEOUT_S + 30)
    assert "data-parallel training stopped at step" in line and "(rank 0 of 2)" in line, line
    assert "a peer was lost" in line and "checkpoints/step_" in line and "resume" in line, line
    assert not (run_dir / "results.json").exists()

    nodes = _nodes(run_dir, tmp_path)  # 2: the same command resumes; node 1 then freezes
    second = _checkpoint_after(run_dir, first, nodes)
    workers = _children(nodes[1].pid)
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)  # alive, holding its sockets open, answering nothing
    frozen = time.time()
    line = _lost_peer_line(nodes[0], frozen, TIMEOUT_S + 60)
    assert time.time() - frozen >= TIMEOUT_S - 1  # it waited for the peer as long as told
    assert "data-parallel training stopped at step" in line, line
    for pid in [*workers, nodes[1].pid]:
        os.kill(pid, signal.SIGKILL)
    nodes[1].wait()

    nodes = _nodes(run_dir, tmp_path)  # 3: resumed again, to the end
    for node in nodes:
        out, err = node.communicate(timeout=600)
        assert node.returncode == 0, err[-3000:]
    ddp = json.loads((run_dir / "results.json").read_text())
    assert ddp["train"]["resumed_from"] >= second > first
    assert ddp["train"]["data_parallel"] == 2 and ddp["train"]["steps"] == 200
    assert ddp["train"]["tokens"] == one["train"]["tokens"]
    for a, b in zip(ddp["train"]["valid_history"], one["train"]["valid_history"], strict=True):
        assert a["step"] == b["step"]
        assert a["valid/loss"] == pytest.approx(b["valid/loss"], rel=1e-4)
    assert ddp["metrics"]["train/loss"] == pytest.approx(one["metrics"]["train/loss"], rel=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["one", "run"]  # one run dir
