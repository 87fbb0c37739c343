"""train.py: train a character-level GPT. Reads top to bottom: the step, the evaluations, the loop, the finish, and
train() tying them to opening the run (training/opening.py)."""
from __future__ import annotations

import contextlib
import json
import math
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from configs import TrainConfig, load_config
from errors import QuietExit, UserError, run_cli
from model.generate import generate
from training import checkpoint, distributed, runtime
from training.build import Progress, Run, capture
from training.distributed import Dist
from training.files import write_text_atomic
from training.fonts import missing_note
from training.log import Log
from training.opening import choose_corpus, open_run
from training.perf import measure_peak_flops, model_matmul_shape, sync, utilisation
from training.phases import Phases, seconds_since_process_start
from training.pictures import attention_figure, attention_weights
from training.run_dir import RunDir
from training.stop import StopRequest


def get_lr(it: int, cfg: TrainConfig) -> float:
    """Linear warm-up to learning_rate, then down to min_lr at lr_decay_iters (default: max_iters): along a cosine,
    or (wsd) flat until the last warmdown_fraction of the way, then in a straight line."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    if cfg.lr_schedule == "wsd":
        fall = max(0.0, (progress - (1 - cfg.warmdown_fraction)) / cfg.warmdown_fraction)  # progress < 1 here
        return cfg.learning_rate - fall * (cfg.learning_rate - cfg.min_lr)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def train_step(model, optimizer, scaler, batches, rt: runtime.Runtime, cfg: TrainConfig,
               lr: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step over grad_accum_steps micro-batches: (loss, grad norm, whether the gradients were finite),
    all three on the device, so that the step itself never waits for it.

    A step whose gradients are not finite is skipped, so NaN never reaches the weights (with float16 the
    gradient scaler does this itself, and lowers its scale)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(cfg.grad_accum_steps):
        x, y = batches.get_batch("train")
        # Under DDP, gradients are averaged across ranks once, on the last micro-batch, not on every one.
        last = micro == cfg.grad_accum_steps - 1
        with (model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()):
            with rt.autocast():
                loss = model(x, y)[1] / cfg.grad_accum_steps
            scaler.scale(loss).backward()
        loss_sum += loss.detach().float()
    scaler.unscale_(optimizer)
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")  # inf: measure the norm, clip nothing
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if scaler.is_enabled():  # float16: the scaler finds inf/NaN itself, skips such a step and lowers its scale
        scaler.step(optimizer)
        scaler.update()
        finite = torch.ones((), dtype=torch.bool, device=rt.device)
    else:
        finite = torch.isfinite(grad_norm)
        optimizer.step_if_finite(finite, on_device=rt.device_type != "cpu")  # a CPU reads the flag for free
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, finite


# ---- evaluations: both stop between batches when asked to (they return None then) -----------------------------
def asked_to_stop(stop: StopRequest | None, d: Dist, device: torch.device, batch: int) -> bool:
    """Between evaluation batches; under DDP the ranks agree every 10 batches (a collective), so all stop together."""
    if stop is None:
        return False
    if not d.enabled:
        return stop.requested
    return batch % 10 == 0 and d.any(stop.requested, device)


@torch.inference_mode()
def evaluate(model, batches, rt: runtime.Runtime, eval_iters: int, d: Dist = Dist(),
             stop: StopRequest | None = None, progress=None) -> dict[str, float] | None:
    """Mean loss over eval_iters random batches of each split (a quick estimate), averaged over ranks."""
    model.eval()
    out = {}
    try:
        for split in ("train", "val"):
            total = torch.zeros((), device=rt.device)
            for batch in range(eval_iters):
                if asked_to_stop(stop, d, rt.device, batch):
                    return None
                x, y = batches.get_batch(split)
                with rt.autocast():
                    total += model(x, y)[1].float()
                if progress is not None:
                    progress.update(1)
            out[split] = d.mean(total).item() / eval_iters
    finally:
        model.train()
    return out


@torch.inference_mode()
def full_validation_loss(model, batches, rt: runtime.Runtime, d: Dist = Dist(),
                         stop: StopRequest | None = None, progress=None) -> float | None:
    """The exact mean loss over every non-overlapping validation window (shared out among the ranks)."""
    model.eval()
    total = torch.zeros(2, device=rt.device, dtype=torch.float64)  # (sum of losses, number of characters)
    try:
        for batch, (x, y) in enumerate(batches.val_windows()):
            if asked_to_stop(stop, d, rt.device, batch):
                return None
            with rt.autocast():
                loss = model(x, y)[1]
            total += torch.stack([loss.double() * y.numel(), torch.tensor(y.numel(), device=rt.device)])
            if progress is not None:
                progress.update(1)
    finally:
        model.train()
    total = d.sum(total)
    return (total[0] / total[1]).item()


# ---- the loop --------------------------------------------------------------------------------------------------------
SLOW_RUN_SECONDS = 600  # on a CPU, a run expected to take longer than this says so before it starts
GPU_PRESETS = ("shakespeare_char", "shakespeare_char_gpu")


def expected_seconds(run: Run, progress: Progress) -> tuple[float, float]:
    """(seconds per training step, seconds for the rest of the run) on this device, from one timed forward and
    backward pass on the first validation batch. In eval mode, so no dropout mask is drawn: the run's random streams
    and weights stay exactly as they were."""
    cfg, rt = run.cfg, run.rt
    x, y = next(run.batches.val_windows())
    run.model.eval()
    for _ in range(2):  # the first pass warms up
        start = time.perf_counter()
        with rt.autocast():
            loss = run.model(x, y)[1]
        loss.backward()
        sync(rt.device)
        pass_seconds = time.perf_counter() - start
    run.model.zero_grad(set_to_none=True)
    run.model.train()
    step = pass_seconds * cfg.grad_accum_steps * cfg.batch_size / x.size(0)  # the timed batch may be smaller
    steps_left = cfg.max_iters - progress.it
    evaluations = steps_left // cfg.eval_interval + 1
    forward = step / 3 / cfg.grad_accum_steps  # a forward pass of one batch is about a third of a training step
    windows = run.batches.num_val_windows() / run.batches.batch_size if cfg.full_val else 0
    return step, steps_left * step + (evaluations * 2 * cfg.eval_iters + windows) * forward


def warn_if_slow(run: Run, progress: Progress, log: Log) -> None:
    """A run that will take long on a CPU says so at once, with the figure and a preset made for a CPU."""
    if run.rt.device_type != "cpu" or progress.it >= run.cfg.max_iters:
        return
    step, total = expected_seconds(run, progress)
    if total < SLOW_RUN_SECONDS:
        return
    name = run.cfg.config_name
    made_for = f"{name} is made for a GPU; " if name in GPU_PRESETS else ""
    about = f"{total / 3600:.1f} h" if total >= 3600 else f"{total / 60:.0f} min"
    log.say(f"note: {made_for}on this CPU this run would take about {about} ({step * 1000:.0f} ms per step "
            f"x {run.cfg.max_iters - progress.it} steps, plus evaluations); for a run of a minute or two use "
            f"--config shakespeare_char_cpu, or lower --max_iters and --eval_iters")


def plateaued(progress: Progress, cfg: TrainConfig) -> bool:
    """--patience: the last cfg.patience evaluations in a row did not beat the best validation loss."""
    return cfg.patience > 0 and progress.evals_since_best >= cfg.patience


def save(run: Run, progress: Progress, run_dir: RunDir, stop: StopRequest, name: str) -> None:
    with run.phases.timing("checkpoints"):
        checkpoint.save(capture(run, progress), run_dir.path / name)
    if name == checkpoint.LAST:
        run_dir.discard_aside()  # a run being replaced (--overwrite) goes once its replacement has a checkpoint
        stop.saved = f"the last checkpoint, {run_dir.path / name} (step {progress.it}), is intact"


def attention_probe(run: Run) -> list[int]:
    """The fixed text whose attention is pictured at every evaluation: the start of the validation split."""
    return [int(t) for t in run.batches.data["val"][: min(run.cfg.block_size, 48)]]


def record_evaluation(run: Run, progress: Progress, log: Log, losses: dict, improved: bool) -> None:
    """Rank 0: the losses, a generated sample and attention maps to TensorBoard."""
    with run.phases.timing("samples and pictures"):
        record_samples_and_pictures(run, progress, log, losses)


def record_samples_and_pictures(run: Run, progress: Progress, log: Log, losses: dict) -> None:
    cfg, it = run.cfg, progress.it
    log.scalars(it, {"loss/train_eval": losses["train"], "loss/val": losses["val"]})
    if cfg.sample_chars:
        prompt = run.tokenizer.encode(run.tokenizer.default_prompt(run.data_info["first_char"]))
        generator = torch.Generator(device=run.rt.device).manual_seed(cfg.seed)
        run.model.eval()  # no dropout while sampling
        with runtime.for_sampling(run.rt, cfg.dtype).autocast():
            text = generate(run.model, [prompt], cfg.sample_chars, generator=generator)[0]
        run.model.train()
        log.text("samples", run.tokenizer.decode(text), it)
    if cfg.log_attention:
        probe = attention_probe(run)
        for layer, weights in enumerate(attention_weights(run.model, probe)):
            log.figure(f"attention/layer_{layer}", attention_figure(weights, run.tokenizer.decode(probe), layer), it)


def train_loop(run: Run, progress: Progress, run_dir: RunDir, log: Log, stop: StopRequest, d: Dist) -> tuple[list, bool]:
    """Train to max_iters, evaluating and checkpointing every eval_interval steps. Returns the (step, loss) history
    and whether a stop request ended it early (then ckpt_last.pt holds that step)."""
    cfg, rt = run.cfg, run.rt
    stop.saving = True  # from here a Ctrl-C stops at a step boundary and saves
    with run.phases.timing("opening"):
        if d.is_main:
            warn_if_slow(run, progress, log)
            if cfg.log_attention and (note := missing_note(run.tokenizer.decode(attention_probe(run)))):
                log.say(note)
        peak_flops = measure_peak_flops(rt.device, rt.dtype, [model_matmul_shape(cfg.batch_size, run.model_cfg)])
    history, stopping = [], False
    last_val = f"val {progress.last_eval['val']:.4f} (saved)" if progress.last_eval else "val -"
    # Skipped (non-finite) steps are counted on the device and read where the loop syncs anyway: the longest run of
    # them since the last look, and the run still going on.
    streak = torch.zeros((), dtype=torch.long, device=rt.device)
    longest = torch.zeros((), dtype=torch.long, device=rt.device)
    # The clock runs only during training steps: evaluations, samples, pictures and checkpoints are not training.
    stretch = time.perf_counter()
    logged = (progress.it, progress.train_seconds)
    trained_before, first_step = progress.train_seconds, progress.it + 1

    def stop_clock() -> None:
        sync(rt.device)
        progress.train_seconds += time.perf_counter() - stretch

    with log.progress(cfg.max_iters, progress.it) as bar:
        while True:
            it = stop.step = progress.it
            if (it % cfg.eval_interval == 0 or it == cfg.max_iters) and not progress.eval_done:
                stop_clock()
                before = run.batches.state_dict()
                with log.task(f"evaluating at step {it}", 2 * cfg.eval_iters) as progress_bar, \
                        run.phases.timing("evaluations"):
                    losses = evaluate(run.step_model, run.batches, rt, cfg.eval_iters, d, stop, progress_bar)
                if losses is None:  # stopped during it: save the state from before it, so resuming does it again
                    run.batches.load_state_dict(before)
                    stopping = True
                    break
                improved = losses["val"] < progress.best_val
                progress.best_val, progress.last_eval, progress.eval_done = min(progress.best_val, losses["val"]), losses, True
                progress.evals_since_best = 0 if improved else progress.evals_since_best + 1
                last_val = f"val {losses['val']:.4f} @{it}"  # the bar says which step the figure is from
                if d.is_main:
                    record_evaluation(run, progress, log, losses, improved)
                    if improved:
                        save(run, progress, run_dir, stop, checkpoint.BEST)
                    save(run, progress, run_dir, stop, checkpoint.LAST)
                bar.set_postfix_str(f"train {losses['train']:.4f} val {losses['val']:.4f}", refresh=False)
                log.line(f"step {it}: evaluation: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                stretch = time.perf_counter()
            # Every rank must stop at the same step, or the others hang. Under DDP asking them is a collective
            # (a host sync), so it is done every log_interval steps, where the loop syncs anyway.
            if not d.enabled or it % cfg.log_interval == 0:
                stopping = d.any(stop.requested, rt.device)
            if it >= cfg.max_iters or stopping or plateaued(progress, cfg):
                stop_clock()
                break
            lr = get_lr(it, cfg)
            loss, grad_norm, finite = train_step(run.step_model, run.optimizer, run.scaler, run.batches, rt, cfg, lr)
            streak = (streak + 1) * ~finite
            longest = torch.maximum(longest, streak)
            progress.it, progress.eval_done = it + 1, False
            if progress.it == first_step:  # the first step compiles the model: timed on its own (one wait for it)
                sync(rt.device)
                run.phases.first_step = time.perf_counter() - stretch
            bar.update(1)
            if progress.it % cfg.log_interval == 0 or progress.it == cfg.max_iters:
                # the only host sync of the loop (and the evaluations'): one read for all three numbers
                loss_value, norm_value, skipped = torch.stack([loss.float(), grad_norm.float(), longest.float()]).tolist()
                if skipped >= cfg.max_nonfinite_steps:
                    raise UserError(f"stopped at step {progress.it}: {cfg.max_nonfinite_steps} steps in a row had a "
                                    f"non-finite loss or gradient (they were skipped); the last good checkpoint is "
                                    f"{run_dir.path / checkpoint.LAST}; try a lower --learning_rate or --dtype float32, "
                                    f"then --resume")
                longest = streak
                seconds = progress.train_seconds + time.perf_counter() - stretch
                step_seconds = max(seconds - logged[1], 1e-9) / (progress.it - logged[0])
                tokens_per_sec = run.tokens_per_iter / step_seconds
                mfu = utilisation(run.flops_per_token * tokens_per_sec, peak_flops)
                logged = (progress.it, seconds)
                history.append((progress.it, loss_value))
                log.scalars(progress.it, {
                    "loss/train": loss_value, "optim/lr": lr, "optim/grad_norm": norm_value,
                    "perf/tokens_per_sec": tokens_per_sec, "perf/tokens_seen": progress.it * run.tokens_per_iter,
                    "perf/mfu": mfu})
                log.line(f"step {progress.it}/{cfg.max_iters}: loss {loss_value:.4f}, {step_seconds * 1000:.1f} ms/step, "
                         f"{tokens_per_sec:,.0f} tokens/s, mfu {mfu * 100:.1f}%")
                bar.set_postfix_str(f"loss {loss_value:.4f} lr {lr:.2e} {tokens_per_sec:,.0f} tok/s {last_val}",
                                    refresh=False)
    run.phases.seconds["training steps"] = progress.train_seconds - trained_before
    if stopping and d.is_main:
        save(run, progress, run_dir, stop, checkpoint.LAST)
    return history, stopping


# ---- the finish: the exact validation loss, TensorBoard's hparams, summary.json -------------------------------
HPARAMS = ("learning_rate", "max_iters", "n_embd", "n_layer", "optimizer")


def hand_over_best(run: Run, progress: Progress, run_dir: RunDir, log: Log, d: Dist) -> tuple[int, str]:
    """Put the weights of ckpt_best.pt, the lowest validation loss the run measured, into the model: the run's model,
    which the full validation measures and the scripts use. (step, file) of the model handed over."""
    d.barrier()  # rank 0 wrote the file; every rank reads it
    path = run_dir.path / checkpoint.BEST
    if not path.is_file():  # no evaluation gave a finite loss
        return progress.it, checkpoint.LAST
    try:
        state = checkpoint.load(path, run.rt.device)
        run.model.load_state_dict(state["model"])
    except (UserError, RuntimeError) as err:
        log.say(f"warning: {path} cannot be read back ({err}); the run hands over its last model instead")
        return progress.it, checkpoint.LAST
    return state["iter"], checkpoint.BEST


def finish(run: Run, progress: Progress, run_dir: RunDir, log: Log, stop: StopRequest, d: Dist, wall: float) -> dict:
    cfg = run.cfg
    model_step, model_file = hand_over_best(run, progress, run_dir, log, d)
    summary = {
        "config": cfg.config_name, "corpus": run.data_info["source"], "iterations": progress.it,
        "model_step": model_step, "model_checkpoint": model_file,
        "stopped_early": progress.it < cfg.max_iters,
        "train_loss": progress.last_eval.get("train"), "val_loss": progress.last_eval.get("val"),
        "best_val_loss": progress.best_val, "tokens_seen": progress.it * run.tokens_per_iter,
        "train_seconds": progress.train_seconds, "wall_seconds": wall,
        "tokens_per_sec": progress.it * run.tokens_per_iter / progress.train_seconds if progress.train_seconds > 0 else None,
        "device": run.rt.describe(), "processes": d.world_size,
    }
    if cfg.full_val:
        windows = -(-run.batches.num_val_windows() // run.batches.batch_size)  # batches, rounded up
        with log.task(f"full validation of step {model_step}'s model", windows) as progress_bar, \
                run.phases.timing("full validation"):
            loss = full_validation_loss(run.step_model, run.batches, run.rt, d, stop, progress_bar)
        if loss is None:
            return {**summary, "stopped": True}
        summary["full_val_loss"], summary["full_val_bits_per_char"] = loss, loss / math.log(2)
    if d.is_main:
        # TensorBoard's HParams table sorts the settings by name and shows the first five: these five, so the
        # model's shape, learning rate, optimizer and steps are all in view, then the figures. The figures are
        # summary/ scalars at the final step, so their single dots come last in the Scalars tab, after loss.
        metrics = {"summary/full_val_loss": summary.get("full_val_loss"), "summary/best_val_loss": summary["best_val_loss"],
                   "summary/last_val_loss": summary["val_loss"]}
        log.hparams({name: getattr(cfg, name) for name in HPARAMS},
                    {tag: value for tag, value in metrics.items() if value is not None}, progress.it)
        log.close()
        summary["seconds"] = run.phases.report()
        write_text_atomic(run_dir.path / "summary.json", json.dumps(summary, indent=1) + "\n", "summary")
    return summary


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
        cfg, corpus = choose_corpus(cfg, speak)  # names the default run folder after the preset and the corpus
    run_dir = RunDir(Path(cfg.out_dir))
    log = Log(run_dir.path, d.is_main, say)
    distributed.init(d, runtime.pick_device(cfg.device).type)
    try:
        opened = open_run(cfg, explicit, d, run_dir, log, stop, None if cfg.resume else corpus)
        if isinstance(opened, str):
            log.say(opened)
            return {"finished": True}
        run, progress, source = opened
        run.phases = phases
        return train_opened(run, progress, source, run_dir, log, stop, d, started)
    except (RuntimeError, torch.OutOfMemoryError) as err:
        if not runtime.is_out_of_memory(err):
            raise
        raise UserError(f"out of memory for a model of n_layer {cfg.n_layer} x n_embd {cfg.n_embd} with batch_size "
                        f"{cfg.batch_size} x block_size {cfg.block_size}; lower --batch_size (or --block_size, "
                        f"--n_embd, --n_layer); {stop.saved}") from None
    finally:
        with contextlib.suppress(UserError):
            log.close()
        run_dir.release()


def train_opened(run: Run, progress: Progress, source: Path | None, run_dir: RunDir, log: Log, stop: StopRequest,
                 d: Dist, started: float) -> dict:
    cfg = run.cfg
    where = shlex.quote(str(run_dir.path))
    if source is not None:
        log.say(f"resuming {source} at step {progress.it}")
    elif run_dir.set_aside():  # --overwrite: the old run waits in .replaced/ until this one has a checkpoint
        log.say(f"--overwrite: the run in {run_dir.path} is kept aside until this one saves its first checkpoint")
    if source is None:
        log.text("config", json.dumps(cfg.to_dict(), indent=1), 0)
    log.layout()
    params = run.model.num_params()
    with_table = f" ({run.model.num_params(False) / 1e6:.2f}M with the position table)" if run.model.wpe is not None else ""
    log.say(f"{run.prepared.meta['source']}: {run.prepared.meta['n_chars']:,} characters, vocabulary "
            f"{run.tokenizer.vocab_size}; model {params / 1e6:.2f}M parameters{with_table}; {run.rt.describe()}")
    log.say(f"global batch: {cfg.batch_size} sequences x {cfg.grad_accum_steps} accumulation steps x {d.world_size} "
            f"process{'es' if d.enabled else ''} = {run.tokens_per_iter:,} tokens per step")
    log.say(f"run folder: {where}; watch it: tensorboard --logdir {where}, then open "
            f"http://localhost:6006/#custom_scalars (train and validation loss on one chart)")
    run.phases.seconds["opening"] += time.perf_counter() - started
    history, stopped = train_loop(run, progress, run_dir, log, stop, d)
    if stopped:
        log.say(f"stopped at step {progress.it}; saved {run_dir.path / checkpoint.LAST}. Continue with: "
                f"python train.py --out_dir {where} --resume")
        return {"stopped": True, "iterations": progress.it, "history": history}
    summary = finish(run, progress, run_dir, log, stop, d, time.perf_counter() - started)
    if summary.get("stopped"):
        log.say(f"stopped during the final validation; step {progress.it} is saved in {run_dir.path / checkpoint.LAST}. "
                f"Finish it with: python train.py --out_dir {where} --resume")
        return {**summary, "history": history}
    for line in done_lines(summary, run.cfg, progress):
        log.say(line)
    if "seconds" in summary:
        log.say(run.phases.line(summary["seconds"]))
    log.say(f"sample it: python scripts/sample.py --out_dir {where}")
    return {**summary, "history": history}


def done_lines(summary: dict, cfg: TrainConfig, progress: Progress) -> list[str]:
    """What a finished run says: its steps and time, which step's model it hands over and that model's figures, and
    the last step's validation estimate beside it."""
    it, step = summary["iterations"], summary["model_step"]
    # Training time counts every session of a resumed run; the wall clock only this process's.
    wall = "in this session" if cfg.resume else "in all"
    lines = [f"done: {it} steps, {summary['train_seconds']:.1f} s of training ({summary['wall_seconds']:.1f} s {wall})"]
    if summary["stopped_early"]:
        lines[0] += (f"; stopped early: {progress.evals_since_best} evaluations in a row did not beat step {step}'s "
                     f"validation loss (--patience {cfg.patience}; --patience 0 trains on to --max_iters {cfg.max_iters})")
    full = (f", full validation {summary['full_val_loss']:.4f} ({summary['full_val_bits_per_char']:.3f} bits/char)"
            if "full_val_loss" in summary else "")
    best = f"val {summary['best_val_loss']:.4f}" if math.isfinite(summary["best_val_loss"]) else "no finite val"
    last = summary["val_loss"]
    if step == it:
        lines.append(f"the run's model: step {step}, the last ({summary['model_checkpoint']}): {best}{full}")
    else:
        lines.append(f"the run's model: step {step}, its best ({summary['model_checkpoint']}): {best}{full}; "
                     f"the last step's val {last:.4f} (ckpt_last.pt, kept for --resume)" if last is not None else "")
    return lines


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
            # Every rank meets the same mistake: rank 0 alone says it, and the others leave a moment later, or
            # torchrun would stop rank 0 as soon as one of them exits, perhaps before it has said anything.
            time.sleep(1.0)
            raise QuietExit(str(err)) from None
        finally:
            distributed.shutdown()  # also on errors and Ctrl-C, so torchrun's other ranks are released
    return 130 if result.get("stopped") else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
