"""train.py: train a character-level GPT. Read it top to bottom: one training step, the loop, then train()."""
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
from typing import Callable, TextIO

from errors import quiet_while_loading

loaded = quiet_while_loading(__name__, "stopped before training began; no checkpoint of this run was written")

import torch
from tqdm import tqdm

from common import machine
from common.run_folder import BEST, LAST, RunDir
from configs import TrainConfig, load_config
from errors import Interrupted, StepAbandoned, UserError, python_command, run_cli
from training import checkpoint, device
from training.evaluation import next_evaluation, plateaued
from training.opening import choose_corpus, estimate_due, open_run, say_estimate, say_what_runs
from training.optim import get_lr, warmup_note
from training.report import (PAGE_MAX_PARAMETERS, Log, Phases, done_lines, mfu_basis, out_of_memory,
                             seconds_since_process_start, too_many_nonfinite)
from training.session import Session, attention_probe
from training.stop import StopRequest

loaded()


# ---- one training step -----------------------------------------------------------------------------------------------
def train_step(model, optimizer, scaler, batches, autocast, cfg: TrainConfig, lr: float, rt: machine.Runtime,
               stop=None, d: device.Dist = device.Dist()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step: (mean loss, grad norm, finite), on the device."""
    def passes() -> torch.Tensor:
        return forward_backward(model, optimizer, scaler, batches, autocast, cfg, rt, stop)

    if getattr(model, "backward_unchecked", False):  # compiled: a failed first backward falls back
        loss = device.first_compiled_backward(model, batches, rt, d, passes)
    else:
        loss = passes()
    # float16: whether the scale is above 1, read on the device before update() lowers it
    searching = scaler.is_enabled() and (getattr(scaler, "_get_scale_async", None) or scaler.get_scale)() > 1
    grad_norm, finite = update(model, optimizer, scaler, cfg, lr, rt)
    if scaler.is_enabled():
        # float16: overflows are the scaler's search for a scale until it is 1; then they count as skipped
        finite = torch.isfinite(loss) & (finite | searching)
    return loss, grad_norm, finite


def forward_backward(model, optimizer, scaler, batches, autocast, cfg: TrainConfig, rt: machine.Runtime,
                     stop=None) -> torch.Tensor:
    """The micro-batches' gradients, summed in each .grad; their mean loss. A stop() between them undoes the step."""
    loss_sum = torch.zeros((), device=rt.device)
    began = (batches.state_dict(), device.random_states(rt.device)) if stop else None  # to undo the step
    for micro in range(cfg.grad_accum_steps):
        x, y = batches.get_batch("train")  # (B, T) character ids, and (B, T) the character after each
        last = micro == cfg.grad_accum_steps - 1  # DDP averages the gradients once, at the last backward
        with model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext():
            with autocast:
                logits, loss = model(x, y)  # logits (B, T, vocab); loss: the mean cross-entropy
                loss = loss / cfg.grad_accum_steps
            scaler.scale(loss).backward()  # d loss / d weight, added into each .grad (scaled, with float16)
        loss_sum += loss.detach().float()
        if began is not None and not last and stop():
            batches.load_state_dict(began[0])
            device.set_random_states(rt.device, began[1])
            optimizer.zero_grad(set_to_none=True)
            raise StepAbandoned
    return loss_sum


def update(model, optimizer, scaler, cfg: TrainConfig, lr: float,
           rt: machine.Runtime) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip, step at rate lr, clear: (grad norm, finite). A non-finite step is skipped."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    scaler.unscale_(optimizer)  # float16: the gradients divided by the loss scale (nothing otherwise)
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf  # inf: measure the norm, clip nothing
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    finite = torch.isfinite(grad_norm)  # one gradient that is not finite makes the norm inf or NaN
    optimizer.step_if_finite(finite, on_device=rt.device.type != "cpu")  # (a CPU reads the flag for free)
    scaler.update()  # float16: the scale lowered after a skipped step, raised after good ones
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite


# ---- the loop: evaluate if due, stop if asked, a step, a log line if due ---------------------------------------------
def train_loop(s: Session) -> tuple[list, bool]:
    """Train to max_iters: the (step, loss) history, and whether a stop ended it."""
    run, cfg, progress, ddp = s.run, s.cfg, s.progress, s.d.enabled
    # a stop between micro-batches undoes the step; not under DDP, where every process stops at one step
    undo = cfg.grad_accum_steps > 1 and not ddp
    s.stop.training(progress, cfg.log_interval if ddp else 1, undo=undo)
    peak_flops = before_the_first_step(s)
    autocast = run.rt.autocast()
    skipped = longest = torch.zeros((), dtype=torch.long, device=run.rt.device)  # non-finite steps in a row
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
            # under DDP asking is a collective (a host sync): only where the loop waits anyway
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
            except StepAbandoned:
                s.pause_clock()
                stopping = True
                break
            skipped = (skipped + 1) * ~finite  # on the device, read with the log line
            longest = torch.maximum(longest, skipped)
            progress.it += 1
            progress.eval_done = False
            if progress.it == clock.first_step:
                clock.first_step_done()
            bar.update(1)
            if progress.it % cfg.log_interval == 0 or progress.it == cfg.max_iters:
                record = steps.write(progress.it, lr, s.d.mean(loss), grad_norm, longest)
                longest = skipped
                if record.skipped >= cfg.max_nonfinite_steps:
                    raise UserError(too_many_nonfinite(progress.it, cfg, s.run_dir.path / LAST))
    return steps.history, stopping


@dataclass
class StepRecord:
    """A log line's record of a step; a field's tag names it in TensorBoard."""
    step: int
    loss: float = field(metadata={"tag": "loss/train"})
    lr: float = field(metadata={"tag": "optim/lr"})
    grad_norm: float = field(metadata={"tag": "optim/grad_norm"})
    tokens_per_sec: float = field(metadata={"tag": "perf/tokens_per_sec"})
    tokens_seen: int = field(metadata={"tag": "perf/tokens_seen"})
    mfu: float = field(metadata={"tag": "perf/mfu"})  # a percentage
    ms_per_step: float = 0.0
    skipped: int = 0  # the longest run of skipped steps since the last log line


class StepLog:
    def __init__(self, s: Session, bar: tqdm, peak_flops: float):
        self.s, self.bar, self.peak_flops = s, bar, peak_flops
        self.writer = s.log.writer()
        self.logged = (s.progress.it, s.clock.trained)  # (step, training seconds) of the last log line
        self.history: list[tuple[int, float]] = []
        self.slowdown = s.slowdown_watch()
        last = s.progress.last_eval
        self.last_val = f"val {last['val']:.4f} (saved)" if last else "val -"

    def evaluated(self, it: int, losses: dict[str, float]) -> None:
        self.last_val = f"val {losses['val']:.4f} @{it}"
        self.bar.set_postfix_str(f"train {losses['train']:.4f} val {losses['val']:.4f}", refresh=False)

    def write(self, it: int, lr: float, loss: torch.Tensor, grad_norm: torch.Tensor,
              longest: torch.Tensor) -> StepRecord:
        s, run, clock = self.s, self.s.run, self.s.clock
        # the loop's only wait for the device: one read for all three
        loss_value, norm_value, skipped = torch.stack([loss.float(), grad_norm.float(), longest.float()]).tolist()
        seconds = clock.trained + time.perf_counter() - clock.started  # training seconds, every session's
        previous = self.logged[0]
        step_seconds = max(seconds - self.logged[1], 1e-9) / (it - previous)
        self.logged = (it, seconds)
        tokens_per_sec = run.tokens_per_iter / step_seconds
        # at most 1: the peak may have been measured at a busy moment
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
        s.log.to_wandb(scalars, it)
        if s.log.lines is not None:  # a log file; a terminal has the progress bar
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
    """Rank 0's notes before the first step; the peak FLOP/s."""
    run, cfg = s.run, s.cfg
    records = 0.0  # seconds of each evaluation's sample and pictures
    if s.d.is_main and estimate_due(run, s.progress):
        with run.phases.timing("samples and pictures"):
            records = s.record_seconds()
    with run.phases.timing("opening"):
        if s.d.is_main:
            say_estimate(run, s.progress, s.log, records)
            if note := warmup_note(cfg, s.progress.it):
                s.log.say(note)
            if cfg.log_attention:
                from common.pictures import missing_note  # matplotlib only where needed
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
    """Train or continue the run in cfg.out_dir: its summary and history."""
    stop = stop or StopRequest(speak=False)  # in-process callers get a request nobody makes
    phases = Phases(start_up)
    d = device.from_environment(cfg.ddp)
    speak = say if d.is_main else (lambda message: None)
    if cfg.wandb and "wandb" in explicit and importlib.util.find_spec("wandb") is None:
        raise UserError("--wandb: the wandb package is not installed. Install it (pip install wandb)")
    if cfg.resume or cfg.init_from:
        whose = (f"the saved config of {cfg.out_dir or 'the run'}" if cfg.resume else
                 f"the settings of the run {cfg.init_from} starts from")
        note = "\n".join([f"config: {whose}, with what this command line sets", *note.splitlines()[1:]])
    if note:
        speak(note)
    corpus = None
    if not cfg.resume or not cfg.out_dir:
        # offline, only a new run on the default corpus and cache falls back to pystdlib
        fallback = not cfg.resume and not {"data", "cache_dir"} & explicit
        with phases.timing("data"):
            cfg, corpus = choose_corpus(cfg, speak, fallback)
    run_dir = RunDir(Path(cfg.out_dir), step_of=checkpoint.step_of)
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
                            f"{stop.saved}. Run the same torchrun command with --resume") from None
        if not machine.is_out_of_memory(err):
            raise
        raise UserError(out_of_memory(cfg, stop.saved)) from None
    finally:
        with contextlib.suppress(UserError):
            log.close()
        run_dir.release()


def train_opened(s: Session, source: Path | None) -> dict:
    run, progress, run_dir, log = s.run, s.progress, s.run_dir, s.log
    if source is not None:
        log.say(f"resuming {source} at step {progress.it}")
    elif s.d.is_main:  # --overwrite: the old run waits aside until this one has something to keep
        s.stop.ending = run_dir.replace_old_run(log.say)
    try:
        log.start_wandb(s.cfg)
        if source is None:
            log.config(json.dumps(s.cfg.to_dict(), indent=1))
        log.layout()
        say_what_runs(run, run_dir, log, s.d)
        run.phases.opened()
        history, stopped = train_loop(s)
    except Interrupted as err:
        if s.d.is_main and run_dir.aside_pending():  # a stop without a save puts back an --overwrite's old run
            err = Interrupted(f"{err}; {s.put_back()}")
        raise err from None
    if stopped:
        if not s.save_stopped():
            s.say_stopped(in_final_validation=False)
        return {"stopped": True, "iterations": progress.it, "history": history}
    summary = s.finish(time.perf_counter() - run.phases.started)
    if summary.get("stopped"):
        s.say_stopped(in_final_validation=True)
        return {**summary, "history": history}
    for line in done_lines(summary, s.cfg, progress.evals_since_best):
        log.say(line)
    s.draw_losses()
    if "seconds" in summary:
        log.say(run.phases.line(summary["seconds"]))
    # an unreadable ckpt_best beside ckpt_last would be the one --out_dir reads
    model = (f"--ckpt {shlex.quote(str(run_dir.path / LAST))}" if summary["model_checkpoint"] == LAST
             and (run_dir.path / BEST).exists() else f"--out_dir {shlex.quote(str(run_dir.path))}")
    log.say(f"sample it: {python_command('scripts/sample.py')} {model}")
    if s.cfg.n_layer and run.model.num_params(non_embedding=False) <= PAGE_MAX_PARAMETERS:
        page = shlex.quote(str(run_dir.path / "attention.html"))
        log.say(f"watch it think: {python_command('scripts/attention_html.py')} {model} --html {page}, then "
                f"open {page} in a browser and type")
    return {**summary, "history": history}


# ---- the command line ------------------------------------------------------------------------------------------------
class GuardedOutput:
    """A stream that, once a write fails (a closed pipe or terminal), writes to /dev/null and calls gone()."""

    def __init__(self, stream: TextIO, gone: Callable[[], None]):
        self._stream, self._gone = stream, gone

    def write(self, text: str):
        return self._guarded("write", text)

    def flush(self) -> None:
        self._guarded("flush")

    def _guarded(self, method: str, *args):
        try:
            return getattr(self._stream, method)(*args)
        except OSError:
            self._stream = open(os.devnull, "w", encoding="utf-8")
            self._gone()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    start_up = seconds_since_process_start()
    d = device.from_environment()
    with (StopRequest(speak=d.is_main) as stop, contextlib.redirect_stdout(GuardedOutput(sys.stdout, stop.output_gone)),
          contextlib.redirect_stderr(GuardedOutput(sys.stderr, stop.output_gone))):
        cfg, note, explicit = load_config(argv, torch.cuda.is_available())
        try:
            result = train(cfg, explicit, stop=stop, note=note, start_up=start_up)
        except UserError as err:
            if d.is_main:
                raise
            device.leave_to_rank_zero(d, err)
        finally:
            device.shutdown()  # also on errors, to release torchrun's other ranks
    return 130 if result.get("stopped") else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
