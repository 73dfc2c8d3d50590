"""The curve figures: validation (valid PPL against training step, a line per row or run: from
`heads-lab report`'s rows and from scripts/valid_curves.py's runs) and pruning (BLEU or accuracy
and PPL against the share of heads pruned: `heads-lab prune`'s, own and pretrained models'); and
tight, the figures' layout."""

from __future__ import annotations

import warnings
from pathlib import Path


def draw_valid_curves(data: dict[str, tuple[list[int], list[float]]], path: Path, title: str,
                      styles: dict[str, dict] | None = None, legend_below: bool = False,
                      ymax: float | None = None) -> Path | None:
    """Valid PPL against training step from {label: (steps, valid PPL)}, a line per label, log y,
    each line's lowest point starred, drawn whole at the axes' edge (report.plot_valid_curves:
    a row's mean over its seeds; scripts/valid_curves.py: one run each). styles: a label's own
    line settings (color, linestyle); legend_below: the legend under the axes, off every line;
    ymax: the axis' top (else the lines' ends readable: 3× the lowest point, raised so that at
    least half of every line's points show, its rise included). None where no label has two
    points."""
    import matplotlib  # lazy: start-up time (matplotlib), as in every figure module

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: start-up time (matplotlib), after use("Agg")
    import matplotlib.ticker  # lazy: as above

    if not any(len(steps) > 1 for steps, _ in data.values()):
        return None  # no curve: one validation per run at most
    fig, ax = plt.subplots(figsize=(6.5, 4.2 + (0.16 * len(data) if legend_below else 0)))
    for label, (steps, ppl) in data.items():
        (line,) = ax.plot(steps, ppl, marker=".", markersize=3, label=label,
                          **(styles or {}).get(label, {}))
        best = min(range(len(ppl)), key=ppl.__getitem__)
        ax.plot(steps[best], ppl[best], marker="*", markersize=10, color=line.get_color(),
                markeredgecolor="white", markeredgewidth=0.5, clip_on=False, zorder=3)
    ax.set_yscale("log")
    low = min(min(ppl) for _, ppl in data.values())
    high = max(max(ppl) for _, ppl in data.values())
    # the end of training readable (early, high PPL off the top), every row's best point shown
    half = max(sorted(ppl)[(len(ppl) - 1) // 2] for _, ppl in data.values())  # each line's median
    top = ymax or min(high, max(3 * low, half)) * 1.03
    ax.set_ylim(low / 1.06, top)  # room below the lowest star
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("training step")
    ax.set_ylabel("valid PPL (log scale" + (", cut at the top)" if top < high else ")"))
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    if legend_below:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    else:
        ax.legend(fontsize=8, ncol=2 if len(data) > 6 else 1)
    tight(fig)
    fig.savefig(path, dpi=120, **({"bbox_inches": "tight"} if legend_below else {}))
    plt.close(fig)
    return path


def tight(fig) -> None:
    """tight_layout, without matplotlib's warning where long labels leave it no room."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()


def plot_curves(curves: dict[str, list[dict]], path: Path, split: str,
                left: tuple[str, str] | None = None) -> Path:
    """BLEU (or `left`: (key, label), e.g. an encoder's masked-LM accuracy) and PPL vs the
    fraction of heads pruned, one line per attention type (Michel's figure)."""
    import matplotlib  # lazy: start-up time (matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: start-up time (matplotlib)

    key, label = left or ("bleu", f"{split} BLEU")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ppls: list[float] = []
    for name, rows in curves.items():
        x = [r["fraction"] * 100 for r in rows]
        axes[0].plot(x, [r[key] for r in rows], marker="o", label=name)
        ppl = [min(r["ppl"], 1e4) for r in rows]
        ppls += ppl
        axes[1].plot(x, ppl, marker="o", label=name)
    axes[0].set_ylabel(label)
    axes[1].set_ylabel(f"{split} PPL")
    axes[1].set_yscale("log")
    # labelled ticks at 1, 2, 5 × 10^k (5, 10, 20, 50, ...), as plain numbers (7, not 7×10⁰);
    # within one decade every integer step: a log axis never shows a single label
    subs = (1.0, 2.0, 5.0) if max(ppls) >= 4 * min(ppls) else tuple(range(1, 10))
    axes[1].yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=subs))
    axes[1].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axes[1].yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    groups = any(name.endswith("kv groups") for name in curves)
    for ax in axes:
        ax.set_xlabel("% of the heads (or key/value groups) of that attention type pruned"
                      if groups else "% of the heads (in that attention type) pruned")
        ax.grid(alpha=0.3)
    # one legend under both panels: inside one it covered a curve (the all-sites line)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(curves),
               frameon=False, fontsize=9)
    fig.suptitle("Iterative pruning by head importance (Michel et al. 2019)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
