"""Benchmarks: `heads-lab bench` (the speed table and its targets), `heads-lab bench --lm` (language
models' training and generation beside a nanoGPT-style model and Hugging Face's GPT-2 and Llama)
and `heads-lab bench --depth` (Liu et al.'s shallow multi-head vs deep single-head cost curves).
They print tables and write JSON (and a PNG); nothing in `make test` asserts a speed."""

from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from heads_lab.config.schemas import ModelConfig, RunConfig
from heads_lab.config.validate import validate
from heads_lab.errors import ConfigError
from heads_lab.output.files import write_json

USAGE = ("heads-lab bench [--quick] [--lm] [--depth] [--profile {train,greedy,beam}] [--steps N] "
         "[--device D] [--precision P] [--batch B] [--length L] [--new-tokens N] [--compile] "
         "[--peers] [--no-decode] "
         "[--json FILE] "
         "[--png FILE] [--trace FILE] [model.KEY=VALUE ...]")


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="heads-lab bench", usage=USAGE, description=__doc__)
    parser.add_argument("overrides", nargs="*", help="model settings, e.g. model.d_model=512")
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per variant (default 10; fewer make a noisy median) "
                             "or, with --depth, per point (default 5)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer variants, no peak memory")
    parser.add_argument("--depth", action="store_true", help="Liu et al. shallow vs deep curves")
    parser.add_argument("--lm", action="store_true",
                        help="language models (task=lm: d_model 256, 4 layers, d_ff 1024, vocab "
                        "4000): training and greedy generation tokens/s beside a nanoGPT-style "
                        "plain PyTorch model (and with --peers Hugging Face's GPT-2 and Llama)")
    parser.add_argument("--device", default="auto", help="auto (a GPU if there is one), cpu, cuda, cuda:N")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                        help="the table's main precision: auto is fp32 on CPU (with bf16 rows "
                        "beside), bf16 on a GPU (with an fp32 row beside); --lm: every row in "
                        "it, none beside")
    parser.add_argument("--batch", type=int, default=None,
                        help="pairs per step (64; larger on a GPU); --lm: blocks per step (8)")
    parser.add_argument("--length", type=int, default=None,
                        help="tokens per sentence (20); --lm: tokens per block (256)")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="--lm: greedy decoding steps per generated row (64)")
    parser.add_argument("--compile", action="store_true",
                        help="add mha h=8 with its training forward compiled (trainer.compile) and "
                        "with its whole step captured (trainer.capture)")
    parser.add_argument("--peers", action="store_true",
                        help="Hugging Face's Marian at h=8 too (the hf extra), and with --compile "
                        "torch.nn.Transformer and Marian through torch.compile; with --lm, "
                        "Hugging Face's GPT-2 and Llama")
    parser.add_argument("--capture-all", action="store_true",
                        help="with --compile: every variant's quick rows captured too (mha h=1, "
                        "8, 32 and kv_heads=1, talking heads h=8 and 32), as GPU runs train")
    parser.add_argument("--no-decode", action="store_true",
                        help="training only: no decoding columns (e.g. at a paper-sized batch)")
    parser.add_argument("--profile", choices=("train", "greedy", "beam"),
                        help="profile a training step or decoding (torch.profiler) of one model "
                             "(model.* overrides; default the bench's: d_model 256, 3+3 layers, "
                             "d_ff 1024, h=8): its Chrome trace (--trace) and a table of the "
                             "operators with the most self time")
    parser.add_argument("--capture", action="store_true",
                        help="--profile train: the captured step (trainer.capture), as a GPU run "
                        "trains by default")
    parser.add_argument("--trace", default="bench_trace.json", help="--profile: the trace file")
    parser.add_argument("--rows", type=int, default=25, help="--profile: operators in the table")
    parser.add_argument("--json", default="bench.json", help="where to write the numbers")
    parser.add_argument("--png", default="bench_depth.png", help="--depth: the plot")
    opts = parser.parse_intermixed_args(args)  # model.KEY=VALUE anywhere among the flags
    _check_options(opts)
    model = _model(opts.overrides, lm=opts.lm)
    _check_counts_and_files(opts)
    if opts.steps is None:  # measured steps: 5 per depth point, else 10 per variant
        opts.steps = 5 if opts.depth else 10
    # lazy: start-up time (rich), kept out of the bench's peak-RSS child processes
    from heads_lab.output.tables import wide_console

    console = wide_console(150)
    result = _measure(opts, model, console)
    write_json(Path(opts.json), result)
    console.print(f"numbers: {opts.json}")
    return 0


def _measure(opts, model, console) -> dict:
    """The table the flags ask for, printed; its numbers."""
    if opts.profile:
        from heads_lab.bench import profile  # lazy: start-up time (torch)

        work, precision = _workload(opts)
        result = profile.run(model, work, precision, opts.profile, steps=min(opts.steps, 5),
                             warmup=opts.warmup, rows=opts.rows, trace=Path(opts.trace),
                             capture=opts.capture)
        console.print(_profile_table(result))
        console.print(f"trace: {opts.trace} (chrome://tracing or ui.perfetto.dev)")
    elif opts.lm:
        from heads_lab.bench import lm  # lazy: start-up time (torch)

        work, precision = _lm_workload(opts, model)
        result = lm.run(model, work, steps=opts.steps, warmup=opts.warmup, quick=opts.quick,
                        peers=opts.peers, decode=not opts.no_decode, precision=precision,
                        log=console.print)
        console.print(_lm_table(result))
    elif opts.depth:
        from heads_lab.bench import depth  # lazy: start-up time (torch)

        result = depth.run(model, steps=opts.steps, log=console.print)
        depth.plot(result, Path(opts.png))
        console.print(_depth_table(result))
        console.print(f"plot: {opts.png}")
    else:
        from heads_lab.bench import suite  # lazy: start-up time (torch)

        work, precision = _workload(opts)
        result = suite.run(model, steps=opts.steps, warmup=opts.warmup, quick=opts.quick,
                           peak=not opts.quick, log=console.print, work=work, precision=precision,
                           compile=opts.compile, decode=not opts.no_decode,
                           capture_all=opts.capture_all, peers=opts.peers)
        console.print(_table(result))
        console.print(_targets(result))
    return result


def _check_options(opts) -> None:
    """Flags that only make sense together, and --peers' optional dependency."""
    if opts.peers:
        import importlib.util  # lazy: only for --peers

        if importlib.util.find_spec("transformers") is None:
            raise ConfigError("bench --peers measures Hugging Face's models (Marian; with --lm "
                              "GPT-2 and Llama): install the hf extra (pip install "
                              "'heads-lab[hf]')")
    if opts.capture and opts.profile != "train":
        raise ConfigError("bench --capture profiles the captured training step: give it with "
                          "--profile train")
    if opts.lm and (opts.depth or opts.profile or opts.compile or opts.capture_all):
        raise ConfigError("bench --lm measures eager training and generation: drop --depth, "
                          "--profile, --compile and --capture-all")
    if not opts.lm and opts.new_tokens is not None:
        raise ConfigError("--new-tokens is the generated length of bench --lm: add --lm")
    if opts.lm:
        _check_lm_overrides(opts.overrides)
    if opts.capture_all and not opts.compile:
        raise ConfigError("bench --capture-all adds captured rows to the compiled ones: add "
                          "--compile")


def _check_counts_and_files(opts) -> None:
    """Before anything is measured or written: step counts that can be measured, --depth's
    device and precision, then the folders of the files it will write (made if missing;
    refused where they cannot be)."""
    for flag, value, least in (("--steps", opts.steps, 1), ("--warmup", opts.warmup, 0),
                               ("--rows", opts.rows, 1)):
        if value is not None and value < least:
            raise ConfigError(f"{flag} {value}: it must be >= {least}")
    if opts.depth and (opts.device not in ("auto", "cpu") or opts.precision == "bf16"):
        raise ConfigError("--depth measures fp32 on the CPU only: drop --device and "
                          "--precision (or run the speed table without --depth)")
    files = [opts.json] + ([opts.png] if opts.depth else []) + ([opts.trace] if opts.profile else [])
    for name in files:
        folder = Path(name).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"cannot write {name}: its folder {folder} cannot be made "
                              f"({err.strerror or err}); choose another path") from None


def _profile_table(result: dict):
    from heads_lab.output.tables import to_rich  # lazy: start-up time (rich)

    body = [[r["name"], f"{r['calls_per_step']:g}", f"{r['self_ms_per_step']:.2f}",
             f"{100 * r['share']:.1f}"] for r in result["rows"]]
    note = (f"{result['what']} of {result['variant']} ({result['precision']}, {result['device']}, "
            f"{result['batch']} × {result['length']} tokens): {result['total_ms_per_step']:.1f} ms "
            f"of {result['clock']} self time per step, over {result['steps']} steps")
    return to_rich({"header": ["operator / kernel", "calls/step", "self ms/step", "% of step"],
                    "rows": body, "note": note}, "heads-lab bench --profile")


def _check_lm_overrides(overrides: list[str]) -> None:
    """bench --lm sets each row's heads itself, and its peers compute heads-lab's function only
    where the model has what they have: refuse the settings that would make rows differ
    unseen."""
    values = dict(o.removeprefix("model.").split("=", 1) for o in overrides if "=" in o)
    keys = set(values)
    rows = keys & {"heads", "kv_heads", "head_dim", "attention", "heads_k", "heads_v",
                   "talking_heads_in", "mixes", "mix_init"}
    if rows:
        raise ConfigError(f"bench --lm sets each row's heads itself (h = 1, 8, 32, kv_heads 2 "
                          f"and 1, talking heads): drop model.{sorted(rows)[0]}")
    different = [(key, bad) for key, bad in (("d_ff", "0"), ("positions", "none"))
                 if values.get(key) == bad]
    different += [(key, values[key]) for key in ("relative_positions", "attention_dropout")
                  if values.get(key, "0") not in ("0", "0.0")]
    if different:
        key, value = different[0]
        raise ConfigError(f"bench --lm: model.{key}={value} has no counterpart in its peers (a "
                          "feed-forward block, sinusoidal positions, no relative biases or "
                          f"attention dropout), so rows would compute different functions: drop "
                          f"model.{key}")
    d = values.get("d_model", "256")
    if not d.isdigit() or int(d) % 32:
        raise ConfigError(f"bench --lm: model.d_model={d} must be a multiple of 32 (its h = 32 "
                          "row)")


def _workload(opts):
    """The batch on its device, and the table's precision, from the command line."""
    from heads_lab.bench.measure import Workload  # lazy: start-up time (torch)
    from heads_lab.training.device import check_precision, resolve_device  # lazy: start-up time (torch)

    if opts.device != "auto" and opts.device != "cpu" and not opts.device.startswith("cuda"):
        raise ConfigError(f"--device {opts.device} is not a device: use auto, cpu, cuda or cuda:N")
    device = resolve_device(opts.device, setting="--device")
    precision = opts.precision if opts.precision != "auto" else (
        "bf16" if device.type == "cuda" else "fp32")
    check_precision(device, precision)
    if opts.lm:  # (its own sizes: _lm_workload)
        return Workload(device=str(device)), precision
    batch = 64 if opts.batch is None else opts.batch
    length = 20 if opts.length is None else opts.length
    if min(batch, length) < 2:
        raise ConfigError("--batch and --length must be at least 2")
    return Workload(batch, length, device=str(device)), precision


def _lm_workload(opts, model):
    """--lm's batch of blocks and generated length, checked against the model's positions."""
    from heads_lab.bench.lm import LMWorkload  # lazy: start-up time (torch)

    translator, precision = _workload(opts)  # the device, the precision and their checks
    work = LMWorkload(*(default if given is None else given for given, default in (
        (opts.batch, 8), (opts.length, 256))), new=64 if opts.new_tokens is None else
        opts.new_tokens, device=translator.device)
    if min(work.batch, work.length, work.new) < 1:
        raise ConfigError("--batch, --length and --new-tokens must be at least 1")
    longest = max(work.length, work.new + 1)  # a block; BOS + the generated tokens
    if longest > model.max_positions:
        raise ConfigError(f"bench --lm needs {longest} positions (--length {work.length}, "
                          f"--new-tokens {work.new}), more than model.max_positions="
                          f"{model.max_positions}: lower them or raise model.max_positions")
    return work, precision


def _model(overrides: list[str], lm: bool = False):
    """The bench's small config (d_model 256, 3+3, d_ff 1024, dropout 0.1; `lm`: d_model 256, 4
    layers, d_ff 1024) with `model.*` overrides, validated as a run of its task."""
    if lm:
        from heads_lab.bench.lm import BASE  # lazy: start-up time (torch)
    else:
        from heads_lab.bench.suite import BASE  # lazy: start-up time (torch)

    bad = [o for o in overrides if not o.startswith("model.") or "=" not in o]
    if bad:
        raise ConfigError(f"bench takes model.KEY=VALUE overrides only, not {bad[0]!r}")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig(**BASE)),
                              OmegaConf.from_dotlist([o.removeprefix("model.") for o in overrides]))
    except OmegaConfBaseException as err:
        raise ConfigError(f"bad bench override: {str(err).splitlines()[0]}") from None
    model = OmegaConf.to_object(cfg)
    run = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), {
        "model": OmegaConf.structured(model),  # (sentences as long as the model's positions)
        "data": {"name": "synthetic", "max_len": max(1, model.max_positions - 2)},
        **({"task": "lm"} if lm else {}),
        "trainer": {}, "eval": {}, "logger": {}}))
    validate(run)
    return model


def _table(result: dict):
    # lazy: start-up time (rich), kept out of the bench's peak-RSS child processes
    from rich.table import Table

    rows = {r["name"]: r for r in result["rows"]}
    ref = rows["torch.nn.Transformer h=8"]["tokens_per_s"]
    mha8 = rows["mha h=8"]["tokens_per_s"]  # the table's main precision
    w = result["workload"]
    where = (result.get("device", "cpu") if result.get("device", "cpu") != "cpu"
             else f"{result['threads']} threads")
    table = Table(title=f"heads-lab bench: {w['batch']} pairs × {w['length']} tokens, vocab "
                  f"{w['vocab']}, {where}; median of {result['steps']} steps "
                  f"after {result['warmup']}; ceilings fp32 {result['ceilings']['fp32']:.0f} / bf16 "
                  f"{result['ceilings']['bf16']:.0f} GFLOP/s", title_justify="left")
    for col in ("variant", "tok/s", "× torch", "× mha8", "GFLOP/s", "MFU", "peak MB",
                "greedy s/s", "beam4 s/s"):
        table.add_column(col, justify="left" if col == "variant" else "right",
                         no_wrap=col == "variant")
    for r in result["rows"]:
        greedy = r.get("greedy", r.get("greedy_uncached"))
        beam = r.get("beam4", r.get("beam4_uncached"))
        table.add_row(
            r["name"] + (" (no cache)" if "greedy" not in r and greedy else ""),
            f"{r['tokens_per_s']:,.0f}", f"{r['tokens_per_s'] / ref:.2f}",
            f"{r['tokens_per_s'] / mha8:.2f}", f"{r['gflops_per_s']:.0f}", f"{r['mfu']:.0%}",
            f"{r['peak_mb']:,.0f}" if "peak_mb" in r else "-",
            f"{greedy:,.0f}" if greedy else "-", f"{beam:,.0f}" if beam else "-")
    m = rows["mha h=8"]
    if "greedy_uncached" in m:
        table.caption = (f"mha h=8 decoding without the cache: greedy {m['greedy_uncached']:,.0f}, "
                         f"beam4 {m['beam4_uncached']:,.0f} sentences/s")
    return table


def _lm_table(result: dict):
    # lazy: start-up time (rich)
    from rich.table import Table

    rows = {r["name"]: r for r in result["rows"]}
    mha8 = rows["mha h=8"]["tokens_per_s"]
    w, m = result["workload"], result["model"]
    where = result["device"] if result["device"] != "cpu" else f"{result['threads']} threads"
    table = Table(title=f"heads-lab bench --lm: d_model {m['d_model']}, {m['layers']} layers, d_ff "
                  f"{m['d_ff']}, vocab {w['vocab']}; {w['batch']} × {w['length']} tokens a step, "
                  f"{result['precision']}, {where}; median of {result['steps']} steps after "
                  f"{result['warmup']}; matmul ceiling {result['ceiling']:.0f} GFLOP/s",
                  title_justify="left")
    for col in ("model", "params", "train tok/s", "× mha8", "GFLOP/s", "MFU", "generate tok/s",
                "generation"):
        table.add_column(col, justify="left" if col in ("model", "generation") else "right",
                         no_wrap=col == "model")
    for r in result["rows"]:
        gen = r.get("generate_tokens_per_s")
        table.add_row(r["name"], f"{r['params']:,}", f"{r['tokens_per_s']:,.0f}",
                      f"{r['tokens_per_s'] / mha8:.2f}", f"{r['gflops_per_s']:.0f}",
                      f"{r['mfu']:.0%}", f"{gen:,.0f}" if gen else "-",
                      r["generation"] if gen else "-")
    m8 = rows["mha h=8"]
    if "generate_uncached_tokens_per_s" in m8:
        table.caption = (f"generation: {w['batch']} rows × {w['new']} greedy tokens after a BOS; "
                         f"mha h=8 without its cache {m8['generate_uncached_tokens_per_s']:,.0f} "
                         f"tok/s, the same tokens: {m8['cache_identical']}. FLOPs: "
                         "torch.utils.flop_counter on one forward, a step 3×")
    return table


def _targets(result: dict):
    # lazy: start-up time (rich), kept out of the bench's peak-RSS child processes
    from rich.table import Table

    table = Table(title="targets", title_justify="left")
    for col in ("target", "measured", "met"):
        table.add_column(col)
    for name, value, met in result["targets"]:
        table.add_row(name, value, "-" if met is None else ("yes" if met else "NO"))
    return table


def _depth_table(result: dict):
    # lazy: start-up time (rich), kept out of the bench's peak-RSS child processes
    from rich.table import Table

    table = Table(title="shallow multi-head vs deep single-head (fp32; MB: each point's training "
                  "peak above its process's start)", title_justify="left")
    for col in ("axis", "value", "shallow tok/s", "deep tok/s", "deep/shallow", "shallow MB",
                "deep MB"):
        table.add_column(col, justify="right")
    pts = {(p["axis"], p["value"], p["model"]): p for p in result["points"]}
    for axis, value in sorted({(p["axis"], p["value"]) for p in result["points"]}):
        s, d = pts[(axis, value, "shallow")], pts[(axis, value, "deep")]
        table.add_row(axis, str(value), f"{s['tokens_per_s']:,.0f}", f"{d['tokens_per_s']:,.0f}",
                      f"{d['tokens_per_s'] / s['tokens_per_s']:.2f}", f"{s['peak_mb']:,.0f}",
                      f"{d['peak_mb']:,.0f}")
    return table
