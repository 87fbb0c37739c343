"""train.py: train a character-level GPT. Read it top to bottom: the loop (evaluate if due, stop if asked, a step, a log
line if due), then train(), which opens the run (training/opening.py), runs the loop and finishes (training/session.py).
The parts live in training/ (docs/code.md is the map): the step and its schedule, the evaluations, the session."""
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
from training import device
from training.evaluation import plateaued
from training.opening import choose_corpus, open_run, say_estimate, say_what_runs
from training.report import (PAGE_MAX_PARAMETERS, Log, Phases, StepLog, done_lines, mfu_basis, out_of_memory,
                             seconds_since_process_start, stopped_line)
from training.run_folder import LAST, RunDir
from training.session import Session, StopRequest, attention_probe
from training.step import NonFiniteWatch, StepAbandoned, get_lr, too_many_nonfinite, train_step, warmup_note


# ---- the loop: evaluate if due, stop if asked, a step, a log line if due ---------------------------------------------
def train_loop(s: Session) -> tuple[list, bool]:
    """Train to max_iters, evaluating and checkpointing every eval_interval steps. Returns the (step, loss) history
    and whether a stop request ended it early. The loop reads the run's state (s.progress); s writes it."""
    run, cfg = s.run, s.cfg
    s.stop.training(s.progress, cfg.log_interval if s.d.enabled else 1)  # a Ctrl-C now stops at a step and saves
    peak_flops = before_the_first_step(s)
    watch, stopping = NonFiniteWatch(run.rt.device), False
    s.start_clock()
    with s.log.progress(cfg.max_iters, s.progress.it) as bar:
        steps = StepLog(s.log, bar, cfg, run.tokens_per_iter, run.flops_per_token, s.d.world_size, peak_flops,
                        s.progress.last_eval, s.slowdown_watch())
        while True:
            it = s.progress.it
            if s.evaluation_due():
                s.pause_clock()
                losses = s.evaluate()
                if losses is None:  # a stop request came during it
                    stopping = True
                    break
                steps.evaluated(it, losses)
                s.clock.restart()
            # Every rank must stop at the same step, or the others hang. Under DDP asking them is a collective
            # (a host sync), so it is done every log_interval steps, where the loop syncs anyway.
            if not s.d.enabled or it % cfg.log_interval == 0:
                stopping = s.d.any(s.stop.requested, run.rt.device)
            if it >= cfg.max_iters or stopping or plateaued(s.progress.evals_since_best, cfg.patience):
                s.pause_clock()
                break
            lr = get_lr(it, cfg)
            try:  # a stop between the micro-batches of a long step undoes the step (one process only)
                loss, grad_norm, finite = train_step(run.step_model, run.optimizer, run.scaler, run.batches, run.rt,
                                                     cfg, lr, None if s.d.enabled else s.asked_to_stop, s.d)
            except StepAbandoned:
                s.pause_clock()
                stopping = True
                break
            watch.update(finite)
            s.stepped()
            bar.update(1)
            if steps.due(s.progress.it):
                skipped = steps.write(s.progress.it, lr, loss, grad_norm, watch, s.clock)
                s.logged(*steps.history[-1])
                if skipped >= cfg.max_nonfinite_steps:
                    raise UserError(too_many_nonfinite(s.progress.it, cfg, s.run_dir.path / LAST))
    return steps.history, stopping


def before_the_first_step(s: Session) -> float:
    """Rank 0's notes (a long CPU run, a font for the pictures), and the peak FLOP/s that MFU is measured against."""
    run, cfg = s.run, s.cfg
    with run.phases.timing("opening"):
        if s.d.is_main:
            say_estimate(run, s.progress, s.log)
            if note := warmup_note(cfg, s.progress.it):
                s.log.say(note)
            if cfg.log_attention:
                from training.pictures import missing_note  # matplotlib: only runs that draw
                if note := missing_note(run.tokenizer.decode(attention_probe(run))):
                    s.log.say(note)
        largest = (cfg.batch_size * cfg.block_size, cfg.n_embd, 4 * cfg.n_embd)  # the feed-forward's first product
        peak = device.measure_peak_flops(run.rt.device, run.rt.dtype, [largest])
    if s.d.is_main and s.progress.it < cfg.max_iters:
        s.log.line(mfu_basis(peak))
    return peak


def train(cfg: TrainConfig, explicit: set[str] = frozenset(), say=tqdm.write, stop: StopRequest | None = None,
          note: str = "", start_up: float | None = None) -> dict:
    """Train (or continue, or finish) the run in cfg.out_dir. Returns its summary and loss history, with "stopped"
    when a stop request ended it early and "finished" when there was nothing left to do."""
    stop = stop or StopRequest(speak=False)  # in-process callers (tests) get a request nobody makes
    phases = Phases(start_up)  # start_up: the seconds before train() (the interpreter, the imports), when known
    d = device.from_environment(cfg.ddp)
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
    device.init(d, device.pick_device(cfg.device).type)
    try:
        opened = open_run(cfg, explicit, d, run_dir, log, stop, phases, None if cfg.resume else corpus)
        if isinstance(opened, str):
            log.say(opened)
            return {"finished": True}
        run, progress, source = opened
        return train_opened(Session(run=run, progress=progress, run_dir=run_dir, log=log, stop=stop, d=d), source)
    except (RuntimeError, torch.OutOfMemoryError) as err:
        if d.enabled and device.peer_lost(err):
            raise UserError(f"another process of this run ended unexpectedly ({device.first_line(err)}); "
                            f"{stop.saved}; run the same torchrun command with --resume") from None
        if not device.is_out_of_memory(err):
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
    if source is None:
        log.config(json.dumps(s.cfg.to_dict(), indent=1))
    log.layout()
    say_what_runs(run, run_dir, log, s.d)
    run.phases.opened()
    history, stopped = train_loop(s)
    if stopped:
        if not s.save_stopped():  # (an --overwrite stopped before it had anything to keep: the old run is back)
            say_loss_picture(s)
            log.say(stopped_line(progress.it, run_dir.path, in_final_validation=False))
        return {"stopped": True, "iterations": progress.it, "history": history}
    summary = s.finish(time.perf_counter() - run.phases.started)
    if summary.get("stopped"):
        say_loss_picture(s)
        log.say(stopped_line(progress.it, run_dir.path, in_final_validation=True))
        return {**summary, "history": history}
    for line in done_lines(summary, s.cfg, progress.evals_since_best):
        log.say(line)
    say_loss_picture(s)
    if "seconds" in summary:
        log.say(run.phases.line(summary["seconds"]))
    log.say(f"sample it: python scripts/sample.py --out_dir {where}")
    if s.cfg.n_layer and run.model.num_params(non_embedding=False) <= PAGE_MAX_PARAMETERS:
        page = shlex.quote(str(run_dir.path / "attention.html"))
        log.say(f"watch it think: python scripts/attention_html.py --out_dir {where} --html {page}, then open {page} "
                f"in a browser and type")
    return {**summary, "history": history}


def say_loss_picture(s: Session) -> None:
    """loss.png, every loss the run logged in all its sessions, drawn at its end; its place said."""
    path = s.draw_losses()
    if path is not None:
        s.log.say(f"the losses, every point as logged: {path}")


def main(argv: list[str] | None = None) -> int:
    start_up = seconds_since_process_start()
    d = device.from_environment()
    with StopRequest(speak=d.is_main) as stop:  # Ctrl-C is handled from the first line to the last
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
