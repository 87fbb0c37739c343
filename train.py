"""train.py: train a character-level GPT. Read it top to bottom: the loop (evaluate if due, stop if asked, a step, a log
line if due), then train(), which opens the run (training/opening.py), runs the loop and finishes (training/finish.py).
The parts live in training/: the schedule, the step, the evaluations, the clock, the non-finite watch, the session."""
from __future__ import annotations

import contextlib
import json
import shlex
import time
from pathlib import Path

import torch
from tqdm import tqdm

from configs import TrainConfig, load_config
from errors import UserError, exit_without_teardown, run_cli
from training import checkpoint, distributed, runtime
from training.clock import TrainClock
from training.estimate import warn_if_slow
from training.finish import finish
from training.fonts import missing_note
from training.log import Log
from training.nonfinite import NonFiniteWatch
from training.opening import choose_corpus, open_run
from training.perf import measure_peak_flops, model_matmul_shape
from training.phases import Phases, seconds_since_process_start
from training.report import (PAGE_MAX_PARAMETERS, attention_probe, done_lines, out_of_memory, say_what_runs,
                             stopped_line, too_many_nonfinite)
from training.run_dir import RunDir
from training.schedule import get_lr, warmup_note
from training.session import Session
from training.step_log import StepLog
from training.step import StepAbandoned, train_step
from training.stop import StopRequest


# ---- the loop: evaluate if due, stop if asked, a step, a log line if due ---------------------------------------------
def train_loop(s: Session) -> tuple[list, bool]:
    """Train to max_iters, evaluating and checkpointing every eval_interval steps. Returns the (step, loss) history
    and whether a stop request ended it early (then ckpt_last.pt holds that step)."""
    run, progress, cfg, rt = s.run, s.progress, s.cfg, s.run.rt
    s.stop.saving = True  # from here a Ctrl-C stops at a step boundary and saves
    s.stop.agree_every = cfg.log_interval if s.d.enabled else 1
    peak_flops = before_the_first_step(s)
    clock, watch, stopping = TrainClock(progress, rt.device, run.phases), NonFiniteWatch(rt.device), False
    with s.log.progress(cfg.max_iters, progress.it) as bar:
        steps = StepLog(s, bar, clock, watch, peak_flops)
        while True:
            it = s.stop.step = progress.it
            if s.evaluation_due():
                clock.stop()
                losses = s.evaluate()
                if losses is None:  # a stop request came during it
                    stopping = True
                    break
                steps.evaluated(it, losses)
                clock.start()
            # Every rank must stop at the same step, or the others hang. Under DDP asking them is a collective
            # (a host sync), so it is done every log_interval steps, where the loop syncs anyway.
            if not s.d.enabled or it % cfg.log_interval == 0:
                stopping = s.d.any(s.stop.requested, rt.device)
            if it >= cfg.max_iters or stopping or s.plateaued():
                clock.stop()
                break
            lr = get_lr(it, cfg)
            try:  # a stop between the micro-batches of a long step undoes the step (one process only)
                loss, grad_norm, finite = train_step(run.step_model, run.optimizer, run.scaler, run.batches, rt, cfg,
                                                     lr, None if s.d.enabled else s.stop)
            except StepAbandoned:
                clock.stop()
                stopping = True
                break
            watch.update(finite)
            progress.it, progress.eval_done = it + 1, False
            clock.stepped()
            bar.update(1)
            if steps.due() and steps.write(lr, loss, grad_norm) >= cfg.max_nonfinite_steps:
                raise UserError(too_many_nonfinite(progress.it, cfg, s.run_dir))
    if stopping and s.d.is_main and not s.run_dir.aside_pending():  # (an --overwrite stopped early: put_back)
        s.save(checkpoint.LAST)
    return steps.history, stopping


def before_the_first_step(s: Session) -> float:
    """Rank 0's notes (a long CPU run, a font for the pictures), and the peak FLOP/s that MFU is measured against."""
    run, cfg = s.run, s.cfg
    with run.phases.timing("opening"):
        if s.d.is_main:
            warn_if_slow(run, s.progress, s.log)
            if note := warmup_note(cfg, s.progress.it):
                s.log.say(note)
            if cfg.log_attention and (note := missing_note(run.tokenizer.decode(attention_probe(run)))):
                s.log.say(note)
        return measure_peak_flops(run.rt.device, run.rt.dtype, [model_matmul_shape(cfg.batch_size, run.model_cfg)])


def train(cfg: TrainConfig, explicit: set[str] = frozenset(), say=tqdm.write, stop: StopRequest | None = None,
          note: str = "", start_up: float | None = None) -> dict:
    """Train (or continue, or finish) the run in cfg.out_dir. Returns its summary and loss history, with "stopped"
    when a stop request ended it early and "finished" when there was nothing left to do."""
    stop = stop or StopRequest(speak=False)  # in-process callers (tests) get a request nobody makes
    phases = Phases(start_up)  # start_up: the seconds before train() (the interpreter, the imports), when known
    started = phases.started
    d = distributed.from_environment()
    speak = say if d.is_main else (lambda message: None)
    if cfg.resume:
        note = f"config: the saved config of {cfg.out_dir or 'the run'}, with what this command line sets"
    if note:
        speak(note)
    corpus = None
    if not cfg.resume or not cfg.out_dir:
        with phases.timing("data"):  # a named corpus may be downloaded
            cfg, corpus = choose_corpus(cfg, speak)  # names the default run folder after the preset and the corpus
    run_dir = RunDir(Path(cfg.out_dir))
    log = Log(run_dir.path, d.is_main, say)
    distributed.init(d, runtime.pick_device(cfg.device).type)
    try:
        opened = open_run(cfg, explicit, d, run_dir, log, stop, phases, None if cfg.resume else corpus)
        if isinstance(opened, str):
            log.say(opened)
            return {"finished": True}
        run, progress, source = opened
        run.phases = phases
        return train_opened(Session(run, progress, run_dir, log, stop, d), source, started)
    except (RuntimeError, torch.OutOfMemoryError) as err:
        if d.enabled and distributed.peer_lost(err):
            raise UserError(f"another process of this run ended unexpectedly ({distributed.first_line(err)}); "
                            f"{stop.saved}; run the same torchrun command with --resume") from None
        if not runtime.is_out_of_memory(err):
            raise
        raise UserError(out_of_memory(cfg, stop.saved)) from None
    finally:
        with contextlib.suppress(UserError):
            log.close()
        run_dir.release()


def train_opened(s: Session, source: Path | None, started: float) -> dict:
    run, progress, run_dir, log = s.run, s.progress, s.run_dir, s.log
    where = shlex.quote(str(run_dir.path))
    if source is not None:
        log.say(f"resuming {source} at step {progress.it}")
    elif s.d.is_main and run_dir.set_aside():  # --overwrite: the old run waits in .replaced/ (RunDir)
        log.say(f"--overwrite: the run in {run_dir.path} is kept aside until this one's first evaluation after step 0; "
                f"a stop before that puts it back")
        s.stop.ending = "putting back the run that --overwrite is replacing (this run has not saved anything to keep)"
    if source is None:
        log.text("config", json.dumps(s.cfg.to_dict(), indent=1), 0)
    log.layout()
    say_what_runs(run, run_dir, log, s.d)
    run.phases.seconds["opening"] += time.perf_counter() - started - run.phases.seconds["data"]
    history, stopped = train_loop(s)
    if stopped and s.d.is_main and run_dir.aside_pending():
        run_dir.put_back()
        log.say(f"stopped at step {progress.it}, before this run's first evaluation after step 0: the run --overwrite "
                f"was replacing is back in {run_dir.path}, as it was; this run is discarded")
        return {"stopped": True, "iterations": progress.it, "history": history}
    if stopped:
        log.say(stopped_line(progress.it, run_dir, in_final_validation=False))
        return {"stopped": True, "iterations": progress.it, "history": history}
    summary = finish(s, time.perf_counter() - started)
    if summary.get("stopped"):
        log.say(stopped_line(progress.it, run_dir, in_final_validation=True))
        return {**summary, "history": history}
    for line in done_lines(summary, s.cfg, progress):
        log.say(line)
    if "seconds" in summary:
        log.say(run.phases.line(summary["seconds"]))
    log.say(f"sample it: python scripts/sample.py --out_dir {where}")
    if s.cfg.n_layer and run.model.num_params(non_embedding=False) <= PAGE_MAX_PARAMETERS:
        page = shlex.quote(str(run_dir.path / "attention.html"))
        log.say(f"watch it think: python scripts/attention_html.py --out_dir {where} --html {page}, then open {page} "
                f"in a browser and type")
    return {**summary, "history": history}


def main(argv: list[str] | None = None) -> int:
    start_up = seconds_since_process_start()
    d = distributed.from_environment()
    with StopRequest(speak=d.is_main) as stop:  # Ctrl-C is handled from the first line to the last
        cfg, note, explicit = load_config(argv, torch.cuda.is_available())
        try:
            result = train(cfg, explicit, stop=stop, note=note, start_up=start_up)
        except UserError as err:
            if d.is_main:
                raise
            distributed.leave_to_rank_zero(d, err)
        finally:
            distributed.shutdown()  # also on errors and Ctrl-C, so torchrun's other ranks are released
    return 130 if result.get("stopped") else 0


if __name__ == "__main__":
    exit_without_teardown(run_cli(main))
