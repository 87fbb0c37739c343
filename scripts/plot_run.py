"""python scripts/plot_run.py --out_dir DIR [DIR ...] --png FILE: runs' losses and learning rates, drawn."""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import (ArgumentParser, UserError, check_output_file,  # noqa: E402
                    quiet_while_loading, run_cli)

loaded = quiet_while_loading(__name__)

from common.pictures import picture_formats, save_figure  # noqa: E402
from common.run_folder import CHECKPOINTS  # noqa: E402
loaded()


RENAMED = {"train/loss": "loss/train", "val/loss": "loss/val", "train/lr": "optim/lr"}  # older runs' tags


def read_scalars(out_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a run: (step, value) pairs, the last written for each step by time."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not out_dir.is_dir():
        what = "no such folder" if not out_dir.exists() else "a file, not a run folder"
        raise UserError(f"--out_dir {out_dir}: {what}; pass the --out_dir of a training run")
    if not (files := list(out_dir.glob("events.out.tfevents.*"))):
        raise UserError(f"{out_dir} holds no TensorBoard events; pass the --out_dir of a training run")
    for path in files:
        if path.is_symlink() or not path.is_file():
            raise UserError(f"{path} is not a plain file. Move it out of {out_dir}, or leave that run out")
    events = EventAccumulator(str(out_dir), size_guidance={"scalars": 0})  # every point
    events.Reload()
    try:
        events.FirstEventTimestamp()  # every event file begins with one
    except ValueError:
        raise UserError(f"{out_dir}: its TensorBoard event files hold nothing readable; nothing to plot") from None
    scalars = {RENAMED.get(tag, tag): sorted({e.step: e.value for e in sorted(events.Scalars(tag),
                                                                              key=lambda e: e.wall_time)}.items())
               for tag in events.Tags()["scalars"]}
    if not any(scalars.get(tag) for tag in ("loss/train", "loss/val")):
        if any((out_dir / name).exists() for name in CHECKPOINTS):  # it evaluated, so it logged losses
            raise UserError(f"{out_dir}: its TensorBoard event files are damaged: they hold no losses, though the "
                            f"run saved a checkpoint; nothing to plot")
        raise UserError(f"{out_dir} holds no losses yet: the run stopped before its first log")
    return scalars


def run_folders(paths: list[str]) -> list[Path]:
    """Each folder given, or the runs in a folder of runs."""
    folders = []
    for out_dir in map(Path, paths):
        runs = [] if any(out_dir.glob("events.out.tfevents.*")) else sorted(
            d for d in out_dir.glob("*/") if any(d.glob("events.out.tfevents.*")))
        folders += runs or [out_dir]  # a folder with neither is named by read_scalars
    return list(dict.fromkeys(folders))



def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description="Plot runs' losses against tokens seen, and their learning rates.")
    p.add_argument("--out_dir", nargs="+", required=True, help="run folders, or a folder of runs")
    p.add_argument("--png", required=True, help="where to write the picture")
    args = p.parse_args(argv)
    check_output_file(args.png, "--png", picture_formats())
    folders = run_folders(args.out_dir)
    save_figure(draw(folders), args.png, "--png")
    print(f"wrote {args.png} ({len(folders)} run{'s' if len(folders) > 1 else ''})")
    return 0


LEGEND_COLUMNS = 4  # runs per row of the legend


def draw(folders: list[Path]):
    """The runs' losses against tokens seen (log-log) and their learning rates."""
    from matplotlib.ticker import ScalarFormatter

    from common.pictures import plt

    lowest, several, x_label = math.inf, len(folders) > 1, "step"
    rows = math.ceil(len(folders) / LEGEND_COLUMNS) if several else 0
    fig, (loss_ax, lr_ax) = plt.subplots(1, 2, figsize=(11, 4 + 0.25 * rows), dpi=100,
                                         gridspec_kw={"width_ratios": [2, 1]})
    for i, out_dir in enumerate(folders):
        scalars = read_scalars(out_dir)
        per_step = next((tokens / step for step, tokens in scalars.get("perf/tokens_seen", []) if step), None)
        if per_step is not None:
            x_label = "tokens seen"
        name = out_dir.name.replace("$", r"\$")  # a folder's name is text, not matplotlib's $math$
        label = name
        for tag, style, what in (("loss/train", "-", "train"), ("loss/val", "o--", "val")):
            points = [(s, v) for s, v in scalars.get(tag, []) if s > 0]  # not step 0, on a log axis
            if points:
                lowest = min(lowest, *(v for _, v in points))
                loss_ax.plot([s * (per_step or 1) for s, _ in points], [v for _, v in points],
                             "o" if len(points) == 1 else style,  # a line of one point does not show
                             color=f"C{i}", alpha=0.6 if what == "train" else 1.0, markersize=4,
                             label=label if several else f"{name} {what}")
                label = None
        lr = scalars.get("optim/lr", [])
        lr_ax.plot([s for s, _ in lr], [v for _, v in lr], "o" if len(lr) == 1 else "-", color=f"C{i}", label=name)
    loss_ax.set_xscale("log")
    if lowest > 0:  # a loss of 0 has no place on a log axis
        loss_ax.set_yscale("log")
        loss_ax.yaxis.set_major_formatter(ScalarFormatter())
        loss_ax.yaxis.set_minor_formatter(ScalarFormatter())
    loss_ax.set(xlabel=x_label, ylabel="cross-entropy (nats per character)",
                title="loss (line: train, dashed with dots: val)" if several else "loss")
    lr_ax.set(xlabel="step", title="learning rate")
    loss_ax.grid(True, which="both", alpha=0.3)
    lr_ax.grid(True, alpha=0.3)
    if several:
        fig.legend(*loss_ax.get_legend_handles_labels(), loc="lower center", ncol=LEGEND_COLUMNS, fontsize=8,
                   frameon=False)
        fig.tight_layout(rect=(0, 0.22 * rows / fig.get_figheight(), 1, 1))
    else:
        loss_ax.legend(fontsize=8)
        fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(run_cli(main))
