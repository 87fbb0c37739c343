"""train.py: train a character-level GPT. Read it top to bottom: one training step (a batch, forward, loss, backward,
clipping, the update), the loop around it, then train(), which opens the run and finishes it. What a product needs
besides (checkpoints, the clock, TensorBoard, stop requests, the compile fallback, several processes) sits behind the
calls into training/ and common/, whose files a learner may skip (docs/code.md is the map)."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterator, TextIO

from errors import quiet_while_loading

# a Ctrl-C, SIGTERM or SIGHUP while Python loads torch: one line, not the import's traceback
loaded = quiet_while_loading(__name__, "stopped before training began; no checkpoint of this run was written")

import torch
from tqdm import tqdm

from common import machine
from common.run_folder import BEST, LAST, RunDir
from configs import TrainConfig, load_config
from errors import Interrupted, StepAbandoned, UserError, exit_without_teardown, python_command, run_cli
from training import device
from training.evaluation import next_evaluation, plateaued
from training.opening import choose_corpus, estimate_due, open_run, say_estimate, say_what_runs
from training.optim import get_lr, warmup_note
from training.report import (PAGE_MAX_PARAMETERS, Log, Phases, done_lines, mfu_basis, out_of_memory,
                             seconds_since_process_start, stopped_line, too_many_nonfinite)
from training.session import Session, StopRequest, attention_probe

loaded()  # from here a stop request stops the run as it should


# ---- one training step -----------------------------------------------------------------------------------------------
def train_step(model, optimizer, scaler, batches, autocast, cfg: TrainConfig, lr: float, rt: machine.Runtime,
               stop=None, d: device.Dist = device.Dist()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step over grad_accum_steps micro-batches: (mean loss, gradient norm, whether it was finite), on
    the device so that a step never waits for it. A stop() between micro-batches undoes it, raising StepAbandoned."""
    if getattr(model, "backward_unchecked", False):  # compiled, and its backward compiles now: a failure falls back
        loss = device.first_compiled_backward(model, batches, rt, d, lambda: forward_backward(
            model, optimizer, scaler, batches, autocast, cfg, rt, stop))
    else:
        loss = forward_backward(model, optimizer, scaler, batches, autocast, cfg, rt, stop)
    searching = scaler.is_enabled() and scaler._get_scale_async() > 1  # float16: read before update() lowers it
    grad_norm, finite = update(model, optimizer, scaler, cfg, lr, rt)
    if scaler.is_enabled():
        # float16: gradients that overflow are the scaler's search for a scale (the step skipped, the scale halved)
        # until the scale is down to 1; after that they count as skipped steps, as a loss that is not finite does.
        finite = torch.isfinite(loss) & (finite | searching)
    return loss, grad_norm, finite


def forward_backward(model, optimizer, scaler, batches, autocast, cfg: TrainConfig, rt: machine.Runtime,
                     stop=None) -> torch.Tensor:
    """The gradients of grad_accum_steps micro-batches, summed in each parameter's .grad; returns their mean loss."""
    loss_sum = torch.zeros((), device=rt.device)
    # Where the step began (a few KB): a stop between micro-batches undoes the step rather than wait out a long one.
    began = (batches.state_dict(), device.random_states(rt.device)) if stop else None
    for micro in range(cfg.grad_accum_steps):
        if began is not None and micro > 0 and stop():
            batches.load_state_dict(began[0])
            device.set_random_states(rt.device, began[1])
            optimizer.zero_grad(set_to_none=True)
            raise StepAbandoned
        x, y = batches.get_batch("train")  # (B, T) character ids, and (B, T) the character after each
        # Under DDP gradients are averaged across processes once, at the last micro-batch's backward.
        last = micro == cfg.grad_accum_steps - 1
        with model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext():
            with autocast:
                logits, loss = model(x, y)  # logits (B, T, vocab); loss: the mean cross-entropy of B x T predictions
                loss = loss / cfg.grad_accum_steps
            scaler.scale(loss).backward()  # d loss / d weight, added into each weight's .grad (scaled, with float16)
        loss_sum += loss.detach().float()
    return loss_sum


def update(model, optimizer, scaler, cfg: TrainConfig, lr: float,
           rt: machine.Runtime) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip the gradients, step the optimizer at learning rate lr, clear the gradients: (grad norm, whether it was
    finite), on the device. A step with a non-finite gradient is skipped, so NaN never reaches the weights."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    scaler.unscale_(optimizer)  # float16: the gradients divided by the loss scale (nothing otherwise)
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf  # inf: measure the norm, clip nothing
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # rescaled to a norm of at most max_norm
    finite = torch.isfinite(grad_norm)  # one gradient that is not finite makes the norm inf or NaN
    optimizer.step_if_finite(finite, on_device=rt.device.type != "cpu")  # (a CPU reads the flag for free)
    if scaler.is_enabled():
        scaler.update()  # float16: the scale lowered after a skipped step, raised after a run of good ones
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite


# ---- the loop: evaluate if due, stop if asked, a step, a log line if due ---------------------------------------------
def train_loop(s: Session) -> tuple[list, bool]:
    """Train to max_iters, evaluating and checkpointing when due. Returns the (step, loss) history and whether a stop
    request ended it early. The loop advances the run's state (s.progress); s saves and evaluates it."""
    run, cfg, progress, ddp = s.run, s.cfg, s.progress, s.d.enabled
    # a Ctrl-C now stops at a step and saves; one between the micro-batches of a step undoes it (forward_backward), but
    # not under DDP, where every process must stop at the same step
    undo = cfg.grad_accum_steps > 1 and not ddp
    s.stop.training(progress, cfg.log_interval if ddp else 1, undo=undo)
    peak_flops = before_the_first_step(s)
    autocast = run.rt.autocast()  # bfloat16 (or float16) matrix products where the device has them
    skipped = longest = torch.zeros((), dtype=torch.long, device=run.rt.device)  # non-finite steps in a row, counted
    next_eval, stopping = next_evaluation(progress.it, cfg), False
    plateau = plateaued(progress.evals_since_best, cfg.patience)
    clock = s.start_clock()
    with s.log.progress(cfg.max_iters, progress.it) as bar:
        steps = StepLog(s, bar, peak_flops)
        while True:
            it = progress.it
            if it == next_eval:
                if not progress.eval_done:
                    s.pause_clock()
                    losses = s.evaluate()
                    if losses is None:  # a stop request came during it
                        stopping = True
                        break
                    steps.evaluated(it, losses)
                    plateau = plateaued(progress.evals_since_best, cfg.patience)
                    clock.restart()
                next_eval = next_evaluation(it + 1, cfg)
            # Every process must stop at the same step, or the others hang: under DDP asking them is a collective (a
            # host sync), so it is done every log_interval steps, where the loop waits for the device anyway.
            if not ddp:
                stopping = s.stop.requested
            elif it % cfg.log_interval == 0:
                stopping = s.d.any(s.stop.requested, run.rt.device)
            if it >= cfg.max_iters or stopping or plateau:
                s.pause_clock()
                break
            lr = get_lr(it, cfg)
            try:
                loss, grad_norm, finite = train_step(run.step_model, run.optimizer, run.scaler, run.batches, autocast,
                                                     cfg, lr, run.rt, s.asked_to_stop if undo else None, s.d)
            except StepAbandoned:  # a stop between the micro-batches of a long step: the step is undone
                s.pause_clock()
                stopping = True
                break
            skipped = (skipped + 1) * ~finite  # on the device: the loop reads it only with the log line
            longest = torch.maximum(longest, skipped)
            progress.it += 1
            progress.eval_done = False
            if progress.it == clock.first_step:  # this session's first step, timed alone
                clock.first_step_done()
            bar.update(1)
            if progress.it % cfg.log_interval == 0 or progress.it == cfg.max_iters:
                # under DDP the ranks' mean (each has as many windows): the global batch's loss, read in the one read
                record = steps.write(progress.it, lr, s.d.mean(loss) if ddp else loss, grad_norm, longest)
                longest = skipped  # the longest run since this line counts from the run still going on
                if record.skipped >= cfg.max_nonfinite_steps:
                    raise UserError(too_many_nonfinite(progress.it, cfg, s.run_dir.path / LAST))
    return steps.history, stopping


@dataclass
class StepRecord:
    """What a log line records of a step. Each field with a tag goes to TensorBoard under it: a new scalar is a field
    here and the line in StepLog.write() that computes it."""
    step: int
    loss: float = field(metadata={"tag": "loss/train"})
    lr: float = field(metadata={"tag": "optim/lr"})
    grad_norm: float = field(metadata={"tag": "optim/grad_norm"})
    tokens_per_sec: float = field(metadata={"tag": "perf/tokens_per_sec"})
    tokens_seen: int = field(metadata={"tag": "perf/tokens_seen"})
    mfu: float = field(metadata={"tag": "perf/mfu"})  # a percentage, as the console shows it
    ms_per_step: float = 0.0
    skipped: int = 0  # the longest run of skipped (non-finite) steps since the last log line


class StepLog:
    """The log line every log_interval steps, to TensorBoard, the log file and the progress bar, from the loop's one
    read of the device; and the (step, loss) history."""

    def __init__(self, s: Session, bar: tqdm, peak_flops: float):
        self.s, self.bar, self.peak_flops = s, bar, peak_flops
        self.writer = s.log.writer()
        self.logged = (s.progress.it, s.clock.trained)  # (step, training seconds) at the last log line
        self.history: list[tuple[int, float]] = []
        self.slowdown = s.slowdown_watch()
        last = s.progress.last_eval
        self.last_val = f"val {last['val']:.4f} (saved)" if last else "val -"  # beside the loss on the bar

    def evaluated(self, it: int, losses: dict[str, float]) -> None:
        self.last_val = f"val {losses['val']:.4f} @{it}"  # the bar says which step the figure is from
        self.bar.set_postfix_str(f"train {losses['train']:.4f} val {losses['val']:.4f}", refresh=False)

    def write(self, it: int, lr: float, loss: torch.Tensor, grad_norm: torch.Tensor,
              longest: torch.Tensor) -> StepRecord:
        """Log step it; longest: the longest run of skipped steps since the last log line (on the device)."""
        s, run, clock = self.s, self.s.run, self.s.clock
        # the loop's only wait for the device (and the evaluations'): one read for all three numbers
        loss_value, norm_value, skipped = torch.stack([loss.float(), grad_norm.float(), longest.float()]).tolist()
        seconds = clock.trained + time.perf_counter() - clock.started  # training seconds so far, every session's
        previous = self.logged[0]
        step_seconds = max(seconds - self.logged[1], 1e-9) / (it - previous)
        self.logged = (it, seconds)
        tokens_per_sec = run.tokens_per_iter / step_seconds
        # MFU: each process's share of the model's FLOPs over one device's peak, at most 1 (a step faster than the
        # peak means the peak was measured in a busy moment)
        mfu = min(1.0, run.flops_per_token * tokens_per_sec / s.d.world_size / self.peak_flops)
        record = StepRecord(step=it, loss=loss_value, lr=lr, grad_norm=norm_value, tokens_per_sec=tokens_per_sec,
                            tokens_seen=it * run.tokens_per_iter, mfu=mfu * 100, ms_per_step=step_seconds * 1000,
                            skipped=int(skipped))
        scalars = {f.metadata["tag"]: getattr(record, f.name) for f in fields(record) if "tag" in f.metadata}
        if self.writer is not None:
            try:
                for tag, value in scalars.items():
                    self.writer.add_scalar(tag, value, it)
            except (OSError, RuntimeError) as err:
                s.log.failed(err)
        if s.log.wandb is not None:
            s.log.wandb.log(scalars, step=it)
        if s.log.lines is not None:  # a log file (a terminal has the progress bar)
            s.log.lines(f"step {it}/{run.cfg.max_iters}: loss {loss_value:.4f}, {record.ms_per_step:.1f} ms/step, "
                        f"{tokens_per_sec:,.0f} tokens/s, mfu {record.mfu:.1f}% of {self.peak_flops / 1e12:.3g} "
                        f"TFLOP/s")
        self.bar.set_postfix_str(f"loss {loss_value:.4f} lr {lr:.2e} {tokens_per_sec:,.0f} tok/s {self.last_val}",
                                 refresh=False)
        self.history.append((it, loss_value))
        s.progress.losses["train"].append((it, loss_value))  # for loss.png
        watch = self.slowdown
        if watch is not None and step_seconds > watch.limit and (note := watch.seen(previous, it, step_seconds)):
            s.log.say(note)
        return record


def before_the_first_step(s: Session) -> float:
    """Rank 0's notes (a long CPU run, a font for the pictures), and the peak FLOP/s that MFU is measured against."""
    run, cfg = s.run, s.cfg
    records = 0.0  # each evaluation's sample and pictures, in seconds: timed where the estimate is said
    if s.d.is_main and estimate_due(run, s.progress):
        with run.phases.timing("samples and pictures"):  # (with the pictures' layout, which the evaluations reuse)
            records = s.record_seconds()
    with run.phases.timing("opening"):
        if s.d.is_main:
            say_estimate(run, s.progress, s.log, records)
            if note := warmup_note(cfg, s.progress.it):
                s.log.say(note)
            if cfg.log_attention:
                from common.pictures import missing_note  # matplotlib: only runs that draw
                if note := missing_note(run.tokenizer.decode(attention_probe(run))):
                    s.log.say(note)
        largest = (cfg.batch_size * cfg.block_size, cfg.n_embd, 4 * cfg.n_embd)  # the feed-forward's first product
        peak = device.measure_peak_flops(run.rt.device, run.rt.dtype, [largest])
    if s.d.is_main and s.progress.it < cfg.max_iters:
        s.log.line(mfu_basis(peak))
    return peak


# ---- a run from its opening to its end -------------------------------------------------------------------------------
def train(cfg: TrainConfig, explicit: set[str] = frozenset(), say=tqdm.write, stop: StopRequest | None = None,
          note: str = "", start_up: float | None = None) -> dict:
    """Train (or continue, or finish) the run in cfg.out_dir. Returns its summary and loss history, with "stopped"
    when a stop request ended it early and "finished" when there was nothing left to do."""
    stop = stop or StopRequest(speak=False)  # in-process callers (tests) get a request nobody makes
    phases = Phases(start_up)  # start_up: the seconds before train() (the interpreter, the imports), when known
    d = device.from_environment(cfg.ddp)
    speak = say if d.is_main else (lambda message: None)
    if cfg.wandb and "wandb" in explicit and importlib.util.find_spec("wandb") is None:
        raise UserError("--wandb: the wandb package is not installed (pip install wandb; then wandb login, or "
                        "WANDB_MODE=offline to keep its logs in the run folder); leave --wandb out for TensorBoard "
                        "alone")
    if cfg.resume or cfg.init_from:  # (the note's later lines, on what the command line set, stay)
        whose = (f"the saved config of {cfg.out_dir or 'the run'}" if cfg.resume else
                 f"the settings of the run {cfg.init_from} starts from")
        note = "\n".join([f"config: {whose}, with what this command line sets", *note.splitlines()[1:]])
    if note:
        speak(note)
    corpus = None
    if not cfg.resume or not cfg.out_dir:
        # Offline, only a new run on the default corpus and cache falls back to pystdlib (and says so); else an error.
        fallback = not cfg.resume and not {"data", "cache_dir"} & explicit
        with phases.timing("data"):  # a named corpus may be downloaded
            cfg, corpus = choose_corpus(cfg, speak, fallback)  # names the default run folder after preset and corpus
    run_dir = RunDir(Path(cfg.out_dir))
    log = Log(run_dir.path, d.is_main, say)
    device.init(d, machine.pick_device(cfg.device).type)
    try:
        opened = open_run(cfg, explicit, d, run_dir, log, stop, phases, None if cfg.resume else corpus, update)
        if isinstance(opened, str):
            log.say(opened)
            return {"finished": True}
        run, progress, source = opened
        return train_opened(Session(run=run, progress=progress, run_dir=run_dir, log=log, stop=stop, d=d), source)
    except (RuntimeError, torch.OutOfMemoryError) as err:
        if d.enabled and device.peer_lost(err):
            raise UserError(f"another process of this run ended unexpectedly ({device.first_line(err)}); "
                            f"{stop.saved}; run the same torchrun command with --resume") from None
        if not machine.is_out_of_memory(err):
            raise
        raise UserError(out_of_memory(cfg, stop.saved)) from None
    finally:
        with contextlib.suppress(UserError):
            log.close()
        run_dir.release()


def train_opened(s: Session, source: Path | None) -> dict:
    run, progress, run_dir, log = s.run, s.progress, s.run_dir, s.log
    where = shlex.quote(str(run_dir.path))
    if source is not None:
        log.say(f"resuming {source} at step {progress.it}")
    elif s.d.is_main:  # --overwrite: the old run waits in .replaced/ until this one has something to keep
        s.stop.ending = run_dir.replace_old_run(log.say)
    try:
        log.start_wandb(s.cfg)
        if source is None:
            log.config(json.dumps(s.cfg.to_dict(), indent=1))
        log.layout()
        say_what_runs(run, run_dir, log, s.d)
        run.phases.opened()
        history, stopped = train_loop(s)
    except Interrupted as err:  # a stop before the loop began, or at once
        raise s.put_back_on_stop(err) from None
    if stopped:
        if not s.save_stopped():  # (an --overwrite stopped before it had anything to keep: the old run is back)
            s.draw_losses()
            log.say(stopped_line(progress.it, run_dir.path, False, s.watch.advice if s.watch else ""))
        return {"stopped": True, "iterations": progress.it, "history": history}
    summary = s.finish(time.perf_counter() - run.phases.started)
    if summary.get("stopped"):
        s.draw_losses()
        log.say(stopped_line(progress.it, run_dir.path, True, s.watch.advice if s.watch else ""))
        return {**summary, "history": history}
    for line in done_lines(summary, s.cfg, progress.evals_since_best):
        log.say(line)
    s.draw_losses()
    if "seconds" in summary:
        log.say(run.phases.line(summary["seconds"]))
    # the model handed over; a ckpt_best left unreadable beside ckpt_last would be the one --out_dir reads
    model = (f"--ckpt {shlex.quote(str(run_dir.path / LAST))}" if summary["model_checkpoint"] == LAST
             and (run_dir.path / BEST).exists() else f"--out_dir {where}")
    log.say(f"sample it: {python_command('scripts/sample.py')} {model}")
    if s.cfg.n_layer and run.model.num_params(non_embedding=False) <= PAGE_MAX_PARAMETERS:
        page = shlex.quote(str(run_dir.path / "attention.html"))
        log.say(f"watch it think: {python_command('scripts/attention_html.py')} {model} --html {page}, then "
                f"open {page} in a browser and type")
    return {**summary, "history": history}


# ---- the command line ------------------------------------------------------------------------------------------------
class GuardedOutput:
    """sys.stdout or sys.stderr, except that a write that fails (a pipe whose reader has gone: `python train.py |
    tee log` and then Ctrl-C, which ends tee too, or `| head`; a terminal that has closed) sends this and later
    output to /dev/null and calls gone(), where it would have raised an error in the middle of the run."""

    def __init__(self, stream: TextIO, gone: Callable[[], None]):
        self._stream, self._gone = stream, gone

    def write(self, text: str):
        try:
            return self._stream.write(text)
        except OSError:  # EPIPE, EIO (the terminal closed), ...
            self.went()

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self.went()

    def went(self) -> None:
        self._stream = open(os.devnull, "w", encoding="utf-8")
        self._gone()

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_output(gone: Callable[[], None]) -> Iterator[None]:
    """sys.stdout and sys.stderr, each a GuardedOutput inside the block."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (GuardedOutput(stream, gone) for stream in streams)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams


def main(argv: list[str] | None = None) -> int:
    start_up = seconds_since_process_start()
    d = device.from_environment()
    # Ctrl-C is handled from the first line to the last, and so is an output that can take no more
    with StopRequest(speak=d.is_main) as stop, guarded_output(stop.output_gone):
        cfg, note, explicit = load_config(argv, torch.cuda.is_available())
        try:
            result = train(cfg, explicit, stop=stop, note=note, start_up=start_up)
        except UserError as err:
            if d.is_main:
                raise
            device.leave_to_rank_zero(d, err)
        finally:
            device.shutdown()  # also on errors and Ctrl-C, so torchrun's other ranks are released
    return 130 if result.get("stopped") else 0


if __name__ == "__main__":
    exit_without_teardown(run_cli(main))
