"""train.py: train a character-level GPT. Reads top to bottom: config, data, model, the loop, the summary."""
from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from configs import TrainConfig, load_config
from configs.loader import config_from_dict
from configs.schema import ARCHITECTURE_FIELDS
from data import Batches, default_cache_dir, prepare, resolve
from errors import UserError, run_cli
from model import GPT
from model.generate import generate
from model.optim import configure_optimizer, step_if_finite
from training import checkpoint, distributed, runtime
from training.perf import flops_per_token, measure_peak_flops
from training.pictures import attention_figure, attention_weights


def get_lr(it: int, cfg: TrainConfig) -> float:
    """Linear warm-up to learning_rate, then a cosine decay to min_lr at lr_decay_iters (default: max_iters)."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


@torch.inference_mode()
def evaluate(model, batches: Batches, rt: runtime.Runtime, eval_iters: int,
             d: distributed.Dist = distributed.Dist()) -> dict[str, float]:
    """Mean loss over eval_iters random batches of each split (a quick estimate), averaged over ranks."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        total = torch.zeros((), device=rt.device)
        for _ in range(eval_iters):
            x, y = batches.get_batch(split)
            with rt.autocast():
                total += model(x, y)[1].float()
        out[split] = d.mean(total).item() / eval_iters
    model.train()
    return out


@torch.inference_mode()
def full_validation_loss(model, batches: Batches, rt: runtime.Runtime,
                         d: distributed.Dist = distributed.Dist()) -> float:
    """The exact mean loss over every non-overlapping validation window (shared out among the ranks)."""
    model.eval()
    total = torch.zeros(2, device=rt.device, dtype=torch.float64)  # (sum of losses, number of characters)
    for x, y in batches.val_windows():
        with rt.autocast():
            loss = model(x, y)[1]
        total += torch.stack([loss.double() * y.numel(), torch.tensor(y.numel(), device=rt.device)])
    model.train()
    total = d.sum(total)
    return (total[0] / total[1]).item()


def train_step(model, optimizer, scaler, batches: Batches, rt: runtime.Runtime, cfg: TrainConfig,
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
        step_if_finite(optimizer, finite, on_device=rt.device_type != "cpu")  # a CPU reads the flag for free
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, finite


def prepare_out_dir(cfg: TrainConfig, is_main: bool = True) -> Path:
    """Refuse to mix two runs in one folder; --overwrite clears the old run's files first (rank 0 only)."""
    out_dir = Path(cfg.out_dir)
    if not is_main:
        return out_dir
    for stale in out_dir.glob("*.tmp-*"):  # a checkpoint write cut short by a crash; the previous file is intact
        stale.unlink()
    old_files = [p for pattern in ("ckpt_*.pt", "summary.json", "events.out.tfevents.*") for p in out_dir.glob(pattern)]
    if old_files and not cfg.resume:
        if not cfg.overwrite:
            raise UserError(f"{out_dir} already holds a run; pass --resume to continue it, --overwrite to replace it, "
                            f"or choose another --out_dir")
        for path in old_files:
            path.unlink()
        shutil.rmtree(out_dir / "hparams", ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def resume_config(cfg: TrainConfig, explicit: set[str], saved: dict, say) -> TrainConfig:
    """The saved run's config, with only the fields the user set now; architecture changes are refused."""
    old = config_from_dict(saved)
    values = old.to_dict()
    for name in sorted(explicit):
        new_value = getattr(cfg, name)
        if new_value == values.get(name):
            continue
        if name in ARCHITECTURE_FIELDS or name == "optimizer":  # the saved weights / optimizer state would not fit
            what = "the optimizer" if name == "optimizer" else "the architecture"
            raise UserError(f"--resume: {name} was {values[name]!r} in this run and cannot change to {new_value!r}; "
                            f"start a new run in another --out_dir to change {what}")
        if name not in ("resume", "overwrite"):
            say(f"resume: {name} changed from {values.get(name)!r} to {new_value!r}")
        values[name] = new_value
    return TrainConfig(**{**values, "resume": True})


class StopRequest:
    """Ctrl-C or SIGTERM asks the loop to stop at the next step boundary; another one, a second or more later, stops
    at once. (Under torchrun a Ctrl-C reaches each process twice, from the terminal and forwarded by torchrun, within
    milliseconds: that must still be one request, or the ranks would stop without saving.)"""

    GRACE_SECONDS = 1.0

    def __init__(self):
        self.requested = False
        self.first_at = 0.0
        self.previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def handle(self, signum, frame):
        if self.requested:
            if time.monotonic() - self.first_at >= self.GRACE_SECONDS:
                raise KeyboardInterrupt
            return
        self.requested, self.first_at = True, time.monotonic()

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def train(cfg: TrainConfig, explicit: set[str] = frozenset(), say=tqdm.write) -> dict:
    # ---- which process this is (torchrun starts one per GPU), where the run lives, what it continues
    d = distributed.from_environment()
    main_rank = d.is_main
    say = say if main_rank else (lambda message: None)  # rank 0 speaks for the job
    cfg.out_dir = cfg.out_dir or f"out/{cfg.config_name}"
    resumed = None
    if cfg.resume:
        last = Path(cfg.out_dir) / "ckpt_last.pt"
        if not last.exists():
            raise UserError(f"--resume: there is no {last} to continue; drop --resume to start a new run")
        resumed = checkpoint.load(last)
        cfg = resume_config(cfg, explicit | {"resume"}, resumed["run_config"], say)
    rt = runtime.setup(cfg.device, cfg.dtype, cfg.num_threads, d.local_rank)
    distributed.init(d, rt.device_type)
    out_dir = prepare_out_dir(cfg, main_rank)
    torch.manual_seed(cfg.seed)

    # ---- data (rank 0 downloads and prepares first; the others then find it in the cache) -----------
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    if not main_rank:
        d.barrier()
    corpus = resolve(cfg.data, cache_dir, say=say)
    prepared = prepare(corpus, cache_dir, cfg.val_fraction, cfg.encoding, cfg.encoding_errors)
    if main_rank:
        d.barrier()
    tokenizer = prepared.tokenizer
    if resumed is not None and resumed["vocab"] != tokenizer.chars:
        raise UserError(f"--resume: the corpus {corpus.name} has a different vocabulary from the checkpoint's; "
                        f"resume with the same --data")
    batches = Batches(prepared, cfg.block_size, cfg.batch_size, rt.device, cfg.seed, d.rank, d.world_size)
    data_info = {k: prepared.meta[k] for k in ("source", "sha256", "n_chars", "n_train", "n_val", "vocab_size")}

    # ---- model and optimizer -----------------------------------------------------------------------
    model_cfg = cfg.model_config(tokenizer.vocab_size)
    model = GPT(model_cfg).to(rt.device)  # the same seed gives every rank the same initial weights
    if d.enabled:
        torch.manual_seed(cfg.seed + d.rank)  # but different dropout masks
    optimizer = configure_optimizer(model, cfg.learning_rate, cfg.weight_decay, (cfg.beta1, cfg.beta2),
                                    rt.device_type, cfg.optimizer)
    scaler = rt.grad_scaler()
    start_iter, best_val = 0, float("inf")
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        if resumed.get("scaler"):
            scaler.load_state_dict(resumed["scaler"])
        start_iter, best_val = resumed["iter"], resumed["best_val_loss"]
        batches.load_state_dict(resumed["rng"]["batches"])  # the same stream, whatever the number of ranks
        if not d.enabled:
            torch.set_rng_state(resumed["rng"]["torch"])
            if rt.device_type == "cuda" and resumed["rng"].get("cuda") is not None:
                torch.cuda.set_rng_state(resumed["rng"]["cuda"].cpu())
    step_model = DDP(model, device_ids=[d.local_rank] if rt.device_type == "cuda" else None) if d.enabled else model
    step_model = runtime.maybe_compile(step_model, cfg.compile, rt.device_type, say, cfg.compile_mode)
    tokens_per_iter = cfg.batch_size * cfg.block_size * cfg.grad_accum_steps * d.world_size
    flops_token = flops_per_token(model.num_params(non_embedding=False), model_cfg)
    peak_flops = measure_peak_flops(rt.device, rt.dtype)

    # ---- logging -----------------------------------------------------------------------------------
    writer = SummaryWriter(log_dir=str(out_dir)) if main_rank else None
    if resumed is None and main_rank:
        writer.add_text("config", "```\n" + json.dumps(cfg.to_dict(), indent=1) + "\n```", 0)
    with_table = f" ({model.num_params(False) / 1e6:.2f}M with the position table)" if model.wpe is not None else ""
    say(f"{corpus.name}: {prepared.meta['n_chars']:,} characters, vocabulary {tokenizer.vocab_size}; "
        f"model {model.num_params() / 1e6:.2f}M parameters{with_table}; {rt.describe()}")
    say(f"global batch: {cfg.batch_size} sequences x {cfg.grad_accum_steps} accumulation steps x {d.world_size} "
        f"process{'es' if d.enabled else ''} = {tokens_per_iter:,} tokens per step")
    say(f"watch it: tensorboard --logdir {out_dir}")
    sample_gen = torch.Generator(device=rt.device)
    sample_rt = runtime.for_sampling(rt, cfg.dtype)
    prompt = [tokenizer.stoi.get("\n", 0)]
    probe = [int(t) for t in batches.data["val"][: min(cfg.block_size, 48)]]  # a fixed text for attention maps

    def save(it: int, name: str) -> None:
        state = {
            "model": model.state_dict(), "model_config": model_cfg.to_dict(), "run_config": cfg.to_dict(),
            "vocab": tokenizer.chars, "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else None, "iter": it, "best_val_loss": best_val,
            "data": data_info, "rng": {"torch": torch.get_rng_state(), "batches": batches.state_dict(),
                                       "cuda": torch.cuda.get_rng_state() if rt.device_type == "cuda" else None},
        }
        checkpoint.save(state, out_dir / name)

    def log_evaluation(it: int, losses: dict, improved: bool) -> None:
        """Rank 0: the losses, a generated sample and attention maps to TensorBoard, then the checkpoints."""
        writer.add_scalar("train/loss_eval", losses["train"], it)
        writer.add_scalar("val/loss", losses["val"], it)
        if cfg.sample_chars:
            sample_gen.manual_seed(cfg.seed)
            with sample_rt.autocast():
                text = generate(model, [prompt], cfg.sample_chars, generator=sample_gen)[0]
            writer.add_text("samples", "```\n" + tokenizer.decode(text) + "\n```", it)
        if cfg.log_attention:
            for layer, weights in enumerate(attention_weights(model, probe)):
                writer.add_figure(f"attention/layer_{layer}", attention_figure(weights, tokenizer.decode(probe), layer), it)
        if improved:
            save(it, "ckpt_best.pt")
        save(it, "ckpt_last.pt")

    # ---- the loop ----------------------------------------------------------------------------------
    it, losses, last_val, history, stopping = start_iter, {}, float("nan"), [], False
    # Skipped (non-finite) steps are counted on the device and read where the loop syncs anyway: the longest run of
    # them since the last look, and the run still going on.
    streak = torch.zeros((), dtype=torch.long, device=rt.device)
    longest = torch.zeros((), dtype=torch.long, device=rt.device)
    bar = tqdm(total=cfg.max_iters, initial=start_iter, dynamic_ncols=True, desc="train", disable=not main_rank,
               mininterval=0.5 if sys.stderr.isatty() else 30)  # a log file gets a line every 30 s, not every step
    clock, clock_it, started = time.perf_counter(), it, time.perf_counter()
    with StopRequest() as stop:
        while True:
            if (it % cfg.eval_interval == 0 or it == cfg.max_iters) and not (resumed is not None and it == start_iter):
                losses = evaluate(step_model, batches, rt, cfg.eval_iters, d)
                last_val, improved = losses["val"], losses["val"] < best_val
                best_val = min(best_val, losses["val"])
                if main_rank:
                    log_evaluation(it, losses, improved)
                bar.set_postfix_str(f"train {losses['train']:.4f} val {losses['val']:.4f}", refresh=False)
            # Every rank must stop at the same step, or the others hang. Under DDP asking them is a collective
            # (a host sync), so it is done every log_interval steps, where the loop syncs anyway.
            if not d.enabled or it % cfg.log_interval == 0:
                stopping = d.any(stop.requested, rt.device)
            if it >= cfg.max_iters or stopping:
                break
            lr = get_lr(it, cfg)
            loss, grad_norm, finite = train_step(step_model, optimizer, scaler, batches, rt, cfg, lr)
            streak = (streak + 1) * ~finite
            longest = torch.maximum(longest, streak)
            it += 1
            bar.update(1)
            if it % cfg.log_interval == 0 or it == cfg.max_iters:
                # the only host sync of the loop (and the evaluations'): one read for all three numbers
                loss_value, norm_value, skipped = torch.stack([loss.float(), grad_norm.float(), longest.float()]).tolist()
                if skipped >= cfg.max_nonfinite_steps:
                    bar.close()
                    if writer:
                        writer.close()
                    raise UserError(f"stopped at step {it}: {cfg.max_nonfinite_steps} steps in a row had a non-finite "
                                    f"loss or gradient (they were skipped); the last good checkpoint is "
                                    f"{out_dir / 'ckpt_last.pt'}; try a lower --learning_rate or --dtype float32, "
                                    f"then --resume")
                longest = streak
                now = time.perf_counter()
                tokens_per_sec = tokens_per_iter * (it - clock_it) / (now - clock)
                clock, clock_it = now, it
                history.append((it, loss_value))
                if main_rank:
                    for tag, value in (("train/loss", loss_value), ("train/lr", lr), ("train/grad_norm", norm_value),
                                       ("perf/tokens_per_sec", tokens_per_sec), ("perf/tokens_seen", it * tokens_per_iter),
                                       ("perf/mfu", flops_token * tokens_per_sec / peak_flops)):
                        writer.add_scalar(tag, value, it)
                bar.set_postfix_str(f"loss {loss_value:.4f} lr {lr:.2e} {tokens_per_sec:,.0f} tok/s val {last_val:.4f}",
                                    refresh=False)
    bar.close()
    wall = time.perf_counter() - started
    if stopping and it < cfg.max_iters:
        if main_rank:
            save(it, "ckpt_last.pt")
            writer.close()
        say(f"stopped at step {it}; saved {out_dir / 'ckpt_last.pt'}. Continue with: "
            f"python train.py --out_dir {out_dir} --resume")
        return {"stopped": True, "iterations": it, "history": history}

    # ---- the summary -------------------------------------------------------------------------------
    summary = {
        "config": cfg.config_name, "corpus": data_info["source"], "iterations": it,
        "train_loss": losses.get("train"), "val_loss": losses.get("val"), "best_val_loss": best_val,
        "tokens_seen": it * tokens_per_iter, "wall_seconds": wall,
        "tokens_per_sec": (it - start_iter) * tokens_per_iter / wall if wall > 0 else None, "device": rt.describe(),
        "processes": d.world_size,
    }
    if cfg.full_val:
        summary["full_val_loss"] = full_validation_loss(step_model, batches, rt, d)
        summary["full_val_bits_per_char"] = summary["full_val_loss"] / math.log(2)
    if not main_rank:
        return {**summary, "history": history}
    if cfg.full_val:
        writer.add_scalar("val/full_loss", summary["full_val_loss"], it)
    hparams = {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool))}
    metrics = {f"hparam/{k}": summary[k] for k in ("best_val_loss", "full_val_loss") if summary.get(k) is not None}
    writer.add_hparams(hparams, metrics, run_name="hparams")
    writer.close()
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    full = f", full validation {summary['full_val_loss']:.4f} ({summary['full_val_bits_per_char']:.3f} bits/char)" \
        if cfg.full_val else ""
    say(f"done: {it} steps in {wall:.1f} s, val {summary['val_loss']:.4f} (best {best_val:.4f}){full}")
    say(f"sample it: python scripts/sample.py --out_dir {out_dir}")
    return {**summary, "history": history}


def main(argv: list[str] | None = None) -> int:
    cfg, note, explicit = load_config(argv, torch.cuda.is_available())
    if distributed.from_environment().is_main:
        print(note)
    try:
        result = train(cfg, explicit)
    finally:
        distributed.shutdown()  # also on errors and Ctrl-C, so torchrun's other ranks are released
    return 130 if result.get("stopped") else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
