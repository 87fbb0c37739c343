"""TrainConfig: every setting of a run, with its type, default and meaning, checked when built."""
from __future__ import annotations

import math
import typing
from dataclasses import MISSING, asdict, dataclass, fields

from configs.choices import CHOICES, CUDA_GRAPH_MODES, valid_device
from errors import UserError
from model.config import MAX_SIZE, Architecture, ModelConfig, setting

FIXED = {"beta1": 0.9}  # not a setting: every run uses it (a saved config may hold it)
SEED_MAX = 2**62  # torch.manual_seed takes 64 bits, and the rank is added under torchrun
MAX_THREADS = 1024
CONFIG_MAX_BYTES = 1 << 20
MAX_STEPS = 10**12  # a step count past this is a slip
# Each count's lowest and highest value (an evaluation draws all its windows at once)
COUNTS = {**dict.fromkeys(("max_iters", "warmup_iters", "lr_decay_iters", "patience"), (0, MAX_STEPS)),
          **dict.fromkeys(("eval_interval", "log_interval", "max_nonfinite_steps"), (1, MAX_STEPS)),
          **dict.fromkeys(("batch_size", "grad_accum_steps"), (1, MAX_SIZE)),
          "eval_iters": (1, 1_000_000), "sample_chars": (0, 100_000), "num_threads": (0, MAX_THREADS)}


def check_num_threads(value: int) -> None:
    """Check a script's --num_threads as a run's is."""
    if not 0 <= value <= MAX_THREADS:
        raise UserError(f"--num_threads {value}: must be from 0 (the faster count, measured) to {MAX_THREADS}")


@dataclass
class TrainConfig(Architecture):  # the model's fields first
    data: str = setting("shakespeare", "text file, folder of them, or a named corpus: shakespeare | pystdlib")
    cache_dir: str = setting("", "downloads and token files (empty: ~/.cache/chargpt)")
    val_fraction: float = setting(0.1, "the last fraction of the text used for validation")
    encoding: str = setting("utf-8", "the corpus files' text encoding")
    encoding_errors: str = setting("strict", "undecodable bytes: strict (stop) | replace | ignore")
    batch_size: int = setting(64, "sequences per micro-batch")
    grad_accum_steps: int = setting(1, "micro-batches summed into one optimizer step")
    max_iters: int = setting(5000, "optimizer steps to train for")
    optimizer: str = setting("adamw", "adamw | muon (Muon for the blocks' matrices, AdamW for the rest)")
    muon_dtype: str = setting("auto", "muon's Newton-Schulz precision: auto (bfloat16 where the device has it) | "
                                      "float32 | bfloat16")
    learning_rate: float = setting(1e-3, "peak learning rate")
    min_lr: float = setting(1e-4, "learning rate at the end of the decay")
    warmup_iters: int = setting(100, "steps of linear warm-up from 0 to learning_rate")
    lr_schedule: str = setting("cosine", "after the warm-up: cosine (decay to min_lr) | wsd (hold, then fall "
                                         "linearly to min_lr)")
    warmdown_fraction: float = setting(0.3, "wsd: the share of the post-warm-up steps spent decaying")
    lr_decay_iters: int = setting(0, "step at which the decay reaches min_lr (0: max_iters)")
    weight_decay: float = setting(0.1, "decoupled weight decay on weight matrices only, Muon's too")
    beta2: float = setting(0.99, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the gradient norm to this (0 to turn off)")
    max_nonfinite_steps: int = setting(5, "stop after this many steps in a row with a NaN/inf loss or gradient")
    eval_interval: int = setting(250, "evaluate (and checkpoint) every this many steps")
    eval_iters: int = setting(200, "random batches per split in each evaluation")
    log_interval: int = setting(10, "update the progress bar and logs every this many steps")
    sample_chars: int = setting(200, "characters sampled at each evaluation (0: none)")
    log_attention: bool = setting(True, "log each layer's attention heatmap at each evaluation")
    wandb: bool = setting(False, "also log the run to Weights & Biases (needs the wandb package)")
    wandb_project: str = setting("chargpt", "the wandb project to log to")
    full_val: bool = setting(True, "at the end, the exact loss over every validation window")
    patience: int = setting(5, "stop after this many evaluations in a row without a new best (0: never)")
    out_dir: str = setting("", "output folder for checkpoints and logs (empty: out/<config>)")
    resume: bool = setting(False, "continue the run in out_dir")
    overwrite: bool = setting(False, "replace a different run already in out_dir")
    init_from: str = setting("", "fine-tune: start a new run from a run folder or checkpoint")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N | mps")
    dtype: str = setting("auto", "auto | float32 | bfloat16 | float16 for matrix products (auto: bfloat16 where the "
                                 "device has it, else float16 on a GPU, else float32)")
    compile: str = setting("auto", "torch.compile the model: auto (on for CUDA) | true | false")
    compile_mode: str = setting("default", "torch.compile mode: default | max-autotune-no-cudagraphs")
    compile_scope: str = setting("blocks", "blocks (one compiled graph serves every block) | model")
    compile_eval: bool = setting(True, "with compile on: evaluate with the compiled model too")
    num_threads: int = setting(0, "CPU threads for PyTorch (0: measure the faster count; N: the same losses "
                                  "on any load)")
    ddp: str = setting("auto", "data-parallel under torchrun: auto (with 2 or more processes) | always")
    seed: int = setting(1337, "random seed for initialisation and batches")
    config_name: str = setting("custom", "the preset this run started from (set by --config)")

    def __post_init__(self) -> None:
        super().__post_init__()

        def check(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"--{name} {getattr(self, name)!r}: {rule}")

        for name, kind in TYPES.items():
            if kind is float:
                check(math.isfinite(getattr(self, name)), name, "must be a finite number")
        for name, (low, high) in COUNTS.items():
            check(getattr(self, name) >= low, name, "must be at least 1" if low else "must not be negative")
            check(getattr(self, name) <= high, name, f"must be at most {high:,}")
        check(0 < self.val_fraction < 1, "val_fraction", "must be between 0 and 1, e.g. 0.1")
        check(self.learning_rate > 0, "learning_rate", "must be positive, e.g. 1e-3")
        check(0 <= self.min_lr <= self.learning_rate, "min_lr",
              f"must be between 0 and learning_rate ({self.learning_rate:g})")
        check(0 < self.warmdown_fraction <= 1, "warmdown_fraction", "must be in (0, 1], e.g. 0.3")
        check(0 <= self.beta2 < 1, "beta2", "must be in [0, 1)")
        check(self.grad_clip >= 0, "grad_clip", "must not be negative")
        check(self.weight_decay >= 0, "weight_decay", "must not be negative")
        check(self.compile_mode not in CUDA_GRAPH_MODES, "compile_mode",
              "replays CUDA graphs, which training does not offer; use default")
        for name, allowed in CHOICES.items():
            check(getattr(self, name) in allowed, name, f"must be one of {', '.join(allowed)}")
        check(valid_device(self.device), "device", "must be auto, cpu, cuda, cuda:N or mps")
        check(0 <= self.seed <= SEED_MAX, "seed", f"must be a whole number from 0 to {SEED_MAX} (2^62)")

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, **{name: getattr(self, name) for name in ARCHITECTURE_FIELDS})

    def to_dict(self) -> dict:
        return asdict(self)


ARCHITECTURE_FIELDS = tuple(f.name for f in fields(Architecture))
# fixed by the weights
SHAPE_FIELDS = tuple(name for name in ARCHITECTURE_FIELDS if name not in ("dropout", "attention", "zero_proj"))
FIELDS = {f.name: f for f in fields(TrainConfig)}
# train.py --help's groups; every setting is in exactly one
HELP_GROUPS = {
    "everyday settings": ("data", "out_dir", "resume", "overwrite", "init_from", "max_iters", "batch_size",
                          "block_size", "n_layer", "n_head", "n_embd", "dropout", "learning_rate", "eval_interval",
                          "patience", "device", "dtype", "seed"),
    "model": ("bias", "tie_weights", "attention", "position", "activation", "qk_norm", "logit_softcap", "zero_proj"),
    "optimisation": ("optimizer", "muon_dtype", "grad_accum_steps", "min_lr", "warmup_iters", "lr_schedule",
                     "warmdown_fraction", "lr_decay_iters", "weight_decay", "beta2", "grad_clip",
                     "max_nonfinite_steps"),
    "evaluation and logging": ("eval_iters", "log_interval", "sample_chars", "log_attention", "full_val", "wandb",
                               "wandb_project"),
    "data details": ("cache_dir", "val_fraction", "encoding", "encoding_errors"),
    "attention forms (docs/attention.md)": ("attention_score", "shared_qk", "attention_values", "residual", "mlp"),
    "speed (docs/speed.md)": ("compile", "compile_mode", "compile_scope", "compile_eval", "num_threads", "ddp"),
}
TYPES: dict[str, type] = typing.get_type_hints(TrainConfig)
assert all(f.default is not MISSING for f in FIELDS.values())
assert sorted(n for group in HELP_GROUPS.values() for n in group) == sorted(set(FIELDS) - {"config_name"})


def checked_types(values: dict, where: str, types: dict[str, type] = TYPES) -> dict:
    """values, each checked to be its field's type (compile may be a bool)."""
    values = dict(values)
    for key, value in values.items():
        if key == "compile" and isinstance(value, bool):
            values[key] = str(value).lower()
            continue
        kind = types[key]
        if not isinstance(value, (int, float) if kind is float else kind) or (
                kind is not bool and isinstance(value, bool)):
            raise UserError(f"{where}: {key} = {value!r} should be of type {kind.__name__}")
    return values
