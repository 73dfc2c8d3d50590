"""`heads-lab prune <run dir> method=importance|gates [prune.KEY=VALUE ...]`: how many heads can go.

method=importance (Michel et al. 2019): repeatedly compute head importance (|∂L/∂ξ_h| on
prune.split, under the current mask) and prune the least important prune.step of the heads in
scope; one curve per attention type in prune.sites and one over all of them together. Every
point is evaluated on the first prune.eval_sentences of prune.eval_split with the heads removed
for real (smaller projections), so params and decoding time are measured, not assumed.

method=gates (Voita et al. 2019): Hard Concrete gates on every head, trained jointly with the
model from the run's checkpoint for prune.steps steps with λ = prune.l0_lambda times the L0
penalty; then the test-time gates decide which heads stay, those heads are removed and the model
evaluated. `-m prune.l0_lambda=0.01,0.05,0.1` runs one job per λ and prints them side by side
(heads kept per attention type vs BLEU, as Voita's table). Gates from scratch: `heads-lab train
prune.l0_lambda=...` (and `heads-lab report` shows the heads kept).

Attention whose heads cannot go one by one (grouped-query, talking heads) has its pruned heads
masked instead (outputs zeroed; prune.json's heads_pruned_by says which), params unchanged.

Everything goes to <run dir>/prune/<time>_<overrides>/: prune.json, prune.md, prune.csv, the
curve PNG (importance), results.json + hyps/refs (gates; `heads-lab report <run dir>/prune`
reads them).
"""

from __future__ import annotations

from typing import Any

from heads_lab.analysis.pruning import importance_pruning
from heads_lab.commands.command import Command, open_subject
from heads_lab.config.unread import unread_prune_settings
from heads_lab.output.files import output_dir, write_json
from heads_lab.output.tables import gate_table, show
from heads_lab.output.tracking import console

COMMAND = Command("prune", "pruning", ("prune.", "eval.", "trainer.precision="), __doc__,
                  shorthands=("method=",), sweeps=True, pretrained=True)


def main(args: list[str]) -> int:
    parsed = COMMAND.parse(args)
    if isinstance(parsed, int):
        return parsed
    spec, jobs = parsed
    rows = [prune(spec, job) for job in jobs]
    gated = [r for r in rows if r.get("method") == "gates"]
    if len(gated) > 1:
        show(gate_table(gated), width=160)
    return 0


def prune(spec, overrides: list[str]) -> dict[str, Any]:
    """One job: the subject `spec` names (a run dir, or hf:<model>) pruned by prune.method."""
    subject = open_subject(spec, "prune", overrides)
    p = subject.run.prune
    for warning in unread_prune_settings(overrides, "prune", p, pretrained=subject.pretrained):
        subject.warn(warning)
    # what tells prune dirs apart comes first
    out = output_dir(subject.home, "prune", overrides, first=("prune.method=", "prune.l0_lambda="))
    result = (importance_pruning(subject, out, console.print) if p.method == "importance"
              else subject.gates(out))
    result.update({**subject.pruning, "overrides": overrides})
    write_json(out / "prune.json", result)
    console.print(f"prune: {', '.join(str(out / f) for f in ['prune.json', *result['files']])}")
    return result
