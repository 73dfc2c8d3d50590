"""The induction-head control through the whole command (docs/analysis.md): a two-layer
attention-only language model of heads-lab's own (task=lm, data=repeats) whose layer-0 head 0 is
a previous-token head and whose layer-1 head 0 reads, with its keys, that head's output (the
previous token) against its query's own token — an induction circuit, set by hand in the run's
checkpoint — copies the second copy of repeated random tokens; `heads-lab analyze` finds the
layer-1 head (induction score > 0.5) and no other head scored so, a one-layer model scores
< 0.1 everywhere, and masking the induction head (`heads-lab eval eval.head_mask=lm:1:0`)
brings copy accuracy down to the one-layer model's.

Why planted: training (the settings docs/analysis.md lists) did not grow an induction head
within minutes on a CPU; with absolute positions a two-layer model learned to copy through a
duplicate-token head and positional hops instead.

The circuit, on d_model = 4·V (V the vocabulary): token t's embedding is +a on dim t and −a on
dim V + t (so every token's vector has mean 0 and one norm: the pre-norm LayerNorms scale it,
nothing more); there are no absolute positions (model.positions=none) and layer 0's head 0 has
relative-position biases of +20 at offset −1 and −20 elsewhere, its queries and keys zero, so
it attends to the previous token exactly; its values read the token dims and its output writes
them to dims 2V + t (and −(3V + t)). Layer 1's head 0 queries the token dims and keys the
previous-token dims: q_i · k_j is large where the token before j is i's own — the token after an
earlier copy — and its output writes that token's dims, larger than the token the query holds,
so the tied output layer predicts it. Every other weight is 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.integration.test_cli import _results, heads_lab

V = 64  # data=repeats' vocabulary
COMMON = ["task=lm", "data=repeats", "data.train_size=200", "data.valid_size=40",
          "data.test_size=100", "model=tiny", "model.d_ff=0", "model.dropout=0", "logger=none",
          "trainer.threads=1", "trainer.max_tokens=2048"]
PLANTED = [*COMMON, "model.layers=2", f"model.d_model={4 * V}", "model.heads=2",
           f"model.head_dim={2 * V}", "model.positions=none", "model.relative_positions=2",
           "trainer.max_steps=1", "trainer.valid_every=1"]
ANALYSE = ["analysis.split=valid", "analysis.max_sentences=20", "analysis.role_length=16",
           "analysis.role_sequences=10"]


def _plant(state: dict[str, torch.Tensor]) -> None:
    """The circuit of the module doc, written into a checkpoint's model weights."""
    for value in state.values():
        if value.is_floating_point():
            value.zero_()
    d, a = 2 * V, 1.0
    emb = state["embed.weight"]  # [V, 4V]; scaled by √d_model in the forward
    for t in range(4, V):
        emb[t, t], emb[t, V + t] = a, -a
    state["norm.weight"].fill_(1.0)  # every LayerNorm an identity up to its scale
    for i in range(2):  # (attention-only layers: one norm each)
        state[f"layers.{i}.res_self.norm.weight"].fill_(1.0)
    # layer 0, head 0: the previous token (relative biases), its value the token dims
    prev = "layers.0.self_attn"
    bias = state[f"{prev}.position_bias"]  # [heads, 5]: offsets −2 … +2 (key − query)
    bias[0] = torch.tensor([-20.0, 20.0, -20.0, -20.0, -20.0])
    w = state[f"{prev}.in_proj.weight"]  # [3 · heads · d, 4V]: q, k, v rows
    v0 = 2 * 2 * d  # the value rows of head 0
    for t in range(V):
        w[v0 + t, t] = 1.0
    out = state[f"{prev}.out_proj.weight"]  # [4V, heads · d]
    for t in range(V):
        out[2 * V + t, t], out[3 * V + t, t] = 4.0, -4.0
    # layer 1, head 0: queries the token, keys the previous token, values the token
    ind = "layers.1.self_attn"
    w = state[f"{ind}.in_proj.weight"]
    k0, v0 = 2 * d, 4 * d
    for t in range(V):
        w[t, t] = 3.0  # query: its own token
        w[k0 + t, 2 * V + t] = 3.0  # key: the token before it (layer 0's output)
        w[v0 + t, t] = 1.0  # value: its token
    out = state[f"{ind}.out_proj.weight"]
    for t in range(V):
        out[t, t], out[V + t, t] = 8.0, -8.0


def _planted_run(tmp_path: Path) -> Path:
    from heads_lab.training import checkpoint

    proc = heads_lab("train", *PLANTED, f"hydra.run.dir={tmp_path / 'planted'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    run = tmp_path / "planted"
    for path in [p for _, p in checkpoint.step_files(run)] + [
            checkpoint.checkpoint_dir(run) / "best.pt"]:
        if path.is_file():
            state = checkpoint.load(path)
            _plant(state["model"])
            checkpoint.save(path, state)
    return run


@pytest.mark.slow  # three trainings, an analysis and three evaluations: `make test-slow`
def test_a_planted_induction_head_copies_is_found_and_masking_it_stops_the_copying(tmp_path):
    run = _planted_run(tmp_path)
    one = tmp_path / "one"
    proc = heads_lab("train", *COMMON, "model.layers=1", "trainer.max_steps=300",
                     "trainer.valid_every=300", f"hydra.run.dir={one}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout

    def copy(run_dir: Path, *extra: str) -> float:
        proc = heads_lab("eval", str(run_dir), *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        found = sorted((run_dir / "evals").glob("*/eval.json"))[-1]
        return json.loads(found.read_text())["metrics"]["test/copy_accuracy"]

    def induction(run_dir: Path) -> dict[tuple[int, int], dict]:
        proc = heads_lab("analyze", str(run_dir), *ANALYSE, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        (found,) = (run_dir / "analysis").glob("*/analysis.json")
        return {(h["layer"], h["head"]): h for h in json.loads(found.read_text())["heads"]}

    planted, single = induction(run), induction(one)
    assert planted[1, 0]["induction"] > 0.5 and planted[0, 0]["previous_token"] > 0.9
    assert max(h["induction"] for key, h in planted.items() if key != (1, 0)) < 0.1
    assert max(h["induction"] for h in single.values()) < 0.1
    whole, masked, alone = copy(run), copy(run, "eval.head_mask=lm:1:0"), copy(one)
    # (not 1: a token of the repeated part that the random prefix also holds has two earlier
    # copies, and the head splits its attention between the tokens after each)
    assert whole > 0.8 and alone < 0.1
    assert masked <= alone + 0.02  # the copying is the induction head's
    assert _results(tmp_path)  # (the runs wrote their results)
