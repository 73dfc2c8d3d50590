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
    from heads_lab.commands.train import evaluate_on_split  # lazy: start-up time (torch)
    from heads_lab.training.evaluate import (  # lazy: start-up time (torch)
        MULTIREF_RECORDS,
        multiref_metrics,
    )

    started = time.perf_counter()
    opened = open_run(COMMAND, args, average_last=None)  # eval.average_last decides
    if isinstance(opened, int):
        return opened
    run_dir, overrides, t = opened
    run = t.run
    out_dir = output_dir(run_dir, "evals", overrides)
    try:
        split, ppl, scores = evaluate_on_split(run, t.model, t.corpus, t.device, out_dir, "")
    except BaseException:  # (a sacrebleu test set offline): no half-written eval dir is left
        shutil.rmtree(out_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # and evals/ itself, where it was the first
            out_dir.parent.rmdir()
        raise
    name = run.eval.split
    result = {
        "run_dir": str(run_dir), "overrides": overrides, "checkpoints": t.checkpoints,
        "metrics": {f"{name}/loss": ppl["loss"], f"{name}/ppl": ppl["ppl"],
                    f"{name}/bleu": scores["bleu"], f"{name}/chrf": scores["chrf"],
                    **multiref_metrics(name, scores)},
        "sacrebleu": {k: scores[k] for k in ("bleu_signature", "chrf_signature", "bleu_detail",
                                             *MULTIREF_RECORDS) if k in scores},
        "decoding": {"split": name, "beam": run.eval.beam, "lenpen": run.eval.lenpen,
                     "sentences": len(split)},
        "precision": str(run.trainer.precision),  # computed in (auto: the run's own, where it can)
        "seconds": time.perf_counter() - started, "config": t.config,
    }
    write_json(out_dir / "eval.json", result)
    console.print(summary_table("heads-lab eval", [
        ("checkpoints", ", ".join(t.checkpoints)),
        (f"{name} PPL", f"{ppl['ppl']:.2f}"),
        (f"{name} BLEU (beam {run.eval.beam})", f"{scores['bleu']:.2f}"),
        (f"{name} chrF", f"{scores['chrf']:.2f}"),
        *([(f"{name} BLEU · chrF, all references",
            f"{scores['bleu_multiref']:.2f} · {scores['chrf_multiref']:.2f}")]
          if "bleu_multiref" in scores else []),
    ]))
    console.print(f"BLEU signature: {scores['bleu_signature']}")
    console.print(f"results: {out_dir / 'eval.json'}")
    return 0
