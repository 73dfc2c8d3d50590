"""`heads-lab eval <run dir> [overrides]`: evaluate a finished or partial run again from its
checkpoints — the weights `train` evaluated (checkpoints/best.pt for an eval.checkpoint=best run;
eval.checkpoint=last for the newest step checkpoint) — e.g. with another beam, split or test
set, or with the weights of the last N step checkpoints averaged (`eval.average_last=N`, as
fairseq's average_checkpoints does). The run's
own overrides (from .hydra/overrides.yaml) rebuild its config; only evaluation settings may be
changed. Results go to <run dir>/evals/<time>_<overrides>/ and never replace earlier ones."""

from __future__ import annotations

import contextlib
import shutil
import time

from heads_lab.commands.command import Command, open_run
from heads_lab.output.files import output_dir, write_json
from heads_lab.output.tracking import console, summary_table

COMMAND = Command("eval", "evaluation", ("eval.", "trainer.precision="), __doc__)


def main(args: list[str]) -> int:
    from heads_lab.training.tasks import task_of  # lazy: start-up time (torch)

    started = time.perf_counter()
    opened = open_run(COMMAND, args, average_last=None)  # eval.average_last decides
    if isinstance(opened, int):
        return opened
    run_dir, overrides, t = opened
    run = t.run
    out_dir = output_dir(run_dir, "evals", overrides)
    try:
        scored = task_of(run).evaluate(run, t.model, t.corpus, t.device, out_dir, "")
    except BaseException:  # (a sacrebleu test set offline): no half-written eval dir is left
        shutil.rmtree(out_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # and evals/ itself, where it was the first
            out_dir.parent.rmdir()
        raise
    result = {
        "run_dir": str(run_dir), "overrides": overrides, "checkpoints": t.checkpoints,
        "metrics": scored.metrics, **scored.records,
        "precision": str(run.trainer.precision),  # computed in (auto: the run's own, where it can)
        "seconds": time.perf_counter() - started, "config": t.config,
    }
    write_json(out_dir / "eval.json", result)
    console.print(summary_table("heads-lab eval", [
        ("checkpoints", ", ".join(t.checkpoints)), *scored.rows]))
    for line in scored.notes:
        console.print(line)
    console.print(f"results: {out_dir / 'eval.json'}")
    return 0
