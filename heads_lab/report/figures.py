"""The report's figures: BLEU (a language model's bits per byte) and PPL against the swept
setting, BLEU against cost (a language model's rows with caches of different sizes: bits per byte
against KV-cache bytes per token too), and each row's validation curve. Rows are
report/rows.py's Row (read by their runs' configs and metrics). Torch-free."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from heads_lab.output.curves import draw_valid_curves, tight
from heads_lab.output.tracking import short_key
from heads_lab.report.labels import as_written, swept


def curves(rows: list, varying: list[str]) -> tuple[str | None, dict[str, list[int]]]:
    """What the quality plot draws: the x setting (the one numeric setting that varies; where
    several do, the one swept on the command line if the others follow from it, as d_k and h_V
    follow h_K; else None: the rows side by side) and one line per value of the other varying
    settings (attention=mha, attention=talking_heads), each as row indices in the order of x.
    A preset's `report.x` picks the x setting where several numeric ones are swept."""
    def is_number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    side_by_side: tuple[None, dict[str, list[int]]] = (None, {"": list(range(len(rows)))})
    numbers = [k for k in varying if all(is_number(row.runs[0].config.get(k)) for row in rows)]
    on_command_line = swept([run for row in rows for run in row.runs])
    candidates = numbers if len(numbers) == 1 else [k for k in numbers if k in on_command_line]
    chosen = rows[0].runs[0].config.get("report.x") if rows else None
    if chosen in numbers:  # the preset names it (heads_by_data: data size, a line per h)
        candidates = [chosen]
    if len(candidates) != 1:
        return side_by_side
    x_key = candidates[0]
    # a line per value of the other settings: the non-numeric ones, or with report.x every other
    by = [k for k in varying if k != x_key and (chosen == x_key or k not in numbers)]
    lines: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        label = ",".join(f"{short_key(k)}={as_written(row.runs[0].config.get(k))}" for k in by)
        lines.setdefault(label, []).append(i)
    if any(len({rows[i].runs[0].config.get(x_key) for i in order}) != len(order)
           for order in lines.values()):  # another number varies on its own: no single x
        return side_by_side
    for order in lines.values():
        order.sort(key=lambda i: rows[i].runs[0].config.get(x_key))
    return x_key, lines


def plot(rows: list, varying: list[str], split: str, out: Path,
         quality: tuple[str, str] = ("bleu", "BLEU")) -> list[Path]:
    """BLEU (or `quality`: a language model's bits per byte) and PPL against the swept setting
    (numeric when one numeric setting varies, a line per value of the others), and BLEU against
    training tokens/s; error bars are the std over seeds."""
    key, label = quality
    import matplotlib  # lazy: start-up time (matplotlib), as in every figure module

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: start-up time (matplotlib), after use("Agg")

    def series(metric: str):
        values = [[r.metrics[metric] for r in row.runs if r.metrics.get(metric) is not None]
                  for row in rows]
        return ([statistics.fmean(v) if v else math.nan for v in values],
                [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values])

    x_key, lines = curves(rows, varying)
    numeric = x_key is not None
    xs = [row.runs[0].config.get(x_key) for row in rows] if numeric else list(range(len(rows)))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, name in ((axes[0], f"{split}/{key}", f"{split} {label}"),
                             (axes[1], "valid/ppl", "valid PPL")):
        mean, std = series(metric)
        ax.set_title(f"{name} (mean ± std over seeds)", fontsize=10)
        if all(math.isnan(m) for m in mean):  # e.g. pruned models: no validation of their own
            ax.text(0.5, 0.5, f"no {name} in these runs", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        for line, order in lines.items():  # settings side by side are joined by no line
            ax.errorbar([xs[i] for i in order], [mean[i] for i in order],
                        [std[i] for i in order], marker="o", capsize=4, label=line or None,
                        linestyle="-" if numeric else "none")
        if len(lines) > 1:
            ax.legend(fontsize=8)
        ax.set_ylabel(name)
        ax.set_xlabel(short_key(x_key) if numeric else "setting")
        if numeric:
            if min(xs) > 0 and max(xs) / min(xs) >= 8:
                ax.set_xscale("log", base=2)
            ticks = sorted(set(xs))  # the settings themselves (0.1, 0.3, 1; 1, 8, 32), not 2^k
            ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
            ax.minorticks_off()
        if not numeric:
            ax.set_xticks(range(len(rows)), [wrapped(rows[i].label) for i in range(len(rows))],
                          rotation=30, ha="right", fontsize=8)
            ax.set_xlim(-0.5, len(rows) - 0.5)
        ax.grid(alpha=0.3)
    settings = ", ".join(dict.fromkeys(short_key(k) for k in varying))
    fig.suptitle(f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
                 + (f": {settings}" if settings else ""))
    tight(fig)
    first = out / "report_quality.png"
    fig.savefig(first, dpi=120)
    plt.close(fig)

    speed, speed_std = series("train/tokens_per_s")
    cost_name = "training target tokens/s"
    if all(math.isnan(x) for x in speed):  # e.g. pruned models (heads-lab prune): their size
        speed, speed_std = series("cost/params")
        cost_name = "parameters"
    quality_of = series(f"{split}/{key}")
    second = _against(rows, (speed, speed_std), quality_of, cost_name, f"{split} {label}",
                      out / "report_quality_vs_cost.png")
    kv = [_kv_cache(row) for row in rows]
    more = []
    if key == "bits_per_byte" and len({x for x in kv if not math.isnan(x)}) > 1:
        # a language model's rows with caches of different sizes: what their heads cost at
        # generation against what they score (multi- and grouped-query attention)
        more.append(_against(rows, (kv, [0.0] * len(kv)), quality_of,
                             "KV cache bytes per token (fp32)", f"{split} {label}",
                             out / "report_quality_vs_kv_cache.png", log_x=True))
    third = plot_valid_curves(rows, out / "report_valid_curves.png")
    return [first, second, *more] + ([third] if third else [])


def _kv_cache(row) -> float:
    """A row's KV-cache bytes per token (its runs' cost account), NaN where a run has none."""
    values = [r.results.get("cost", {}).get("kv_cache_bytes_per_token") for r in row.runs]
    return statistics.fmean(values) if values and None not in values else math.nan


def _against(rows: list, x: tuple[list, list], y: tuple[list, list], x_name: str, y_name: str,
             path: Path, log_x: bool = False) -> Path:
    """y (mean ± std over seeds) against x, a labelled point per row, written to `path`."""
    import matplotlib.pyplot as plt  # lazy: start-up time (matplotlib; `plot` chose Agg)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.errorbar(x[0], y[0], yerr=y[1], xerr=x[1], fmt="o", capsize=3)
    for row, a, b in zip(rows, x[0], y[0]):
        ax.annotate(wrapped(row.label), (a, b), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    if log_x:
        ax.set_xscale("log", base=2)
        ticks = sorted({a for a in x[0] if not math.isnan(a)})
        ax.set_xticks(ticks, [f"{a:,.0f}" for a in ticks])
        ax.minorticks_off()
    ax.set_xlabel(x_name)
    ax.set_ylabel(y_name)
    ax.grid(alpha=0.3)
    ax.set_title(f"{y_name} against {x_name}", fontsize=10)
    tight(fig)
    inside(ax)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def inside(ax, tries: int = 6) -> None:
    """Widen the axes' limits until every annotation (a point's label) lies inside them: a label
    of the rightmost or topmost point crossed the frame."""
    fig = ax.figure
    for _ in range(tries):
        fig.canvas.draw()
        frame = ax.get_window_extent()
        boxes = [a.get_window_extent() for a in ax.texts]
        over_x = max([b.x1 - frame.x1 for b in boxes] + [0.0])
        over_y = max([b.y1 - frame.y1 for b in boxes] + [0.0])
        if over_x <= 0 and over_y <= 0:
            return
        x0, x1 = ax.get_xlim()
        y0, y1 = ax.get_ylim()
        ax.set_xlim(x0, x1 + (x1 - x0) * (over_x / frame.width + 0.02) * (over_x > 0))
        ax.set_ylim(y0, y1 + (y1 - y0) * (over_y / frame.height + 0.02) * (over_y > 0))


def wrapped(label: str, width: int = 18) -> str:
    """A long row label on several lines, broken after its commas (a tick label of
    'attention=talking_heads,mixes=weights' squashed the plot into a strip)."""
    lines, line = [], ""
    for part in label.split(","):
        if line and len(line) + 1 + len(part) > width:
            lines.append(line + ",")
            line = part
        else:
            line = f"{line},{part}" if line else part
    return "\n".join([*lines, line])


def valid_curves(rows: list) -> dict[str, tuple[list[int], list[float]]]:
    """Each row's validation curve: {label: (steps, valid PPL)}, the mean over the row's runs
    at the steps every one of them validated (results.json train.valid_history); rows whose
    runs kept no history are left out."""
    out = {}
    for row in rows:
        histories = [{h["step"]: h["valid/ppl"] for h in r.results.get("train", {}).get(
            "valid_history") or [] if math.isfinite(h.get("valid/ppl", math.nan))}
            for r in row.runs]  # a diverged validation (NaN) has no point
        steps = sorted(set.intersection(*(set(h) for h in histories))) if histories else []
        if steps:
            out[row.label] = (steps, [statistics.fmean(h[s] for h in histories) for s in steps])
    return out


def plot_valid_curves(rows: list, path: Path) -> Path | None:
    """Valid PPL against training step, a line per row (mean over its seeds), log y: where
    validation stops improving, and whether a step budget cut a row short (its best step is
    marked). None where no run kept its validation history."""
    data = valid_curves(rows)
    seeds = sorted({len(row.runs) for row in rows if row.label in data})
    return draw_valid_curves(data, path, "valid PPL during training (★ its lowest; mean over "
                             f"{'/'.join(map(str, seeds))} seed{'s' if seeds != [1] else ''})")


def plot_choices(choices: list, key: str, score_name: str, path: Path) -> Path | None:
    """`report --choose`: each setting's validation score against the value of KEY (a line per
    setting, log x where the values span 8× or more, as learning rates do), the chosen value
    starred. None where KEY's values are not numbers (the table in chosen.md says it all)."""
    import matplotlib  # lazy: start-up time (matplotlib), as in every figure module

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: start-up time (matplotlib), after use("Agg")

    try:
        lines = [(c, sorted((float(v), s) for v, s in c.scores.items() if math.isfinite(s)))
                 for c in choices]
    except ValueError:  # a value that is no number (attention=mha): no axis to draw it on
        return None
    xs = sorted({x for _, points in lines for x, _ in points})
    if not xs:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for choice, points in lines:
        drawn = ax.plot([x for x, _ in points], [s for _, s in points], marker="o",
                        label=choice.label)
        ax.plot([float(choice.chosen)], [choice.scores[choice.chosen]], marker="*",
                markersize=14, color=drawn[0].get_color(), linestyle="none")
    if min(xs) > 0 and max(xs) / min(xs) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.minorticks_off()
    seeds = sorted({", ".join(map(str, c.seeds)) for c in choices})
    on = f"seed{'s' if len(seeds) > 1 or ',' in seeds[0] else ''} {' / '.join(seeds)}"
    ax.set_xlabel(short_key(key) + (f" ({key})" if short_key(key) != key else ""))
    ax.set_ylabel(score_name)
    ax.set_title(f"{score_name} against {short_key(key)} (★ chosen; compared on {on})",
                 fontsize=10)
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize=8)
    tight(fig)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
