"""The run's voice: messages, the progress bar and TensorBoard events, all from rank 0 only (silent elsewhere)."""
from __future__ import annotations

import secrets
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

from errors import UserError
from training.files import disk_error


class Log:
    def __init__(self, out_dir: Path, active: bool = True, say=tqdm.write):
        self.out_dir, self.active, self._say = out_dir, active, say
        self.plain = not sys.stderr.isatty()  # a log file: a line per log interval instead of a progress bar
        self._writer = None  # opened on first use: a run that writes nothing leaves no event file

    def say(self, message: str) -> None:
        if self.active:
            self._say(message)

    def line(self, message: str) -> None:
        """A line for someone reading a log file (where a progress bar's updates run together); a terminal has the bar."""
        if self.plain:
            self.say(message)

    def task(self, what: str, total: int):
        """Progress of an evaluation: in a terminal a bar with a time estimate that appears only when it lasts more
        than 2 s; in a log file a line every 30 s."""
        if self.plain and self.active:
            return PlainProgress(self.say, what, total)
        return tqdm(total=total, desc=what, leave=False, delay=2, dynamic_ncols=True, disable=not self.active)

    def progress(self, total: int, initial: int) -> tqdm:
        return tqdm(total=total, initial=initial, dynamic_ncols=True, desc="train", mininterval=0.5,
                    disable=not self.active or self.plain)

    # ---- TensorBoard ----------------------------------------------------------------------------------------
    def _write(self, method: str, *args, **kwargs) -> None:
        self._with_writer(lambda writer: getattr(writer, method)(*args, **kwargs))

    def _with_writer(self, write) -> None:
        if not self.active:
            return
        try:
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter
                _quiet_writer_threads()
                # The event file's name ends in a random suffix: its usual name (time, host, pid) can be guessed,
                # and TensorBoard opens it following links; nobody can plant a link under an unguessable one.
                self._writer = SummaryWriter(log_dir=str(self.out_dir), filename_suffix=f".{secrets.token_hex(8)}")
            write(self._writer)
        except (OSError, RuntimeError) as err:
            self._writer = None  # its file is broken; close() must not try again
            raise UserError(f"could not write TensorBoard events in {self.out_dir} ({disk_error(err)}); the "
                            f"checkpoints are intact; free some disk space, then continue with --resume") from None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self._write("add_scalar", tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        self._write("add_text", tag, "```\n" + text + "\n```", step)

    def image(self, tag: str, picture, step: int) -> None:
        """picture: a (height, width, 3) uint8 array."""
        self._write("add_image", tag, picture, step, dataformats="HWC")

    def layout(self) -> None:
        """TensorBoard's Custom Scalars tab: train and validation loss on one chart, then the speed. Its tags are
        regular expressions, anchored so that each names one series a run (the full validation is its one point in
        the Scalars tab's summary/ group)."""
        self._write("add_custom_scalars", {
            "loss": {"train and validation loss (nats per character)": ["Multiline", ["^loss/train$", "^loss/val$"]]},
            "speed": {"tokens per second": ["Multiline", ["^perf/tokens_per_sec$"]],
                      "model FLOPs utilisation (%)": ["Multiline", ["^perf/mfu$"]]}})

    def hparams(self, hparams: dict, metrics: dict, step: int) -> None:
        """The run's settings and final figures for the HParams tab, in the run's own event file (torch's add_hparams
        would make a second run named after a subfolder), the figures at the final step (not as dots at step 0)."""
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        def write(writer) -> None:
            for summary in hparams_summaries(hparams, metrics):
                writer.file_writer.add_summary(summary, step)
            for tag, value in metrics.items():
                writer.add_scalar(tag, value, step)
        self._with_writer(write)

    def close(self) -> None:
        if self._writer is not None:
            self._write("close")
            self._writer = None


class PlainProgress:
    """A line every `every` seconds: what, how far, and about how long is left."""

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

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _quiet_writer_threads() -> None:
    """TensorBoard's writer thread prints a traceback when a write fails, then hands the error to the main thread,
    which reports it in one line: leave the printing to the main thread."""
    default = threading.excepthook
    if getattr(default, "quiet_for_oserror", False):
        return

    def hook(args):
        if not issubclass(args.exc_type, OSError):
            default(args)

    hook.quiet_for_oserror = True
    threading.excepthook = hook
