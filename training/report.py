"""What a run says and records: messages, progress bars, TensorBoard, the clocks, the last lines."""

import contextlib
import math
import os
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import torch
from tqdm import tqdm

from common.machine import sync
from common.run_folder import BEST, LAST, resume_command
from configs import TrainConfig
from errors import UserError, disk_error, in_one_line, shown

# Time Series unsmoothed (a few points smoothed mislead), in SVG (for browsers without WebGL).
TENSORBOARD_URL = "http://localhost:6006/?smoothing=0&forceSVG=true#timeseries"
# The largest model scripts/attention_html.py puts into its page.
PAGE_MAX_PARAMETERS = 4_000_000


class Log:
    """Messages, progress bars and TensorBoard events; silent off rank 0."""

    def __init__(self, out_dir: Path, active: bool = True, say=tqdm.write):
        self.out_dir, self.active, self._say = out_dir, active, say
        self.plain = not sys.stderr.isatty()  # a log file: lines instead of a progress bar
        self.lines = say if self.plain and active else None  # StepLog calls it directly
        self._writer = None  # opened on first use: a run that writes nothing leaves no event file
        self.wandb = None

    def start_wandb(self, cfg: TrainConfig) -> None:
        """--wandb: what TensorBoard gets goes to Weights & Biases too."""
        if not (cfg.wandb and self.active):
            return
        try:
            import wandb
        except ImportError:
            self.say("note: wandb is not installed, so this run logs to TensorBoard only; pip install wandb, or give "
                     "--wandb false")
            return
        name = self.out_dir.resolve().name
        try:
            self.wandb = wandb.init(project=cfg.wandb_project, name=name, group=name, dir=str(self.out_dir),
                                     config=cfg.to_dict(), settings=wandb.Settings(silent=True))
        except Exception as err:
            self.say(f"warning: Weights & Biases did not start ({in_one_line(err)}); this run logs to TensorBoard "
                     f"only. Try wandb login, or WANDB_MODE=offline")

    def say(self, message: str) -> None:
        if self.active:
            self._say(shown(message))  # a file's text, never terminal codes

    def line(self, message: str) -> None:
        """A line for a log file, not a terminal."""
        if self.lines is not None:
            self.lines(message)

    def task(self, what: str, total: int):
        """An evaluation's progress: a bar in a terminal, a line every 30 s in a file."""
        if self.plain and self.active:
            return PlainProgress(self.say, what, total)
        return tqdm(total=total, desc=what, leave=False, delay=2, dynamic_ncols=True, disable=not self.active)

    def progress(self, total: int, initial: int) -> tqdm:
        return tqdm(total=total, initial=initial, dynamic_ncols=True, desc="train", mininterval=0.5,
                    disable=not self.active or self.plain)

    # ---- TensorBoard
    def config(self, settings: str) -> None:
        self._write("add_text", "config", f"```\n{settings}\n```", 0)  # wandb has the config already

    def layout(self) -> None:
        self._write("add_custom_scalars", {
            "loss": {"train and validation loss (nats per character)": ["Multiline", ["^loss/train$", "^loss/val$"]]},
            "speed": {"tokens per second": ["Multiline", ["^perf/tokens_per_sec$"]],
                      "model FLOPs utilisation (%) of the peak measured at the start":
                          ["Multiline", ["^perf/mfu$"]]}})

    def writer(self):
        """StepLog's SummaryWriter, or None off rank 0."""
        self._with_writer(lambda writer: None)
        return self._writer

    def evaluation(self, it: int, losses: dict[str, float]) -> None:
        scalars = {"loss/train_eval": losses["train"], "loss/val": losses["val"]}
        for tag, value in scalars.items():
            self._write("add_scalar", tag, value, it)
        self.to_wandb(scalars, it)

    def sample(self, it: int, text: str) -> None:
        self._write("add_text", "samples", f"```\n{text}\n```", it)
        self.to_wandb({"samples": text}, it)

    def attention(self, it: int, layer: int, picture) -> None:
        """picture: a (height, width, 3) uint8 array."""
        tag = f"where_attention_looks/layer_{layer + 1}"
        self._write("add_image", tag, picture, it, dataformats="HWC")
        if self.wandb is not None:
            import wandb
            self.wandb.log({tag: wandb.Image(picture)}, step=it)

    def picture_seconds(self, picture) -> float:
        """Seconds TensorBoard takes to encode picture."""
        if not self.active:
            return 0.0
        from torch.utils.tensorboard.summary import image

        start = time.perf_counter()
        image("timed", picture, dataformats="HWC")
        return time.perf_counter() - start

    def final(self, cfg: TrainConfig, summary: dict, step: int) -> None:
        """The settings and final figures, for the HParams tab and as scalars."""

        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        figures = {"summary/full_val_loss": summary.get("full_val_loss"),
                   "summary/best_val_loss": summary["best_val_loss"], "summary/last_val_loss": summary["val_loss"]}
        metrics = {tag: value for tag, value in figures.items() if value is not None}
        hparams = {name: getattr(cfg, name) for name in ("learning_rate", "max_iters", "n_embd", "n_layer",
                                                          "optimizer")}

        def write(writer) -> None:
            for written in hparams_summaries(hparams, metrics):
                writer.file_writer.add_summary(written, step)
            for tag, value in metrics.items():
                writer.add_scalar(tag, value, step)
        self._with_writer(write)
        self.to_wandb(metrics, step)
        if self.wandb is not None:
            self.wandb.summary.update(metrics)

    def to_wandb(self, values: dict, step: int) -> None:
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def _write(self, method: str, *args, **kwargs) -> None:
        self._with_writer(lambda writer: getattr(writer, method)(*args, **kwargs))

    def _with_writer(self, write) -> None:
        if not self.active:
            return
        try:
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter
                _quiet_writer_threads()
                # unguessable: a link planted at a guessable name would be followed
                self._writer = SummaryWriter(log_dir=str(self.out_dir), filename_suffix=f".{secrets.token_hex(8)}")
            write(self._writer)
        except (OSError, RuntimeError) as err:
            self.failed(err)

    def failed(self, err: BaseException):
        self._writer = None  # broken: close() must not try again
        raise UserError(f"could not write TensorBoard events in {self.out_dir} ({disk_error(err)}); the "
                        f"checkpoints are intact. Free some disk space, then --resume") from None

    def close(self) -> None:
        if self._writer is not None:
            self._write("close")
            self._writer = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


class PlainProgress:
    """A line every `every` seconds: how far, how long is left."""

    def __init__(self, say, what: str, total: int, every: float = 30.0, unit: str = "batches"):
        self.say, self.what, self.total, self.every, self.unit = say, what, total, every, unit
        self.done, self.start = 0, time.perf_counter()
        self.last = self.start

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self.last >= self.every and self.done < self.total:
            self.last = now
            left = (now - self.start) / self.done * (self.total - self.done)
            self.say(f"{self.what}: {self.done}/{self.total} {self.unit}, about {left / 60:.1f} min left")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _quiet_writer_threads() -> None:
    """TensorBoard's writer thread prints no OSError traceback: the main thread reports it."""
    default = threading.excepthook
    if getattr(default, "quiet_for_oserror", False):
        return

    def hook(args):
        if not issubclass(args.exc_type, OSError):
            default(args)

    hook.quiet_for_oserror = True
    threading.excepthook = hook


# ---- where the time goes
PHASES = ("start-up", "data", "opening", "compilation", "training steps", "evaluations", "samples and pictures",
          "checkpoints", "full validation")


def seconds_since_process_start() -> float | None:
    """Seconds this process has run, imports included (Linux); else None."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time, in ticks since boot
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


def compile_seconds() -> float:
    """Seconds torch.compile has spent in this process."""
    try:
        return float(sys.modules["torch._dynamo.utils"].calculate_time_spent().get("total_wall_time", 0.0))
    except Exception:  # not imported yet, or a torch release changed this private API
        return 0.0


class Phases:
    """Seconds per phase of the whole command."""

    def __init__(self, start_up: float | None = None):
        self.started = time.perf_counter()
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.seconds["start-up"] = start_up or 0.0
        self.first_step: float | None = None  # without compilation
        self.expected: tuple[float, float] | None = None  # the estimate before step 1

    def so_far(self) -> float:
        return self.seconds["start-up"] + time.perf_counter() - self.started

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Time a phase; torch.compile's time inside it counts as compilation."""
        start, compiled = time.perf_counter(), compile_seconds()
        try:
            yield
        finally:
            compiling = compile_seconds() - compiled
            self.seconds["compilation"] += compiling
            self.seconds[phase] += time.perf_counter() - start - compiling

    def opened(self) -> None:
        """The time since `started`, but the data's, was the opening's."""
        self.seconds["opening"] += time.perf_counter() - self.started - self.seconds["data"]

    def report(self) -> dict[str, float]:
        total = self.so_far()
        return {**self.seconds, "other": max(0.0, total - sum(self.seconds.values())), "total": total}

    def line(self, report: dict[str, float]) -> str:
        first = f" (the first {self.first_step:.1f} s)" if self.first_step is not None else ""
        parts = [f"{seconds:.1f} s {phase}" + (first if phase == "training steps" else "")
                 for phase, seconds in report.items()
                 if phase != "total" and (seconds >= 0.05 or phase == "training steps")]
        since = "since the command started" if self.seconds["start-up"] else "in this call"
        if self.expected is not None:
            low, high = (f"{seconds:.0f}" for seconds in self.expected)
            since += f" (estimated before the first step: {low if low == high else f'{low}-{high}'} s)"
        return f"where the time went: {', '.join(parts)}; {report['total']:.1f} s {since}"


class TrainClock:
    """The clock of training steps alone, for tokens/s and MFU."""

    def __init__(self, it: int, train_seconds: float, device: torch.device, phases: Phases):
        self.device, self.phases = device, phases
        self.trained = train_seconds  # before this stretch
        self.restart()
        self.first_step = it + 1

    def pause(self) -> float:
        """End the stretch; returns the training seconds so far."""
        compiling = self.compiling()
        stretch = time.perf_counter() - self.started - compiling
        self.trained += stretch
        self.phases.seconds["training steps"] += stretch
        self.restart()
        return self.trained

    def restart(self) -> None:
        self.started, self.compiled = time.perf_counter(), compile_seconds()

    def first_step_done(self) -> None:
        """Time this session's first step, its compiling left out."""
        compiling = self.compiling()
        self.started += compiling
        self.compiled += compiling
        self.phases.first_step = time.perf_counter() - self.started

    def compiling(self) -> float:
        """Wait for the device; the seconds compiled in this stretch go to compilation."""
        sync(self.device)
        compiling = compile_seconds() - self.compiled
        self.phases.seconds["compilation"] += compiling
        return compiling


def mfu_basis(peak_flops: float) -> str:
    return (f"mfu below: the model's FLOPs per second over {peak_flops / 1e12:.3g} TFLOP/s, the peak this device "
            f"measured just now (an estimate: it moves with the load)")


def too_many_nonfinite(it: int, cfg: TrainConfig, last: Path) -> str:
    return (f"stopped at step {it}: {cfg.max_nonfinite_steps} steps in a row had a non-finite loss or gradient; "
            f"the last good checkpoint is {last}. Try a lower --learning_rate or --dtype float32, then --resume")


# ---- the lines a run ends with
def out_of_memory(cfg: TrainConfig, saved: str, figures: str = "") -> str:
    """The line for a run out of memory; figures say by how much."""
    return (f"out of memory{figures} for a model of n_layer {cfg.n_layer} x n_embd {cfg.n_embd} with batch_size "
            f"{cfg.batch_size} x block_size {cfg.block_size}; lower --batch_size (or --block_size, --n_embd, "
            f"--n_layer); {saved}")


def stopped_line(it: int, folder: Path, in_final_validation: bool, advice: str = "") -> str:
    resume = resume_command(folder, advice)
    if in_final_validation:
        return f"stopped during the final validation; step {it} is saved in {folder / LAST}. Finish it with: {resume}"
    return f"stopped at step {it}; saved {folder / LAST}. Continue with: {resume}"


def overfitting_line(evaluations: list) -> str:
    (first, _, val0), (last, _, val1) = evaluations[-3], evaluations[-1]
    return (f"warning: the model is learning the training text by heart: from step {first} to step {last} the "
            f"validation loss rose from {val0:.3f} to {val1:.3f}. Try a smaller model, --dropout 0.2, fewer steps, or "
            f"more text (docs/training.md, \"Small texts\")")


def done_lines(summary: dict, cfg: TrainConfig, evals_since_best: int) -> list[str]:
    """What a finished run says: steps, time, its model and figures."""
    it, step = summary["iterations"], summary["model_step"]
    lines = [f"done: {it} steps, {summary['train_seconds']:.1f} s of training steps"
             + (" in all its sessions" if cfg.resume else "")]
    if summary["stopped_early"]:
        lines[0] += (f"; stopped early: {evals_since_best} evaluations did not beat step {step}'s (--patience "
                     f"{cfg.patience}; --patience 0 trains on)")
    full = (f", full validation {summary['full_val_loss']:.4f} ({summary['full_val_bits_per_char']:.3f} bits/char)"
            if "full_val_loss" in summary else "")
    last = summary["val_loss"]
    if summary["model_checkpoint"] == LAST:
        val = f"val {last:.4f}" if last is not None else "no val"
        return [*lines, f"the run's model: step {step}, its last ({LAST}; no readable {BEST}): {val}{full}"]
    best = f"val {summary['best_val_loss']:.4f}" if math.isfinite(summary["best_val_loss"]) else "no finite val"
    which = "its last and best" if step == it else "its best"
    model = f"the run's model: step {step}, {which} ({BEST}): {best}{full}"
    if step != it and last is not None:
        model += f"; the last step's val {last:.4f} ({LAST}, kept for --resume)"
    lines.append(model)
    if step < it / 3:  # the validation loss rose for most of the run
        lines.append(f"note: the model is from early in the run (step {step} of {it}): later steps learned the text "
                     f"by heart; try --dropout {max(0.2, cfg.dropout + 0.1):g} or --n_embd {cfg.n_embd // 2}")
    return lines
