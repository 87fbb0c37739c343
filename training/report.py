"""What a run tells its user: what it trains at the start, the losses, a sample and attention pictures at each
evaluation (to TensorBoard), and at the end which step's model it hands over, with its figures."""
from __future__ import annotations

import math
import shlex
from typing import TYPE_CHECKING

import torch

from configs import TrainConfig
from model.generate import generate
from training import checkpoint, runtime
from training.build import Progress, Run
from training.compiling import compile_wanted
from training.distributed import Dist
from training.log import Log
from training.run_dir import RunDir
from training.stop import StopRequest

if TYPE_CHECKING:
    from training.pictures import AttentionPictures  # matplotlib: imported only by runs that draw


# TensorBoard's Time Series with its smoothing at 0 (a query parameter it reads): a validation loss measured at a few
# evaluations is otherwise drawn well above its values by the default smoothing of 0.6.
TENSORBOARD_URL = "http://localhost:6006/?smoothing=0#timeseries"
# The largest model scripts/attention_html.py puts into its page: every weight as float32 is 16 MB, about 21 MB of page.
PAGE_MAX_PARAMETERS = 4_000_000


def say_what_runs(run: Run, run_dir: RunDir, log: Log, d: Dist) -> None:
    """The corpus, the model, the device, the global batch, and where to watch the run."""
    cfg, where = run.cfg, shlex.quote(str(run_dir.path))
    params = run.model.num_params()
    with_table = f" ({run.model.num_params(False) / 1e6:.2f}M with the position table)" if run.model.wpe is not None else ""
    log.say(f"{run.prepared.meta['source']}: {run.prepared.meta['n_chars']:,} characters, vocabulary "
            f"{run.tokenizer.vocab_size}; model {params / 1e6:.2f}M parameters{with_table}; {run.rt.describe()}")
    log.say(f"global batch: {cfg.batch_size} sequences x {cfg.grad_accum_steps} accumulation steps x {d.world_size} "
            f"process{'es' if d.enabled else ''} = {run.tokens_per_iter:,} tokens per step")
    log.say(f"run folder: {where}; watch it: tensorboard --logdir {where}, then open "
            f"{TENSORBOARD_URL} (the loss first, drawn unsmoothed)")
    if compile_wanted(cfg.compile, run.rt.device_type):  # else the wait before step 0 would look like a hang
        mode = "" if cfg.compile_mode == "default" else f", mode {cfg.compile_mode}"
        log.say(f"torch.compile (scope {cfg.compile_scope}{mode}): the first evaluation and the first step wait "
                f"while it compiles, longest on a machine's first run (its cache serves later ones); --compile false "
                f"skips it")


def attention_probe(run: Run) -> list[int]:
    """The fixed text whose attention is pictured at every evaluation: the start of the validation split."""
    return [int(t) for t in run.batches.data["val"][: min(run.cfg.block_size, 48)]]


class SampleStopped(Exception):
    """A stop request came while the evaluation's sample was drawn."""


def record_evaluation(run: Run, progress: Progress, log: Log, losses: dict, pictures: AttentionPictures | None,
                      stop: StopRequest | None = None) -> None:
    """Rank 0: the losses, a generated sample and attention maps (drawn by pictures) to TensorBoard. A stop request
    while the sample is drawn ends the sample there (it is not logged); the evaluation's checkpoints are saved as
    usual."""
    cfg, it = run.cfg, progress.it
    log.scalars(it, {"loss/train_eval": losses["train"], "loss/val": losses["val"]})
    with run.phases.timing("samples and pictures"):
        if cfg.sample_chars:
            prompt = run.tokenizer.encode(run.tokenizer.default_prompt(run.data_info["first_char"]))
            generator = torch.Generator(device=run.rt.device).manual_seed(cfg.seed)
            run.model.eval()  # no dropout while sampling
            def stop_if_asked(tokens: torch.Tensor) -> None:  # called as the characters are drawn
                if stop is not None and stop.requested:
                    raise SampleStopped

            try:
                with runtime.for_sampling(run.rt, cfg.dtype).autocast():  # float32 weights: on a CPU, auto is float32
                    text = generate(run.model, [prompt], cfg.sample_chars, generator=generator, on_tokens=stop_if_asked)
                log.text("samples", run.tokenizer.decode(text[0]), it)
            except SampleStopped:
                pass
            finally:
                run.model.train()
        if pictures is not None:
            from training.pictures import attention_weights
            for layer, weights in enumerate(attention_weights(run.model, attention_probe(run))):
                # a group that TensorBoard's Time Series (alphabetical) lists after loss/, optim/, perf/, summary/;
                # layers counted from 1, as everywhere a person reads them
                log.image(f"where_attention_looks/layer_{layer + 1}", pictures.render(weights, layer), it)


def step_line(it: int, cfg: TrainConfig, loss: float, step_seconds: float, tokens_per_sec: float, mfu: float) -> str:
    return (f"step {it}/{cfg.max_iters}: loss {loss:.4f}, {step_seconds * 1000:.1f} ms/step, {tokens_per_sec:,.0f} "
            f"tokens/s, mfu {mfu * 100:.1f}%")


def too_many_nonfinite(it: int, cfg: TrainConfig, run_dir: RunDir) -> str:
    return (f"stopped at step {it}: {cfg.max_nonfinite_steps} steps in a row had a non-finite loss or gradient (they "
            f"were skipped); the last good checkpoint is {run_dir.path / checkpoint.LAST}; try a lower "
            f"--learning_rate or --dtype float32, then --resume")


def out_of_memory(cfg: TrainConfig, saved: str, figures: str = "") -> str:
    """The one line for a run that ran out of memory (or would: figures then says by how much)."""
    return (f"out of memory{figures} for a model of n_layer {cfg.n_layer} x n_embd {cfg.n_embd} with batch_size "
            f"{cfg.batch_size} x block_size {cfg.block_size}; lower --batch_size (or --block_size, --n_embd, "
            f"--n_layer); {saved}")


def stopped_line(it: int, run_dir: RunDir, in_final_validation: bool) -> str:
    """What a run stopped by a request says: where its step is saved and the command that goes on."""
    where = shlex.quote(str(run_dir.path))
    if in_final_validation:
        return (f"stopped during the final validation; step {it} is saved in {run_dir.path / checkpoint.LAST}. "
                f"Finish it with: python train.py --out_dir {where} --resume")
    return (f"stopped at step {it}; saved {run_dir.path / checkpoint.LAST}. Continue with: "
            f"python train.py --out_dir {where} --resume")


def done_lines(summary: dict, cfg: TrainConfig, progress: Progress) -> list[str]:
    """What a finished run says: its steps and time, which step's model it hands over and that model's figures, and
    the last step's validation estimate beside it."""
    it, step = summary["iterations"], summary["model_step"]
    # Training time counts every session of a resumed run; the wall clock only this process's (the next line, where
    # the time went, is this session's too).
    train, wall = summary["train_seconds"], summary["wall_seconds"]
    lines = [f"done: {it} steps, {train:.1f} s of training steps in all its sessions; this session took {wall:.1f} s"
             if cfg.resume else f"done: {it} steps, {train:.1f} s of training ({wall:.1f} s in all)"]
    if summary["stopped_early"]:
        lines[0] += (f"; stopped early: {progress.evals_since_best} evaluations in a row did not beat step {step}'s "
                     f"validation loss (--patience {cfg.patience}; --patience 0 trains on to --max_iters {cfg.max_iters})")
    full = (f", full validation {summary['full_val_loss']:.4f} ({summary['full_val_bits_per_char']:.3f} bits/char)"
            if "full_val_loss" in summary else "")
    last = summary["val_loss"]
    if summary["model_checkpoint"] == checkpoint.LAST:  # no (readable) best checkpoint: the last model, its figures
        val = f"val {last:.4f}" if last is not None else "no val"
        return [*lines, f"the run's model: step {step}, its last ({checkpoint.LAST}; no readable {checkpoint.BEST}): "
                        f"{val}{full}"]
    best = f"val {summary['best_val_loss']:.4f}" if math.isfinite(summary["best_val_loss"]) else "no finite val"
    which = "its last and best" if step == it else "its best"
    model = f"the run's model: step {step}, {which} ({checkpoint.BEST}): {best}{full}"
    if step != it and last is not None:
        model += f"; the last step's val {last:.4f} ({checkpoint.LAST}, kept for --resume)"
    return [*lines, model]
