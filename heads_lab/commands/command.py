"""The command line shared by the commands that work on a trained run (eval, analyze, prune:
`heads-lab <verb> <run dir> [-m] [overrides]`; analyze and prune also take `hf:<model>`), what
each may change, its help, and the model it names (open_subject)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from heads_lab.config.compose import expand_sweeps
from heads_lab.errors import ConfigError
from heads_lab.hf import is_hf

# settings every command on a trained run may change: where things are and what runs them
COMMON = ("data.root=", "trainer.device=", "trainer.threads=", "trainer.max_tokens=", "paths.")


@dataclass
class Command:
    """One command on a trained run: its name, what it changes (`scope`, `allowed` prefixes of
    overrides), its usage line and help text, and shorthands (prune's method= for
    prune.method=)."""

    name: str
    scope: str
    allowed: tuple[str, ...]
    doc: str
    shorthands: tuple[str, ...] = ()
    sweeps: bool = False  # -m runs one job per comma value
    pretrained: bool = False  # also takes an `hf:` model in place of a run dir

    @property
    def usage(self) -> str:
        first = self.allowed[0].rstrip(".")
        return (f"heads-lab {self.name} <run dir> {'[-m] ' if self.sweeps else ''}[{first}.KEY=VALUE "
                "...] [data.root=DIR] [trainer.device=...]")

    def parse(self, args: list[str]) -> tuple[Path | str, list[list[str]]] | int:
        """(run dir, or an `hf:` model's name, as given; the overrides of each job), or the exit
        code of a help request. A setting outside `allowed` is a ConfigError naming it, what may
        change and the usage (for an `hf:` model its adapter checks them)."""
        multirun = any(a in ("-m", "--multirun") for a in args)
        args = [a for a in args if a not in ("-m", "--multirun")]  # -m before the dir too
        if not args or args[0] in ("-h", "--help"):
            print(f"usage: {self.usage}\n\n{self.doc}")
            return 0 if args else 2
        if multirun and not self.sweeps:
            raise ConfigError(f"heads-lab {self.name} runs no sweeps: drop -m, and run it once "
                              "per value")
        rest = args[1:]
        rest = [f"{self.allowed[0]}{a}" if a.startswith(self.shorthands) else a for a in rest]
        # an hf: model's settings are its adapter's to check (heads_lab.hf.subject)
        pretrained = self.pretrained and is_hf(args[0])
        bad = [o for o in rest if not pretrained and not o.lstrip("+").startswith(
            self.allowed + COMMON)]
        if bad:
            shown = ", ".join(a.rstrip("=") + ("*" if a.endswith(".") else "")
                              for a in self.allowed + COMMON)
            raise ConfigError(f"{bad[0]!r} cannot change here: heads-lab {self.name} changes "
                              f"{self.scope} settings only; allowed: {shown} (usage: {self.usage})")
        jobs = expand_sweeps(rest) if self.sweeps and multirun else [rest]
        if len(jobs) == 1 and len(expand_sweeps(rest)) > 1:
            raise ConfigError("comma-separated values sweep: add -m" if self.sweeps else
                              f"heads-lab {self.name} runs no sweeps, so a value with commas "
                              "goes in quotes (a head list: \"eval.head_mask='enc:0:3,enc:1:2'\");"
                              " to compare values, run it once per value")
        return (args[0] if pretrained else Path(args[0])), jobs


def open_run(command: Command, args: list[str], average_last: int | None = 1,
             computes: str | None = None):
    """A single-job command's start: (run dir, overrides, the run read back), or the exit code
    of a help request. `computes`: see heads_lab.training.runs.load."""
    from heads_lab.training.runs import load  # lazy: start-up time (yaml, torch)

    parsed = command.parse(args)
    if isinstance(parsed, int):
        return parsed
    run_dir, (overrides,) = parsed
    return run_dir, overrides, load(run_dir, overrides, average_last, computes)


def open_subject(spec: str | Path, verb: str, overrides: list[str]):
    """The model whose heads `verb` ("analyze", "prune") measures, a Subject
    (heads_lab/analysis/subject.py), by the name the command line gives: `hf:<model>` a
    pretrained Hugging Face model (heads_lab/hf/subject.py), else a run dir (a run trained here:
    heads_lab/subjects/trained.py); `overrides` are checked against what the verb may change for
    that family. A new family is its adapter file and a line here."""
    if is_hf(str(spec)):
        from heads_lab.hf.subject import open_pretrained  # lazy: start-up time (transformers)

        return open_pretrained(str(spec), verb, overrides)
    from heads_lab.subjects.trained_lm import open_run_subject  # lazy: start-up time (torch)

    return open_run_subject(Path(spec), verb, overrides)


def accounts(specs: list[str]) -> dict:
    """`info`'s table of pretrained `hf:` models side by side (heads_lab.hf.subject.accounts)."""
    from heads_lab.hf.subject import accounts as pretrained  # lazy: start-up time (transformers)

    return pretrained(specs)
