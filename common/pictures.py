"""Matplotlib pictures: attention heatmaps, loss curves, and fonts for the characters on their axes."""

import math
from functools import cache
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.ft2font import FT2Font
from matplotlib.patches import Patch, Rectangle

from common.run_folder import write_atomic

matplotlib.use("Agg")  # files only, no window

PANEL_INCHES, DPI = 3.6, 100
# The masked future: hatched light grey, a colour viridis never takes.
MASKED_FILL, MASKED_HATCH = "#d9d9d9", "#8c8c8c"
MASKED_LABEL = "masked\n(the future)"


def picture_formats() -> tuple[str, ...]:
    """The file endings matplotlib writes, but .pgf (it needs LaTeX)."""
    from matplotlib.backend_bases import FigureCanvasBase
    return tuple(f".{ext}" for ext in FigureCanvasBase.get_supported_filetypes() if ext != "pgf")


def save_figure(figure, path: str | Path, option: str, what: str = "the picture") -> None:
    """Write a figure atomically, its format from the file's ending."""
    path = Path(path)
    write_atomic(path, lambda f: figure.savefig(f, format=path.suffix[1:].lower()), what, option)


def loss_figure(losses: dict, title: str):
    """losses["train"]: (step, loss) per log line; losses["eval"]: (step, train, validation) per evaluation."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=DPI)
    series = [("train loss (each log line's batch)", losses["train"], 1, "C0", "."),
              ("train loss (evaluation)", losses["eval"], 1, "C2", "s"),
              ("validation loss (evaluation)", losses["eval"], 2, "C1", "o")]
    values = []
    for name, points, column, color, marker in series:
        if points:
            steps, ys = [p[0] for p in points], [float(p[column]) for p in points]
            ax.plot(steps, ys, marker=marker, linestyle="-", color=color, markersize=4, linewidth=1, label=name)
            values += [y for y in ys if math.isfinite(y)]  # the y axis spans these
    if values:
        low, high = min(values), max(values)
        pad = 0.05 * (high - low) or 0.05 * max(abs(high), 1.0)
        ax.set_ylim(low - pad, high + pad)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no losses logged yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title.replace("$", r"\$"), fontsize=10)  # a folder's name is text, not matplotlib's $math$
    ax.set(xlabel="step", ylabel="cross-entropy (nats per character)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def save_loss_picture(path: Path, losses: dict, title: str) -> None:
    fig = loss_figure(losses, title)
    plt.close(fig)
    save_figure(fig, path, "--out_dir", "the loss picture")


def grid_of(n_heads: int) -> tuple[int, int]:
    """(rows, columns) of the heads' panels: near square, at most 3 columns (TensorBoard's card is narrow)."""
    cols = n_heads if n_heads <= 2 else 2 if n_heads <= 4 else 3
    return math.ceil(n_heads / cols), cols


def attention_figure(weights: torch.Tensor, text: str, layer: int, heads: list[int] | None = None,
                     every_label: bool = False):
    """weights (n_head, T, T) of one layer -> a heatmap per head, at most 20 characters per axis (all with
    every_label)."""
    heads = list(range(weights.size(0))) if heads is None else heads
    rows, cols = grid_of(len(heads))
    panel = max(PANEL_INCHES, 0.16 * len(text)) if every_label else PANEL_INCHES
    width, height = cols * panel + 0.8, rows * panel
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), dpi=DPI, squeeze=False)
    # Fixed margins in inches: faster than constrained layout.
    fig.subplots_adjust(left=0.45 / width, right=1 - 1.05 / width, bottom=0.5 / height, top=1 - 0.3 / height,
                        wspace=0.2, hspace=0.25)
    labels, families, _ = tick_labels(text)
    step = 1 if every_label else math.ceil(len(labels) / 20)
    ticks = list(range(0, len(labels), step))
    shown = labels[::step]
    size = weights.size(-1)  # T
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad=(0, 0, 0, 0))  # masked cells show the hatch
    for ax in axes.flat[len(heads):]:
        ax.axis("off")
    for ax, head in zip(axes.flat, heads):
        ax.add_patch(Rectangle((-0.5, -0.5), size, size, facecolor=MASKED_FILL, edgecolor=MASKED_HATCH, hatch="///",
                               linewidth=0, zorder=0))
        image = ax.imshow(causal_cells(weights[head]), cmap=cmap, vmin=0.0, vmax=1.0, zorder=1)
        ax.set_title(panel_title(layer, head), fontsize=9)
        ax.set_xticks(ticks, shown, fontsize=8, fontfamily=families)
        ax.set_yticks(ticks, shown, fontsize=8, fontfamily=families)
        ax.set_xlabel("key (attended to)", fontsize=7)
        ax.set_ylabel("query", fontsize=7)
    bar = fig.add_axes((1 - 0.75 / width, 0.15, 0.12 / width, 0.7))
    fig.colorbar(image, cax=bar, label="attention weight")
    fig.legend(handles=[Patch(facecolor=MASKED_FILL, edgecolor=MASKED_HATCH, hatch="///", label=MASKED_LABEL)],
               loc="lower right", fontsize=6, frameon=False, handlelength=1.2, borderaxespad=0.1)
    return fig


def causal_cells(weights: torch.Tensor) -> np.ma.MaskedArray:
    """One head's (T, T) weights, the cells after the diagonal masked."""
    values = weights.float().cpu().numpy()
    return np.ma.masked_array(values, mask=np.triu(np.ones(values.shape, dtype=bool), k=1))


class AttentionPictures:
    """A run's attention pictures as (height, width, 3) arrays. The figure is drawn once without heatmaps, frames
    and titles; each picture redraws only those."""

    def __init__(self, text: str):
        self.text = text
        self.laid_out: tuple | None = None  # (weights' shape, figure, heatmap axes, background)

    def lay_out(self, weights: torch.Tensor, layer: int) -> None:
        fig = attention_figure(weights, self.text, layer)
        plt.close(fig)  # out of pyplot's list (it warns past 20)
        FigureCanvasAgg(fig)
        heatmaps = [ax for ax in fig.axes if ax.images]  # one per head
        redrawn = [artist for ax in heatmaps for artist in redrawn_parts(ax)]
        for artist in redrawn:
            artist.set_visible(False)
        # Emptied, not hidden: drawing moves a hidden title away.
        for ax in heatmaps:
            ax.title.set_text("")
        fig.canvas.draw()
        background = fig.canvas.copy_from_bbox(fig.bbox)
        for artist in redrawn:
            artist.set_visible(True)
        self.laid_out = (weights.shape, fig, heatmaps, background)

    def render(self, weights: torch.Tensor, layer: int):
        """weights (n_head, T, T) of one layer -> a (height, width, 3) uint8 array."""
        if self.laid_out is None or self.laid_out[0] != weights.shape:
            self.lay_out(weights, layer)
        _, fig, heatmaps, background = self.laid_out
        fig.canvas.restore_region(background)
        for head, (ax, head_weights) in enumerate(zip(heatmaps, weights)):
            ax.images[0].set_data(causal_cells(head_weights))
            ax.title.set_text(panel_title(layer, head))
            for artist in (*redrawn_parts(ax), ax.title):
                ax.draw_artist(artist)
        return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def panel_title(layer: int, head: int) -> str:
    return f"layer {layer + 1} head {head + 1}"


def redrawn_parts(ax) -> tuple:
    return ax.images[0], *ax.spines.values()


# ---- fonts for the axes' characters
BASE = "DejaVu Sans Mono"  # matplotlib's own monospaced font: Latin, Greek, Cyrillic, no Chinese
INSTALL_HINT = "install a font that has them (Debian/Ubuntu: sudo apt-get install fonts-noto-cjk)"


@cache
def _charmap(path: str) -> frozenset[int]:
    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):  # a font file matplotlib cannot read
        return frozenset()


@cache
def _fonts() -> tuple[tuple[str, str], ...]:
    """(family, file) of every installed font, BASE first, but "Last Resort" (illegible boxes)."""
    entries = {(f.name, f.fname) for f in font_manager.fontManager.ttflist if not f.name.startswith("Last Resort")}
    return tuple(sorted(entries, key=lambda e: (e[0] != BASE, e)))


@cache
def _system_font_files() -> tuple[str, ...]:
    """Font files missing from matplotlib's cached list."""
    new = set(font_manager.findSystemFonts()) - {path for _, path in _fonts()}
    return tuple(sorted(new, key=lambda path: ("Regular" not in Path(path).name, path)))  # Regular before Bold, Italic


@cache
def font_for(ch: str) -> str | None:
    """The first installed font with a glyph for ch, added to matplotlib's list if new; else None."""
    for name, path in _fonts():
        if ord(ch) in _charmap(path):
            return name
    for path in _system_font_files():
        if ord(ch) in _charmap(path):
            font_manager.fontManager.addfont(path)
            return font_manager.FontProperties(fname=path).get_name()
    return None


def tick_labels(text: str) -> tuple[list[str], list[str], list[str]]:
    """(a label per character, font families in fallback order, characters no font draws)."""
    families, missing, shown = [BASE], [], []
    for written in ({"\n": "\\n", " ": "␣", "\t": "\\t"}.get(ch, ch) for ch in text):
        fonts = [font_for(ch) for ch in written]
        families += [name for name in fonts if name]
        missing += [ch for ch, name in zip(written, fonts) if name is None]
        shown.append(written if all(fonts) else "".join(f"{ord(ch):x}" for ch in written))
    return shown, list(dict.fromkeys(families)), list(dict.fromkeys(missing))


def missing_note(text: str) -> str | None:
    missing = tick_labels(text)[2]
    if not missing:
        return None
    listed = ", ".join(f"{ch} U+{ord(ch):04X}" for ch in missing[:10]) + (
        f" and {len(missing) - 10} more" if len(missing) > 10 else "")
    return (f"note: no installed font draws {len(missing)} of the characters; the pictures show their code points: "
            f"{listed}. Fix: {INSTALL_HINT}, and run again.")

