"""Building a run from its config (loader, model, optimizer, scaler), and the state a checkpoint saves and restores."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from configs import TrainConfig
from data import Batches, CharTokenizer, Prepared
from model import GPT, ModelConfig
from training import runtime
from training.compiling import step_and_eval_models
from training.distributed import Dist
from training.optim import configure_optimizer
from training.perf import flops_per_token
from training.phases import Phases


@dataclass
class Run:
    cfg: TrainConfig
    rt: runtime.Runtime
    prepared: Prepared
    tokenizer: CharTokenizer
    batches: Batches
    model_cfg: ModelConfig
    model: GPT  # the module whose weights are saved (never the compiled or DDP wrapper)
    step_model: object  # what the loop calls: the model, wrapped in DDP and/or compiled (its blocks, or all of it)
    optimizer: object
    scaler: torch.amp.GradScaler
    tokens_per_iter: int
    flops_per_token: float
    phases: Phases = field(default_factory=Phases)  # where this process's time goes (train() gives its own)
    eval_model: object = None  # what evaluations call: step_model, or with compile_eval false the model itself

    @property
    def data_info(self) -> dict:
        """What the run was trained on, as recorded in checkpoints and the summary."""
        info = {k: self.prepared.meta[k] for k in ("source", "sha256", "n_chars", "n_train", "n_val", "vocab_size")}
        info["first_char"] = self.tokenizer.chars[int(self.batches.data["train"][0])]  # sample.py's default prompt
        return info


@dataclass
class Progress:
    """Where a run is: the step, the best validation loss, seconds spent in training steps (evaluations, samples,
    pictures and checkpoint writes excluded), whether the evaluation due at this step has been done, the losses
    the last evaluation measured, and how many evaluations in a row have not beaten the best (for --patience)."""
    it: int = 0
    best_val: float = math.inf
    train_seconds: float = 0.0
    eval_done: bool = False
    last_eval: dict = field(default_factory=dict)
    evals_since_best: int = 0


def plateaued(evals_since_best: int, patience: int) -> bool:
    """--patience: the last `patience` evaluations in a row did not beat the best validation loss (0: never)."""
    return patience > 0 and evals_since_best >= patience


def build_run(cfg: TrainConfig, rt: runtime.Runtime, prepared: Prepared, d: Dist = Dist(), say=print,
              resumed: dict | None = None, init: dict | None = None) -> tuple[Run, Progress]:
    """The real loader, model, optimizer and gradient scaler of a run with this config; from a checkpoint's state
    when resuming. The global random stream is used exactly as it always was, so a seed gives the same run."""
    batches = Batches(prepared, cfg.block_size, cfg.batch_size, rt.device, cfg.seed, d.rank, d.world_size)
    torch.manual_seed(cfg.seed)
    model_cfg = cfg.model_config(prepared.tokenizer.vocab_size)
    model = GPT(model_cfg).to(rt.device)  # the same seed gives every rank the same initial weights
    if init is not None:
        graft(model, init["model"])
    if d.enabled:
        torch.manual_seed(cfg.seed + d.rank)  # but different dropout masks
    optimizer = configure_optimizer(model, cfg.learning_rate, cfg.weight_decay, (cfg.beta1, cfg.beta2),
                                    rt.device_type, cfg.optimizer)
    run = Run(cfg, rt, prepared, prepared.tokenizer, batches, model_cfg, model, model, optimizer, rt.grad_scaler(),
              tokens_per_iter=cfg.batch_size * cfg.block_size * cfg.grad_accum_steps * d.world_size,
              flops_per_token=flops_per_token(model.num_params(non_embedding=False), model_cfg))
    progress = restore(run, resumed, d) if resumed is not None else Progress()
    def wrap(module: torch.nn.Module) -> torch.nn.Module:
        # The model's only buffers are the rotary tables, computed alike in every process: nothing for DDP to
        # broadcast from rank 0 before every forward (its default)
        return DDP(module, device_ids=[d.local_rank] if rt.device_type == "cuda" else None,
                   broadcast_buffers=False) if d.enabled else module
    run.step_model, run.eval_model = step_and_eval_models(model, wrap, cfg.compile, rt.device_type, cfg.compile_mode,
                                                          cfg.compile_scope, cfg.compile_eval, say)
    return run, progress


def graft(model: GPT, weights: dict) -> None:
    """A trained model's weights into a model with the same architecture and the same or a longer vocabulary (a
    fine-tuning run): the trained rows of the token embedding (and of an untied output head) are copied, and each
    new character's row starts as the mean of the trained rows, an average character, rather than noise."""
    own = model.state_dict()
    weights = dict(weights)
    for name in ("wte.weight", "lm_head.weight"):
        trained, wanted = weights.get(name), own[name]
        if trained is not None and trained.size(0) < wanted.size(0):
            grown = torch.empty_like(wanted)
            grown[:trained.size(0)] = trained
            grown[trained.size(0):] = trained.float().mean(0).to(trained.dtype)
            weights[name] = grown
    model.load_state_dict(weights)


def capture(run: Run, progress: Progress) -> dict:
    """Everything a checkpoint holds (training.checkpoint.CONTENTS, with the format added when it is saved): weights,
    configs, vocabulary, optimizer, step, random streams. restore() is its inverse."""
    return {
        "model": run.model.state_dict(), "model_config": run.model_cfg.to_dict(), "run_config": run.cfg.to_dict(),
        "vocab": run.tokenizer.chars, "optimizer": run.optimizer.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler.is_enabled() else None,
        "iter": progress.it, "best_val_loss": progress.best_val, "train_seconds": progress.train_seconds,
        "eval_done": progress.eval_done, "last_eval": progress.last_eval, "evals_since_best": progress.evals_since_best,
        "data": run.data_info,
        "rng": {"torch": torch.get_rng_state(), "batches": run.batches.state_dict(),
                "cuda": torch.cuda.get_rng_state() if run.rt.device_type == "cuda" else None},
    }


def restore(run: Run, state: dict, d: Dist = Dist()) -> Progress:
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    if state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    run.batches.load_state_dict(state["rng"]["batches"])  # the same stream, whatever the number of ranks
    if not d.enabled:
        torch.set_rng_state(state["rng"]["torch"])
        if run.rt.device_type == "cuda" and state["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(state["rng"]["cuda"].cpu())
    # Checkpoints from before these fields existed: the evaluation at their step was done (they were saved after it).
    return Progress(state["iter"], state["best_val_loss"], state.get("train_seconds", 0.0), state.get("eval_done", True),
                    state.get("last_eval", {}), state.get("evals_since_best", 0))
