"""TrainConfig: every setting of a training run, with its type, default and meaning, checked when built (and the same
check of a script's --num_threads). The model's settings are not repeated here: TrainConfig takes them, defaults and
checks included, from Architecture."""
from __future__ import annotations

import math
import typing
from dataclasses import MISSING, asdict, dataclass, fields

from configs.choices import (COMPILE_MODES, COMPILE_SCOPES, CUDA_GRAPH_MODES, DDP_CHOICES, DTYPE_NAMES, LR_SCHEDULES,
                              MUON_DTYPES, OPTIMIZERS, valid_device)
from errors import UserError
from model.config import MAX_SIZE, Architecture, ModelConfig, setting

# Settings a run does not choose, with the value every run uses: AdamW's beta1 (its first moment's decay; beta2 is a
# setting). A saved config may hold them, at these values.
FIXED = {"beta1": 0.9}
SEED_MAX = 2**62  # seeds go to torch.manual_seed (64 bits), with the rank added under torchrun
MAX_SAMPLE_CHARS = 100_000
MAX_THREADS = 1024  # more threads than any machine has cores; tens of thousands would each need a stack
CONFIG_MAX_BYTES = 1 << 20  # a file of settings (TOML, or nanoGPT's Python); a larger one was given by mistake
# The most a count of steps may give (max_iters, the schedule's, the intervals; patience too, in evaluations, at most
# one a step): at a millisecond a step, a tiny model's on a fast GPU, 10^12 steps take 32 years, so a larger count is a
# slip; past 10^308 the time estimate and the learning rate would overflow a float.
MAX_STEPS = 10**12
STEP_COUNTS = ("max_iters", "warmup_iters", "lr_decay_iters", "eval_interval", "log_interval", "max_nonfinite_steps",
               "patience")
# Each evaluation draws the starts of all its eval_iters batches of a split at once (data.loader's fixed_batches: 8
# bytes a window, batch_size windows a batch), and at a millisecond a batch a million batches of each split take over
# half an hour.
MAX_EVAL_ITERS = 1_000_000


def check_num_threads(value: int) -> None:
    """A script's --num_threads: 0 (measured) up to MAX_THREADS, as TrainConfig checks a run's."""
    if not 0 <= value <= MAX_THREADS:
        raise UserError(f"--num_threads {value}: must be from 0 (the faster count, measured) to {MAX_THREADS}")


@dataclass
class TrainConfig(Architecture):  # the model's fields (block_size .. activation) come first, from Architecture
    # data
    data: str = setting("shakespeare", "text file, folder of text files, or a named corpus: shakespeare | pystdlib")
    cache_dir: str = setting("", "where downloads and token files are cached (empty: ~/.cache/chargpt)")
    val_fraction: float = setting(0.1, "the last fraction of the text used for validation")
    encoding: str = setting("utf-8", "text encoding of the corpus files")
    encoding_errors: str = setting("strict", "undecodable bytes: strict (stop) | replace | ignore")
    # optimisation
    batch_size: int = setting(64, "sequences per micro-batch")
    grad_accum_steps: int = setting(1, "micro-batches summed into one optimizer step")
    max_iters: int = setting(5000, "optimizer steps to train for")
    optimizer: str = setting("adamw", "adamw | muon (Muon for the blocks' weight matrices, AdamW for the rest)")
    muon_dtype: str = setting("auto", "muon: the precision of its Newton-Schulz iterations: auto (bfloat16 where the "
                                      "device has bfloat16 units, else float32) | float32 | bfloat16")
    learning_rate: float = setting(1e-3, "peak learning rate")
    min_lr: float = setting(1e-4, "learning rate at the end of the decay")
    warmup_iters: int = setting(100, "steps of linear warm-up from 0 to learning_rate")
    lr_schedule: str = setting("cosine", "after the warm-up: cosine (a cosine decay to min_lr) | wsd (warm-up, "
                                         "stable, decay: hold learning_rate, then fall in a straight line to min_lr)")
    warmdown_fraction: float = setting(0.3, "wsd: the share of the steps after the warm-up spent falling to min_lr")
    lr_decay_iters: int = setting(0, "step at which the decay reaches min_lr (0: max_iters)")
    weight_decay: float = setting(0.1, "weight decay (decoupled, as in AdamW) on weight matrices only, Muon's too")
    beta2: float = setting(0.99, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the gradient norm to this (0 to turn off)")
    max_nonfinite_steps: int = setting(5, "stop after this many consecutive steps with a NaN/inf loss or gradient")
    # evaluation and logging
    eval_interval: int = setting(250, "evaluate (and checkpoint) every this many steps")
    eval_iters: int = setting(200, "random batches per split in each evaluation")
    log_interval: int = setting(10, "update the progress bar and the loss/train, optim/* and perf/* scalars every "
                                    "this many steps")
    sample_chars: int = setting(200, "characters of generated text logged to TensorBoard at each evaluation (0: none)")
    log_attention: bool = setting(True, "log each layer's attention heatmap for a fixed validation text at each "
                                        "evaluation")
    wandb: bool = setting(False, "also log the run to Weights & Biases, beside TensorBoard (needs the wandb package, "
                                 "which this trainer does not install; WANDB_MODE=offline keeps it on this machine)")
    wandb_project: str = setting("chargpt", "wandb: the project the run is logged in (the run is named after its "
                                            "folder)")
    full_val: bool = setting(True, "at the end, compute the run's model's exact loss over every validation window")
    patience: int = setting(5, "stop early once this many evaluations in a row have not beaten the best validation "
                               "loss (0: never; train to max_iters). Either way the run hands over its best model")
    # run
    out_dir: str = setting("", "output folder for checkpoints, TensorBoard events and summary.json (empty: "
                               "out/<config>)")
    resume: bool = setting(False, "continue the run in out_dir from its ckpt_last.safetensors")
    overwrite: bool = setting(False, "replace a different run already in out_dir")
    init_from: str = setting("", "fine-tune: start a new run from a trained model (a run folder or checkpoint); its "
                                 "architecture is kept and the vocabulary grows by the new text's unseen characters")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N | mps")
    dtype: str = setting("auto", "auto | float32 | bfloat16 | float16 for matrix products (auto: bfloat16 on CUDA, "
                                 "float16 on GPUs without it, bfloat16 on CPUs with bfloat16 units, float32 otherwise)")
    compile: str = setting("auto", "torch.compile the model: auto (on for CUDA) | true | false")
    compile_mode: str = setting("default", "torch.compile mode: default | max-autotune-no-cudagraphs (searches more "
                                           "kernels); the CUDA-graph modes are not offered until a GPU measures them")
    compile_scope: str = setting("blocks", "what torch.compile compiles: blocks (each block; one graph serves every "
                                           "layer, so it compiles ~3x faster) | model (the whole model as one graph)")
    compile_eval: bool = setting(True, "with compile on: evaluate with the compiled model too (false: evaluations and "
                                       "full validation run uncompiled, sparing the compilation of a second graph)")
    num_threads: int = setting(0, "CPU threads for PyTorch (0: the faster count on this machine as it is, measured "
                                  "before the first step and kept on resume; N: N threads, the same last digits "
                                  "whatever else the machine runs)")
    ddp: str = setting("auto", "data-parallel under torchrun: auto (a process group and DDP with 2 or more processes) "
                               "| always (for one process too, so DDP's hooks and no_sync run on one GPU)")
    seed: int = setting(1337, "random seed for initialisation and batches")
    config_name: str = setting("custom", "name of the preset this run started from (set by --config)")

    def __post_init__(self) -> None:
        super().__post_init__()  # the model's own checks (n_embd % n_head, attention, position, activation, ...)

        def check(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"--{name} {getattr(self, name)!r}: {rule}")

        for name, kind in TYPES.items():
            if kind is float:
                check(math.isfinite(getattr(self, name)), name, "must be a finite number")
        for name in ("batch_size", "grad_accum_steps", "eval_interval", "eval_iters", "log_interval",
                     "max_nonfinite_steps"):
            check(getattr(self, name) >= 1, name, "must be at least 1")
        for name in ("max_iters", "warmup_iters", "lr_decay_iters", "sample_chars", "num_threads", "patience"):
            check(getattr(self, name) >= 0, name, "must not be negative")
        for name in STEP_COUNTS:
            check(getattr(self, name) <= MAX_STEPS, name, f"must be at most {MAX_STEPS:,} (10^12: at a millisecond a "
                  f"step, a run that long would take 32 years)")
        for name in ("batch_size", "grad_accum_steps"):  # the global batch's sizes, as the model's (model.config)
            check(getattr(self, name) <= MAX_SIZE, name, f"must be at most {MAX_SIZE:,}")
        check(self.eval_iters <= MAX_EVAL_ITERS, "eval_iters", f"must be at most {MAX_EVAL_ITERS:,} (each evaluation "
              f"draws the windows of all its batches at once, and a million batches of each split take over half an "
              f"hour at a millisecond each)")
        check(self.sample_chars <= MAX_SAMPLE_CHARS, "sample_chars", f"must be at most {MAX_SAMPLE_CHARS:,} (a sample "
              f"is drawn and logged as text at every evaluation)")
        check(self.num_threads <= MAX_THREADS, "num_threads", f"must be at most {MAX_THREADS} (0: the faster count, "
              f"measured)")
        check(0 < self.val_fraction < 1, "val_fraction", "must be between 0 and 1, e.g. 0.1")
        check(self.learning_rate > 0, "learning_rate", "must be positive, e.g. 1e-3")
        check(0 <= self.min_lr <= self.learning_rate, "min_lr",
              f"must be between 0 and learning_rate ({self.learning_rate:g})")
        check(self.lr_schedule in LR_SCHEDULES, "lr_schedule", f"must be one of {', '.join(LR_SCHEDULES)}")
        check(0 < self.warmdown_fraction <= 1, "warmdown_fraction", "must be in (0, 1], e.g. 0.3")
        check(0 <= self.beta2 < 1, "beta2", "must be in [0, 1)")
        check(self.grad_clip >= 0, "grad_clip", "must not be negative (0 turns clipping off)")
        check(self.weight_decay >= 0, "weight_decay", "must not be negative")
        check(self.encoding_errors in ("strict", "replace", "ignore"), "encoding_errors",
              "must be strict, replace or ignore")
        check(self.dtype in ("auto", *DTYPE_NAMES), "dtype", f"must be auto, {', '.join(DTYPE_NAMES)}")
        check(self.compile in ("auto", "true", "false"), "compile", "must be auto, true or false")
        check(self.compile_mode not in CUDA_GRAPH_MODES, "compile_mode",
              "replays CUDA graphs, which training does not offer until a GPU has measured it correct (a replay "
              "overwrites the outputs the loop still holds); use default or max-autotune-no-cudagraphs")
        check(self.compile_mode in COMPILE_MODES, "compile_mode", f"must be one of {', '.join(COMPILE_MODES)}")
        check(self.compile_scope in COMPILE_SCOPES, "compile_scope", f"must be one of {', '.join(COMPILE_SCOPES)}")
        check(self.ddp in DDP_CHOICES, "ddp", f"must be one of {', '.join(DDP_CHOICES)}")
        check(self.optimizer in OPTIMIZERS, "optimizer", f"must be one of {', '.join(OPTIMIZERS)}")
        check(self.muon_dtype in MUON_DTYPES, "muon_dtype", f"must be one of {', '.join(MUON_DTYPES)}")
        check(valid_device(self.device), "device", "must be auto, cpu, cuda, cuda:N or mps")
        check(0 <= self.seed <= SEED_MAX, "seed", f"must be a whole number from 0 to {SEED_MAX} (2^62)")

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, **{name: getattr(self, name) for name in ARCHITECTURE_FIELDS})

    def to_dict(self) -> dict:
        return asdict(self)


ARCHITECTURE_FIELDS = tuple(f.name for f in fields(Architecture))
# fixed by the weights (dropout and the attention path are how they are used; zero_proj only how they began)
SHAPE_FIELDS = tuple(name for name in ARCHITECTURE_FIELDS if name not in ("dropout", "attention", "zero_proj"))
FIELDS = {f.name: f for f in fields(TrainConfig)}
# train.py --help shows the settings in these groups, in this order: the everyday ones first, the tutorials' attention
# forms and the benchmarks' knobs apart. Every setting is in exactly one group (checked below).
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
    "the tutorials' attention forms (model/scoring.py, docs/attention.md)": ("attention_score", "shared_qk",
                                                                            "attention_values", "residual", "mlp"),
    "speed and benchmark knobs (docs/speed.md)": ("compile", "compile_mode", "compile_scope", "compile_eval",
                                                  "num_threads", "ddp"),
}
TYPES: dict[str, type] = typing.get_type_hints(TrainConfig)  # the real types (the annotations are strings here)
assert all(f.default is not MISSING for f in FIELDS.values())
assert sorted(n for group in HELP_GROUPS.values() for n in group) == sorted(set(FIELDS) - {"config_name"})
