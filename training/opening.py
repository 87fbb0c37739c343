"""Opening a run: checks, the folder, the checkpoint, the data, the Run built; a CPU run's estimates."""
from __future__ import annotations

import contextlib
import copy
import inspect
import math
import os
import re
import shlex
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from common.machine import Runtime, Threads, check_free_memory, choose_threads, is_out_of_memory, setup, span, sync
from common.run_folder import BEST, RunDir, find, read_summary
from configs import TrainConfig
from configs.fit import PRESET, chosen as fit_settings, fitted_line
from configs.loader import check_same_model, init_config, resume_config
from configs.schema import FIXED
from data import Batches, CharTokenizer, Corpus, Prepared, default_cache_dir, prepare, resolve
from data.corpus import NAMED
from data.gate import recorded_size
from data.prepare import ShortSplit, short_split
from data.tokenizer import vocabulary_difference
from errors import UserError
from model import GPT, ModelConfig
from model.scoring import FORMS
from training import checkpoint
from training.checkpoint import Progress
from training.device import Dist, compile_wanted, flops_per_token, step_and_eval_models
from training.evaluation import evaluations_left, plateaued
from training.optim import configure_optimizer, get_lr
from training.report import TENSORBOARD_URL, Log, Phases, resume_command


@dataclass
class Run:
    cfg: TrainConfig
    rt: Runtime
    prepared: Prepared
    tokenizer: CharTokenizer
    batches: Batches
    model_cfg: ModelConfig
    model: GPT  # the module whose weights are saved
    step_model: object  # the model, in DDP and/or compiled
    optimizer: object
    scaler: torch.amp.GradScaler
    tokens_per_iter: int
    flops_per_token: float
    phases: Phases
    eval_model: object
    threads: Threads | None = None

    @property
    def data_info(self) -> dict:
        info = {k: self.prepared.meta[k] for k in ("source", "sha256", "bytes", "n_chars", "n_train", "n_val",
                                                    "vocab_size")}
        info["first_char"] = self.tokenizer.chars[int(self.batches.data["train"][0])]  # sample.py's default prompt
        return info


def check_paths(cfg: TrainConfig) -> None:
    data = Path(cfg.data).expanduser()
    for option, value in (("--cache_dir", cfg.cache_dir), ("--out_dir", cfg.out_dir)):
        path = Path(value).expanduser()
        if value and path.exists() and not path.is_dir():
            raise UserError(f"{option} {value} is a file, not a folder; choose another {option}")
        if value and data.is_dir() and path.resolve().is_relative_to(data.resolve()):
            raise UserError(f"{option} {value} is inside the --data folder {cfg.data}; choose one outside it")
    try:
        cfg.out_dir.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"--out_dir {cfg.out_dir}: the name is not valid UTF-8; choose a name in UTF-8") from None


def choose_corpus(cfg: TrainConfig, say, fallback: bool = True) -> tuple[TrainConfig, Corpus]:
    """The corpus; without --out_dir, the folder is out/<preset>-<corpus>."""
    corpus = resolve(cfg.data, default_cache_dir(cfg.cache_dir), say=say, fallback=fallback)
    if cfg.data in NAMED:
        cfg.data = corpus.name
    if not cfg.out_dir:
        path = Path(corpus.name)
        label = corpus.name if corpus.name in NAMED else (path.stem if path.is_file() else path.name)
        label = re.sub(r"[^\w.-]+", "_", label)[:40] or "corpus"  # letters of any script, digits, . _ -
        cfg.out_dir = f"out/{cfg.config_name}-{label}"
        if cfg.init_from:  # out/<that run>+<corpus>
            start = Path(cfg.init_from)
            cfg.out_dir = f"out/{(start if start.is_dir() else start.parent).resolve().name}+{label}"
    return cfg, corpus


def prepare_data(cfg: TrainConfig, say, corpus: Corpus | None = None, base_vocab: str = "", check=None) -> Prepared:
    cache_dir = default_cache_dir(cfg.cache_dir)
    corpus = corpus or resolve(cfg.data, cache_dir, say=say)
    return prepare(corpus, cache_dir, cfg.val_fraction, cfg.encoding, cfg.encoding_errors, say=say,
                   base_vocab=base_vocab, check=check)


def same_text(resumed: dict, source: Path, data_named: bool):
    """prepare()'s check of a resumed run's text."""
    recorded = resumed.get("data", {}).get("sha256")

    def check(sha256: str, vocab: str | None) -> None:
        if not data_named and recorded not in (None, sha256):
            raise UserError(f"--resume: the text {source} names has changed (its checksum differs); put the original "
                            f"back, or give --data to train on another text")
        if vocab is not None and vocab != resumed["vocab"]:
            differ = vocabulary_difference(vocab, resumed["vocab"], ("the corpus", "the checkpoint's"))
            raise UserError(f"--resume: the corpus's vocabulary differs from {source}'s ({differ}); resume with the "
                            f"same --data")
    return check


def check_recorded_text(data: str, resumed: dict, source: Path) -> None:
    path = Path(data).expanduser()
    if not path.exists():
        raise UserError(f"--resume: the text this run trained on, {data}, is no longer there; put it back, or give "
                        f"its new place with --data")
    if why := recorded_size(path, resumed.get("data", {})):
        raise UserError(f"--resume: {source} names {data} as its text, but {why}, so it was not read; put it back, or "
                        f"give --data {shlex.quote(data)} to go on with this one")


@contextlib.contextmanager
def short_text_for_kept_model(cfg: TrainConfig, resumed: dict | None, init: dict | None) -> Iterator[None]:
    """A text too short for a kept block_size, said with its fix."""
    try:
        yield
    except ShortSplit as err:
        if resumed is None and init is None:
            raise
        short = short_split(err.shortfall.sizes, cfg.block_size)
        problem = short.problem(f" of {cfg.data}")
        if resumed is not None:
            source = resumed.get("data", {}).get("source")
            line = (f"--resume: {problem}, and a resume keeps the run's block_size ({cfg.block_size}) and val_fraction "
                    f"({cfg.val_fraction:g}); resume on a longer text"
                    f"{f' (this run was trained on {source})' if source else ''}")
            new_run = "in another --out_dir"
        else:
            line = (f"--init_from: {problem}, and fine-tuning keeps the model's block_size ({cfg.block_size}); give a "
                    f"longer text{short.other_fraction}")
            new_run = "without --init_from"
        if short.largest >= 1:
            line += f", or train a new run on this text with --block_size {short.largest} or less {new_run}"
        raise UserError(line) from None


def finished_run(run_dir: RunDir, state: dict, cfg: TrainConfig) -> str | None:
    """The line of a resumed run with nothing left to do."""
    since_best = state.get("evals_since_best", 0)
    if state["iter"] < cfg.max_iters and not plateaued(since_best, cfg.patience):
        return None
    summary = read_summary(run_dir.path)
    if summary is None:
        return None
    try:
        loss = f", full validation {summary['full_val_loss']:.4f}" if "full_val_loss" in summary else ""
        model = (f" (its model: step {summary['model_step']}, {summary['model_checkpoint']})"
                 if "model_step" in summary else "")
    except (ValueError, TypeError, KeyError):
        return None
    if state["iter"] < cfg.max_iters:
        return (f"{run_dir.path} stopped early at step {state['iter']}{model}{loss}: {since_best} evaluations did not "
                f"improve. To train on: {resume_command(run_dir.path, '--patience 0')}")
    more = f"--max_iters {max(state['iter'], cfg.max_iters) * 2}"
    return (f"{run_dir.path} finished at step {state['iter']}{model}{loss}; nothing to do. To train further: "
            f"{resume_command(run_dir.path, more)}")


def fit_to_text(cfg: TrainConfig, explicit: set[str], meta: dict, say) -> None:
    """A new run of the default preset takes configs.fit's settings, below the user's."""
    if cfg.config_name != PRESET:
        return
    chosen = fit_settings(meta["n_train"], meta["vocab_size"], explicit, cfg.n_head)
    for name, value in chosen.items():
        setattr(cfg, name, value)
    if chosen:
        say(fitted_line(meta["n_train"], meta["vocab_size"], chosen))


def open_run(cfg: TrainConfig, explicit: set[str], d: Dist, run_dir: RunDir, log: Log, stop,
             phases: Phases, corpus: Corpus | None, update: Callable):
    """(run, progress, the checkpoint resumed from or None), or a finished run's line."""
    resumed = source = init = start = None
    with d.together():
        if d.is_main:
            check_paths(cfg)
            run_dir.claim(log.say, cfg.resume)
            if not cfg.resume:
                run_dir.check_new_run(cfg.overwrite, log.say)
    with d.together():
        if cfg.resume:
            source, resumed, cfg = read_resume(cfg, explicit, run_dir, stop, log.say, d.world_size)
            if done := finished_run(run_dir, resumed, cfg):
                return done
            if "data" not in explicit and cfg.data not in NAMED:
                check_recorded_text(cfg.data, resumed, source)
        elif cfg.init_from:
            start = Path(cfg.init_from).expanduser()
            if not start.exists():
                raise UserError(f"--init_from {cfg.init_from}: no such path; give a trained run's folder or checkpoint")
            start = find(str(start), "") if start.is_dir() else start
            init = checkpoint.load(start)
            cfg = init_config(cfg, explicit, init, start, log.say)
        # A fine-tuned run's vocabulary begins with its first model's, so the old ids keep their meaning.
        base_vocab = (resumed if resumed is not None else init)["vocab"] if cfg.init_from else ""
        check = same_text(resumed, source, "data" in explicit) if resumed is not None else None
        if d.is_main:
            with phases.timing("data"), short_text_for_kept_model(cfg, resumed, init):
                prepared = prepare_data(cfg, log.say, corpus, base_vocab, check)
            say_what_was_read(prepared, cfg, init, start, log.say)
    with d.together():
        if not d.is_main:
            with phases.timing("data"):
                prepared = prepare_data(cfg, log.say, base_vocab=base_vocab, check=check)
        resumed = best_anew_on_other_text(resumed, prepared, log.say)
        if not (cfg.resume or cfg.init_from):
            fit_to_text(cfg, explicit, prepared.meta, log.say)
        rt = setup(cfg.device, cfg.dtype, cfg.num_threads, d.local_rank)
        refuse_if_too_big(cfg, rt, stop.saved)
        try:
            with short_text_for_kept_model(cfg, resumed, init):
                run, progress = build_run(cfg, rt, prepared, d, log.say, resumed, init, phases)
        except (RuntimeError, KeyError, ValueError, TypeError) as err:
            if resumed is None or is_out_of_memory(err):
                raise
            raise UserError(f"{source} does not fit this model ({str(err).splitlines()[0][:150]}); it is damaged or "
                            f"from another version") from None
    if rt.device_type == "cpu":
        run.threads = choose_threads(cfg.num_threads, ProbeStep(run, update) if d.is_main else None, timed=True)
        if run.threads.why == "asked" and cfg.resume and "num_threads" not in explicit:
            run.threads.why = "kept"
        cfg.num_threads = run.threads.count  # so a resume keeps the last digits
    return run, progress, source


def read_resume(cfg: TrainConfig, explicit: set[str], run_dir: RunDir, stop, say, world_size: int):
    """--resume: (the checkpoint's path, its state, the run's settings)."""
    if cfg.overwrite:
        raise UserError("--resume continues the run in --out_dir and --overwrite replaces it: give one")
    source = run_dir.resume_from()
    resumed = checkpoint.load(source, resume=True)
    stop.saved, stop.resume = f"{source} (step {resumed['iter']}) is untouched", resume_command(run_dir.path)
    old, cfg = resume_config(cfg, explicit, resumed, say, source, world_size)
    step = resumed["iter"]
    if cfg.max_iters != old.max_iters and not old.lr_decay_iters and step < cfg.max_iters:  # the schedule moves
        before, after = get_lr(step, old), get_lr(step, cfg)
        if not math.isclose(before, after, rel_tol=1e-9):
            say(f"resume: the learning-rate schedule is stretched from {old.max_iters} to {cfg.max_iters} steps: at "
                f"step {step} the rate goes from {before:.3g} to {after:.3g}. To keep it, add --lr_decay_iters "
                f"{old.max_iters}")
    check_same_model(cfg, resumed, source)
    return source, resumed, cfg


def say_what_was_read(prepared: Prepared, cfg: TrainConfig, init: dict | None, start, say) -> None:
    chars = prepared.tokenizer.chars
    if len(chars) == 1:
        say(f"note: {prepared.meta['source']} holds one distinct character, {chars!r}: there is nothing to learn")
    if init is not None:
        new = chars[len(init["vocab"]):]
        shown = "".join(f" {ch!r}" for ch in new[:12]) + (" ..." if len(new) > 12 else "")
        say(f"fine-tuning {start} (step {init['iter']}) with its settings (optimizer {cfg.optimizer}, learning_rate "
            f"{cfg.learning_rate:g}, dtype {cfg.dtype}, max_iters {cfg.max_iters}); vocabulary: its "
            f"{len(init['vocab'])} characters + {len(new)} new{':' + shown if new else ''}")


def best_anew_on_other_text(resumed: dict | None, prepared: Prepared, say) -> dict | None:
    recorded = resumed.get("data", {}).get("sha256") if resumed is not None else None
    if recorded in (None, prepared.meta["sha256"]):
        return resumed
    best = resumed["best_val_loss"]
    say(f"note: the text of {prepared.meta['source']} is not the text step {resumed['iter']} was trained "
        f"on (its checksum differs), so {BEST}{f' (val {best:.4f})' if math.isfinite(best) else ''} is replaced "
        f"at the next evaluation")
    return {**resumed, "best_val_loss": math.inf, "evals_since_best": 0}


# ---- building the run ------------------------------------------------------------------------------------------------
def build_run(cfg: TrainConfig, rt: Runtime, prepared: Prepared, d: Dist = Dist(), say=print,
              resumed: dict | None = None, init: dict | None = None,
              phases: Phases | None = None) -> tuple[Run, Progress]:
    """The loader, model, optimizer and scaler, drawn in a fixed order from one seed."""
    batches = Batches(prepared, cfg.block_size, cfg.batch_size, rt.device, cfg.seed, d.rank, d.world_size)
    torch.manual_seed(cfg.seed)
    model_cfg = cfg.model_config(prepared.tokenizer.vocab_size)
    model = GPT(model_cfg).to(rt.device)  # the same seed gives every rank the same initial weights
    if init is not None:
        graft(model, init["model"])
    if d.world_size > 1:
        torch.manual_seed(cfg.seed + d.rank)  # but different dropout masks
    optimizer = optimizer_for(model, cfg, rt)
    run = Run(cfg=cfg, rt=rt, prepared=prepared, tokenizer=prepared.tokenizer, batches=batches, model_cfg=model_cfg,
              model=model, step_model=model, eval_model=model, optimizer=optimizer, scaler=rt.grad_scaler(),
              tokens_per_iter=cfg.batch_size * cfg.block_size * cfg.grad_accum_steps * d.world_size,
              flops_per_token=flops_per_token(model.num_params(non_embedding=False), model_cfg),
              phases=phases or Phases())
    progress = checkpoint.restore(run, resumed, d) if resumed is not None else Progress()

    def wrap(module: torch.nn.Module) -> torch.nn.Module:
        # The only buffers are the rotary tables, alike everywhere: no broadcast.
        no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                   else {"broadcast_buffers": False})
        return DDP(module, device_ids=[d.local_rank] if rt.device_type == "cuda" else None,
                   **no_sync) if d.enabled else module

    def gave_up() -> None:  # a resume does not retry a failed compilation
        cfg.compile = "false"
        say("note: the run's config now says --compile false, so a resume does not try again (--resume --compile "
            "true does)")
    run.step_model, run.eval_model = step_and_eval_models(model, wrap, cfg.compile, rt.device_type, cfg.compile_mode,
                                                          cfg.compile_scope, cfg.compile_eval, say, gave_up)
    return run, progress


def optimizer_for(model: GPT, cfg: TrainConfig, rt: Runtime):
    return configure_optimizer(model, cfg.learning_rate, cfg.weight_decay, (FIXED["beta1"], cfg.beta2),
                               rt.device_type, cfg.optimizer, cfg.muon_dtype)


def graft(model: GPT, weights: dict) -> None:
    """Fine-tuning: the trained weights into model; a new character's rows start as their mean."""
    own, weights = model.state_dict(), dict(weights)
    for name in ("wte.weight", "lm_head.weight"):
        trained = weights.get(name)
        if trained is not None and len(trained) < len(own[name]):
            mean = trained.float().mean(0).to(trained.dtype)
            weights[name] = torch.cat([trained, mean.expand(len(own[name]) - len(trained), -1)])
    model.load_state_dict(weights)


def say_what_runs(run: Run, run_dir: RunDir, log: Log, d: Dist) -> None:
    cfg, where = run.cfg, shlex.quote(str(run_dir.path))
    with_table = (f" ({run.model.num_params(False) / 1e6:.2f}M with the position table)"
                  if run.model.wpe is not None else "")
    log.say(f"{run.prepared.meta['source']}: {run.prepared.meta['n_chars']:,} characters, vocabulary "
            f"{run.tokenizer.vocab_size}; model {run.model.num_params() / 1e6:.2f}M parameters{with_table}; "
            f"{run.rt.describe()}")
    log.say(f"global batch: {cfg.batch_size} sequences x {cfg.grad_accum_steps} accumulation steps x {d.world_size} "
            f"process{'es' if d.world_size > 1 else ''} = {run.tokens_per_iter:,} tokens per step"
            + (f"; DDP over {torch.distributed.get_backend()}" if d.enabled else ""))
    if run.threads is not None:
        log.say(run.threads.line(f"a step{step_timed(run)}"))
    log.say(f"run folder: {where}; watch it: tensorboard --logdir {where}, then open {TENSORBOARD_URL}")
    if compile_wanted(cfg.compile, run.rt.device_type):  # so the first wait does not look like a hang
        mode = "" if cfg.compile_mode == "default" else f", mode {cfg.compile_mode}"
        waits = "the first evaluation and the first step wait" if cfg.compile_eval else "the first step waits"
        log.say(f"torch.compile (scope {cfg.compile_scope}{mode}): {waits} while it compiles, longest on a machine's "
                f"first run (its cache serves later ones); --compile false skips it")


# ---- on a CPU, before the first step: memory, threads, time ----------------------------------------------------------
SLOW_RUN_SECONDS = 600  # a longer CPU run says what cuts it
GPU_PRESETS = ("shakespeare_char", "shakespeare_char_gpu")
CPU_PRESET = "shakespeare_char_cpu"


# A step's peak memory, in bytes per batch_size x block_size x n_embd x n_layer (docs/speed.md).
ACTIVATION_BYTES = {torch.bfloat16: 80, torch.float32: 110}
WEIGHT_BYTES = 4  # the explicit path's attention weights, per batch_size x n_head x block_size² x n_layer
PARAMETER_BYTES = 16  # a weight, its gradient, two moments


def refuse_if_too_big(cfg: TrainConfig, rt: Runtime, saved: str) -> None:
    """Refuse a run that needs more memory than is free (the system would kill it unsaid)."""
    layers = max(cfg.n_layer, 1)
    activation_bytes = ACTIVATION_BYTES.get(rt.dtype, ACTIVATION_BYTES[torch.float32])
    need = (activation_bytes * cfg.batch_size * cfg.block_size * cfg.n_embd * layers
            + PARAMETER_BYTES * 12 * cfg.n_layer * cfg.n_embd ** 2
            + (windows := 8 * cfg.eval_iters * cfg.batch_size))  # an evaluation's window starts, drawn at once
    if cfg.attention == "explicit" or not FORMS[cfg.attention_score].fused:
        need += WEIGHT_BYTES * cfg.batch_size * cfg.n_head * cfg.block_size ** 2 * cfg.n_layer
    fix = ("lower --eval_iters: most of it is each evaluation's windows" if windows > need / 2 else
           "lower --batch_size (or --block_size, --n_embd, --n_layer)")
    need *= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun: each process on this machine
    check_free_memory(need, rt.device, f"a model of n_layer {cfg.n_layer} x n_embd {cfg.n_embd} with batch_size "
                      f"{cfg.batch_size} x block_size {cfg.block_size}", f"{fix}; {saved}")


class Estimate(NamedTuple):
    """Where a CPU run's seconds would go."""
    steps: float
    evaluations: float
    samples_and_pictures: float
    full_validation: float


PROBE_FLOPS = 1e11  # past this, ProbeStep times part of a micro-batch and scales up


class ProbeStep:
    """One step's seconds, timed on a copy of the model; update is train.py's."""

    def __init__(self, run: Run, update: Callable):
        self.rt, self.cfg, self.update = run.rt, run.cfg, update
        self.model = copy.deepcopy(run.model).eval()
        self.optimizer = optimizer_for(self.model, run.cfg, run.rt)
        self.scaler = run.rt.grad_scaler()
        self.x, self.y = next(run.batches.val_windows())
        self.rows = probe_rows(run)

    def __call__(self) -> float:
        start = time.perf_counter()
        with self.rt.autocast():
            loss = self.model(self.x[:self.rows], self.y[:self.rows])[1]
        self.scaler.scale(loss).backward()
        self.update(self.model, self.optimizer, self.scaler, self.cfg, self.cfg.learning_rate, self.rt)
        sync(self.rt.device)
        return (time.perf_counter() - start) * self.cfg.batch_size / self.rows * self.cfg.grad_accum_steps


def probe_rows(run: Run) -> int:
    sequence_flops = run.flops_per_token * run.cfg.block_size
    return max(1, min(run.cfg.batch_size, int(PROBE_FLOPS // sequence_flops)))


def step_timed(run: Run) -> str:
    rows, sequences = probe_rows(run), run.cfg.batch_size * run.cfg.grad_accum_steps
    return "" if rows == sequences else f", scaled from {rows} of its {sequences} sequences"


def estimate_due(run: Run, progress: Progress) -> bool:
    return run.threads is not None and bool(run.threads.steady) and progress.it < run.cfg.max_iters


def expected_seconds(run: Run, progress: Progress, step: float, records: float) -> Estimate:
    """Where the rest of the run's time goes at `step` seconds a step."""
    cfg = run.cfg
    forward = step / cfg.grad_accum_steps / 3  # a forward pass: a third of a step
    evaluations = evaluations_left(progress.it, cfg)
    val_batches = run.batches.num_val_batches()
    per_evaluation = cfg.eval_iters + min(cfg.eval_iters, val_batches)
    return Estimate((cfg.max_iters - progress.it) * step, evaluations * per_evaluation * forward,
                    evaluations * records, val_batches * forward if cfg.full_val else 0.0)


def duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 else \
        f"{seconds:.0f} s"


def durations(low: float, high: float) -> str:
    """'about 18 s', 'about 18-24 s' or 'about 50 s-1 min'."""
    first, last = duration(low), duration(high)
    number, unit = first.split()
    return f"about {last}" if first == last else f"about {number if last.endswith(' ' + unit) else first}-{last}"


def say_estimate(run: Run, progress: Progress, log: Log, records: float) -> None:
    """On a CPU: how long the run will take, where the time goes, and what cuts a slow one."""
    if not estimate_due(run, progress):
        return
    cfg, steady, so_far = run.cfg, run.threads.steady, run.phases.so_far()
    low, middle, high = (expected_seconds(run, progress, step, records) for step in
                         (min(steady), statistics.median(steady), max(steady)))
    run.phases.expected = (so_far + sum(low), so_far + sum(high))
    steps_left = cfg.max_iters - progress.it
    parts = [(middle.steps, f"{steps_left} steps x {span(steady)}{step_timed(run)}", "a lower --max_iters"),
             (middle.evaluations, f"evaluations {duration(middle.evaluations)}",
              "a lower --eval_iters or a larger --eval_interval"),
             (middle.samples_and_pictures, f"their samples and pictures {duration(middle.samples_and_pictures)}",
              "a lower --sample_chars or --log_attention false"),
             (middle.full_validation, f"the final full validation {duration(middle.full_validation)}",
              "--full_val false")]
    parts = parts[:1] + [part for part in parts[1:] if part[0] >= 0.5]  # no "0 s" parts
    what = ", ".join(what for _, what, _ in parts)
    expected = durations(*run.phases.expected)
    if so_far + sum(middle) < SLOW_RUN_SECONDS:
        log.say(f"this run: {expected} in all ({what})")
        return
    fixes = [fix for _, _, fix in sorted(parts, key=lambda part: -part[0])[:2]]
    if cfg.config_name != CPU_PRESET:
        fixes.insert(0, f"--config {CPU_PRESET}")
    if run.threads.why != "measured" and run.threads.count > 1:  # on a busy machine one thread can be faster
        fixes.insert(0, "--num_threads 0, which measures the faster thread count")
    made_for = f"{cfg.config_name} is made for a GPU; " if cfg.config_name in GPU_PRESETS else ""
    log.say(f"note: {made_for}on this CPU this run would take {expected} ({what}); for a shorter one: "
            f"{'; or '.join(fixes)}")
