"""Checkpoints: what one holds (CONTENTS), captured from a run and restored into one, and the self-describing file,
written atomically and read without unpickling code, every part checked before it is used."""
from __future__ import annotations

import math
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from common.machine import free_memory, usable_device
from common.run_folder import BEST, LAST, write_atomic
from configs.choices import OPTIMIZERS
from configs.loader import checked_types
from configs.schema import FIELDS, TYPES
from data import gate
from data.gate import check_fields, of_type
from data.tokenizer import CharTokenizer
from errors import UserError, in_one_line
from training.device import Dist, random_states, set_random_states
from training.optim import configure_optimizer


if TYPE_CHECKING:  # for the annotations only: training.opening builds runs from checkpoints, so it imports this module
    from training.opening import Run


FORMAT = 1
# Everything a checkpoint holds: key -> (its types, who needs it): "sample" every reader, "resume" --resume besides,
# "later" optional (read with a default). capture() writes exactly these keys (tested); restore() reads them.
CONTENTS = {
    "format": (int, "sample"), "model": (dict, "sample"), "model_config": (dict, "sample"),
    "run_config": (dict, "sample"), "vocab": (str, "sample"), "iter": (int, "sample"),
    "optimizer": (dict, "resume"), "rng": (dict, "resume"), "best_val_loss": ((int, float), "resume"),
    "scaler": ((dict, type(None)), "later"), "train_seconds": ((int, float), "later"), "eval_done": (bool, "later"),
    "last_eval": (dict, "later"), "evals_since_best": (int, "later"), "data": (dict, "later"),
    "tokens_per_iter": (int, "later"), "losses": (dict, "later"),
}
REQUIRED = {key: kind for key, (kind, needed_by) in CONTENTS.items() if needed_by == "sample"}
RESUMABLE = {key: kind for key, (kind, needed_by) in CONTENTS.items() if needed_by == "resume"}
LATER = {key: kind for key, (kind, needed_by) in CONTENTS.items() if needed_by == "later"}
RESUME_ONLY = ("optimizer", "rng")  # tensors only --resume uses: a reader that samples leaves them on disk


@dataclass
class Progress:
    """The training loop's state, saved whole in every checkpoint; train.py advances it, training.session records
    evaluations in it. train_seconds: training steps only (no evaluations, samples, pictures or checkpoint writes);
    eval_done: whether the evaluation due at this step is made; evals_since_best: for --patience; losses: every
    session's, for loss.png: "train" (step, loss) per log line, "eval" (step, train, validation loss) per evaluation."""
    it: int = 0
    best_val: float = math.inf
    train_seconds: float = 0.0
    eval_done: bool = False
    last_eval: dict = field(default_factory=dict)
    evals_since_best: int = 0
    losses: dict = field(default_factory=lambda: {"train": [], "eval": []})


def capture(run: Run, progress: Progress) -> dict:
    """Everything a checkpoint holds (CONTENTS; save() adds the format); restore() is its inverse."""
    return {
        "model": run.model.state_dict(), "model_config": run.model_cfg.to_dict(), "run_config": run.cfg.to_dict(),
        "vocab": run.tokenizer.chars, "optimizer": run.optimizer.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler.is_enabled() else None,
        "iter": progress.it, "best_val_loss": progress.best_val, "train_seconds": progress.train_seconds,
        "eval_done": progress.eval_done, "last_eval": progress.last_eval, "evals_since_best": progress.evals_since_best,
        "data": run.data_info, "tokens_per_iter": run.tokens_per_iter, "losses": progress.losses,
        "rng": dict(zip(("torch", "cuda"), random_states(run.rt.device)), batches=run.batches.state_dict()),
    }


def restore(run: Run, state: dict, d: Dist = Dist()) -> Progress:
    """The state of a checkpoint (checked by load() and check_resumable()) into run; returns where the run is."""
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    if state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    run.batches.load_state_dict(state["rng"]["batches"])  # the same stream, whatever the number of ranks
    if d.world_size == 1:  # (ranks draw their own dropout streams: seed + rank)
        cuda = state["rng"].get("cuda") if run.rt.device.type == "cuda" else None
        set_random_states(run.rt.device, (state["rng"]["torch"].cpu(), None if cuda is None else cuda.cpu()))
    # A checkpoint without the later fields was saved after its step's evaluation; loss.png then starts here.
    losses = state.get("losses", {"train": [], "eval": []})
    return Progress(it=state["iter"], best_val=state["best_val_loss"], train_seconds=state.get("train_seconds", 0.0),
                    eval_done=state.get("eval_done", True), last_eval=state.get("last_eval", {}),
                    evals_since_best=state.get("evals_since_best", 0),
                    losses={name: [tuple(point) for point in losses[name]] for name in ("train", "eval")})


def non_finite(weights: dict) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf, if any."""
    return next((name for name, t in weights.items()
                 if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all()), None)


def save(state: dict, path: Path) -> None:
    """Write state as a checkpoint (write_atomic: never half a file); weights that are not finite are refused."""
    if bad := non_finite(state.get("model", {})):
        raise UserError(f"refusing to write {path}: the weights are not finite (NaN or inf in {bad}): training "
                        f"diverged; the previous checkpoint is kept; try a lower --learning_rate (or --dtype float32), "
                        f"then --resume")
    write_atomic(path, lambda f: torch.save({"format": FORMAT, **state}, f), "checkpoint")


def load(path: Path, device: torch.device | str = "cpu", resume: bool = False) -> dict:
    """A checkpoint read through the gate (data.gate.read_checkpoint: no code unpickled), every field and tensor
    checked before any tensor's bytes are read, then copied onto device and its weights checked finite. resume:
    RESUMABLE is required and RESUME_ONLY checked, else never read. A failure is one line naming the file and field."""
    # the device checked before the file is read, so that a missing one is never mistaken for a damaged file
    target = usable_device(device, f"load {path} onto", "load it onto cpu")
    state, listing = gate.read_checkpoint(path)
    check_fields(state, REQUIRED, path)
    check_fields(state, {key: kind for key, kind in LATER.items() if key in state}, path)  # present: of their type
    if resume:
        check_fields(state, RESUMABLE, path)
    if state["format"] != FORMAT:
        raise UserError(f"{path} has checkpoint format {state['format']}, this version reads format {FORMAT}; "
                        f"use the version of this trainer that wrote it")
    if state["iter"] < 0:
        raise UserError(f"{path} is damaged: its step is {state['iter']}")
    if "losses" in state:
        check_losses(state["losses"], state["iter"], path)
    check_later(state, path)
    # every known field of the run's settings of its type (--resume checks their values too: config_from_dict)
    checked_types({k: v for k, v in state["run_config"].items() if k in FIELDS}, f"{path} is damaged")
    config = model_config_of(state, path)
    check_model(state, config, path, resume)
    if resume:
        check_optimizer(state, config, path)
        check_rng(state["rng"], path)
    gate.check_records(state, listing, path)  # no tensor's bytes stored beyond its own
    try:
        state = gate.materialized({key: value for key, value in state.items() if resume or key not in RESUME_ONLY},
                                  target, gate.stored_intact(listing, path))
    except (RuntimeError, TypeError) as err:  # the file passed every check: the device (or its dtypes) cannot hold it
        raise UserError(f"{path} is readable, but {target} cannot hold its weights ({in_one_line(err)}); load it "
                        f"onto cpu") from None
    if bad := non_finite(state["model"]):
        raise UserError(f"{path} holds weights that are not finite (NaN or inf in {bad}); it cannot be used: "
                        f"take another checkpoint (ckpt_best.pt or ckpt_last.pt) or train again")
    if resume:
        check_optimizer_values(state["optimizer"], state["iter"], path)
    return state


WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
WEIGHTS_HELD = "a model holds ordinary floating-point tensors; take another checkpoint or train again"


def model_config_of(state: dict, path: Path):
    """The checkpoint's ModelConfig, every field of its own type and consistent with the vocabulary, or one line."""
    from model import ModelConfig

    values, types = state["model_config"], typing.get_type_hints(ModelConfig)
    unknown = [key for key in values if key not in types]
    if unknown:
        raise UserError(f"{path} is damaged: in its model config, {', '.join(unknown[:5])} unknown")
    checked_types(values, f"{path} is damaged: in its model config", {**TYPES, "vocab_size": int})
    try:
        config = ModelConfig(**values)
        tokenizer = CharTokenizer(state["vocab"])
    except ValueError as err:
        raise UserError(f"{path} has an inconsistent model config or vocabulary ({err})") from None
    if tokenizer.vocab_size != config.vocab_size:
        raise UserError(f"{path} is inconsistent: its vocabulary has {tokenizer.vocab_size} characters "
                        f"but its model expects {config.vocab_size}")
    return config


def skeleton(config, path: Path):
    """The model that config describes, on the meta device (shapes, no memory); one line for impossible sizes."""
    from model import GPT

    try:
        with torch.device("meta"):
            return GPT(config)
    except (OverflowError, RuntimeError, ValueError) as err:
        raise UserError(f"{path}: its model config describes a model that cannot be built "
                        f"({str(err).splitlines()[0][:120]}); it is damaged") from None


def check_model(state: dict, config, path: Path, resume: bool = False) -> None:
    """The saved weights against the model config, before that model is built (a damaged config could ask for hundreds
    of GB): the layer count against the saved blocks first, so even the meta skeleton costs no more than the file; then
    each weight's name, kind, shape and dtype; then the model, its unsaved rotary tables and, for resume, the
    optimizer's moments must fit in free memory."""
    weights = state["model"]
    blocks = {name.split(".")[1] for name in weights if isinstance(name, str) and name.startswith("blocks.")
              and name.count(".") > 1}
    if blocks != {str(i) for i in range(config.n_layer)}:
        raise UserError(f"{path}: the weights do not fit the model config (n_layer {config.n_layer}, but the weights "
                        f"hold {len(blocks)} blocks)")
    model = skeleton(config, path)
    wanted = {name: gate.TensorSpec(tuple(t.shape), WEIGHT_DTYPES) for name, t in model.state_dict().items()}
    gate.check_tensors(weights, wanted, path, label="its weight", fits="the weights do not fit the model config",
                       holds=WEIGHTS_HELD)
    need = sum(t.numel() * 4 for t in [*model.parameters(), *model.buffers()])  # float32
    if resume:
        need += 2 * sum(t.numel() * 4 for t in model.parameters())  # the optimizer's moments, at most two per weight
    free = free_memory()
    if free is not None and need > free:
        raise UserError(f"{path}: its model would need about {need / 2**30:.1f} GiB of memory, more than the "
                        f"{free / 2**30:.1f} GiB this machine has free (block_size {config.block_size} x n_layer "
                        f"{config.n_layer} x n_embd {config.n_embd}); use it on a machine with more memory")


# What each optimizer keeps per weight once it has stepped (torch's names). FREE_SETTINGS: the settings a run may
# change (lr at every step; weight_decay and beta2 on --resume) or the writing device chose; any other must be
# configure_optimizer's (a differentiable=True or capturable=True group breaks the fused step, ns_steps=10**9 hangs it).
OPTIMIZER_STATE = {"AdamW": ("step", "exp_avg", "exp_avg_sq"), "Muon": ("momentum_buffer",)}
STEP_DTYPES = (torch.float32, torch.float64)
OPTIMIZER_HELD = "an optimizer keeps float32 tensors; take another checkpoint or train again"


def unit(value) -> bool:
    return gate.is_number(value) and 0 <= value < 1


NON_NEGATIVE = (lambda v: gate.is_number(v) and math.isfinite(v) and v >= 0, "a finite number, 0 or more")
ON_OFF = (lambda v: v is None or isinstance(v, bool), "true, false or None")
FREE_SETTINGS = {
    "lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "fused": ON_OFF, "foreach": ON_OFF,
    "momentum": (unit, "a number in [0, 1)"),
    "betas": (lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(unit, v)), "two numbers in [0, 1)"),
}


def check_optimizer(state: dict, config, path: Path) -> None:
    """The optimizer's state against the one configure_optimizer builds on a skeleton (no memory): the same groups of
    the same weights, its settings (FREE_SETTINGS aside), and per stepped weight the OPTIMIZER_STATE tensors of the
    weight's shape (a smaller moment would send the fused step writing past its end)."""
    kind = state["run_config"].get("optimizer", "adamw")
    if kind not in OPTIMIZERS:
        raise gate.damaged(path, "run_config.optimizer", kind, " or ".join(OPTIMIZERS))
    model = skeleton(config, path)
    built = configure_optimizer(model, 1e-3, 0.0, (0.9, 0.99), "meta", kind, "float32")
    saved = state["optimizer"]
    parts = [("optimizer", built, saved)]  # (where in the file, the optimizer built, its saved state)
    if hasattr(built, "muon"):  # MuonAndAdamW: the state of each under its name
        if not (isinstance(saved, dict) and set(saved) == {"muon", "adamw"}):
            raise gate.damaged(path, "optimizer", saved, "the state of muon and adamw")
        parts = [(f"optimizer.{name}", getattr(built, name), saved[name]) for name in ("muon", "adamw")]
    for where, optimizer, found in parts:
        expected = optimizer.state_dict()
        if not (isinstance(found, dict) and set(found) == {"state", "param_groups"}
                and isinstance(found["state"], dict) and isinstance(found["param_groups"], list)
                and len(found["param_groups"]) == len(expected["param_groups"])):
            raise gate.damaged(path, where, found, f"an optimizer's state with {len(expected['param_groups'])} "
                                                   f"groups, as --optimizer {kind} writes")
        shapes = {}
        for i, (group, want) in enumerate(zip(found["param_groups"], expected["param_groups"])):
            if not (isinstance(group, dict) and group.get("params") == want["params"]):
                raise gate.damaged(path, f"{where}.param_groups.{i}", group, "the group of weights this model has")
            gate.check_settings(group, want, FREE_SETTINGS, path, f"{where}.param_groups.{i}")
            shapes.update(zip(want["params"], [tuple(p.shape) for p in optimizer.param_groups[i]["params"]]))
        names = OPTIMIZER_STATE[type(optimizer).__name__]
        for index, entry in found["state"].items():
            if index not in shapes or not isinstance(entry, dict):
                raise gate.damaged(path, f"{where}.state.{index}", entry, "the state of one of the model's weights")
            wanted = {key: gate.TensorSpec(() if key == "step" else shapes[index],
                                           STEP_DTYPES if key == "step" else (torch.float32,)) for key in names}
            gate.check_tensors(entry, wanted, path, label="its optimizer's state", prefix=f"{where}.state.{index}.",
                               fits="the optimizer's state does not fit the model", holds=OPTIMIZER_HELD)


def check_optimizer_values(saved: dict, it: int, path: Path) -> None:
    """Once read: every step count a whole number from 0 to the checkpoint's step, every moment finite (a second
    moment not negative): a resumed run would otherwise divide by zero or take square roots of negatives."""
    for name, t in gate.tensors_in(saved):
        where = f"optimizer{name.replace('/', '.')}"
        if name.endswith("/step"):
            value = float(t)
            if not (math.isfinite(value) and value == int(value) and 0 <= value <= it):
                raise gate.damaged(path, where, value, f"a whole number from 0 to the checkpoint's step, {it}")
        elif not torch.isfinite(t).all() or (name.endswith("/exp_avg_sq") and (t < 0).any()):
            raise gate.damaged(path, where, t, "finite" + (" and not negative" if name.endswith("_sq") else ""))


RNG_HELD = "a random state is a byte tensor; sample from it, or start a new run"


def check_rng(rng: dict, path: Path) -> None:
    """The random states a resume sets: the CPU's and the batches' generator states, byte tensors of the CPU state's
    size, and CUDA's (where saved) a short byte tensor."""
    if not isinstance(rng, dict) or not isinstance(rng.get("batches"), dict):
        raise UserError(f"{path} is damaged: its random-number states are missing or malformed, so it cannot be "
                        f"resumed exactly; sample from it, or start a new run")
    size = (torch.get_rng_state().numel(),)
    for found, key, prefix in ((rng, "torch", "rng."), (rng["batches"], "generator", "rng.batches.")):
        gate.check_tensors({name: value for name, value in found.items() if name == key or prefix == "rng.batches."},
                           {key: gate.TensorSpec(size, (torch.uint8,))}, path, label="its random state", prefix=prefix,
                           fits="its random-number states are malformed", holds=RNG_HELD)
    cuda = rng.get("cuda")
    if cuda is not None and not (isinstance(cuda, torch.Tensor) and gate.tensor_kind(cuda) is None
                                 and cuda.dtype == torch.uint8 and cuda.dim() == 1 and cuda.numel() <= 4096):
        raise gate.damaged(path, "rng.cuda", cuda, "a CUDA generator's state (a short byte tensor)")


def check_later(state: dict, path: Path) -> None:
    """The values of the LATER fields (load checks their types): counts and seconds in range, numbers for losses and
    the scaler, and the record of the text (data) whole, as sample.py's default prompt and --resume's checks read it."""
    number = (gate.is_number, "a number")
    count = (lambda v: type(v) is int and v >= 0, "a count, 0 or more")
    gate.check_values(state, {
        "tokens_per_iter": (lambda v: v >= 1, "a whole number of tokens, 1 or more"),
        "evals_since_best": (lambda v: v >= 0, "a count, 0 or more"),
        "train_seconds": (lambda v: math.isfinite(v) and v >= 0, "a finite number of seconds, 0 or more"),
    }, path, "")
    last = state.get("last_eval", {})
    if not set(last) <= {"train", "val"}:
        raise gate.damaged(path, "last_eval", last, "the losses of an evaluation (train, val)")
    gate.check_values(last, {"train": number, "val": number}, path, "last_eval.")
    gate.check_values(state.get("data", {}), {
        "source": (lambda v: isinstance(v, str), "the name of a text"),
        "sha256": (lambda v: isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v),
                   "a sha256 checksum"),
        "first_char": (lambda v: isinstance(v, str) and len(v) == 1, "one character"),
        "n_chars": count, "n_train": count, "n_val": count, "vocab_size": count, "bytes": count,
    }, path, "data.")
    scaler = state.get("scaler")
    if scaler is not None:
        positive = (lambda v: gate.is_number(v) and math.isfinite(v) and v > 0, "a finite positive number")
        gate.check_values(scaler, {"scale": positive, "growth_factor": positive, "backoff_factor": positive,
                                   "growth_interval": count, "_growth_tracker": count}, path, "scaler.")


def check_losses(losses: dict, it: int, path: Path) -> None:
    """The losses so far, shaped as Progress says, steps from 0 to the checkpoint's, losses numbers; else one line."""
    def points(name: str, width: int) -> bool:
        series = losses.get(name)
        return isinstance(series, (list, tuple)) and all(
            isinstance(point, (list, tuple)) and len(point) == width and type(point[0]) is int and 0 <= point[0] <= it
            and all(of_type(value, (int, float)) for value in point[1:]) for point in series)

    if not (set(losses) == {"train", "eval"} and points("train", 2) and points("eval", 3)):
        raise UserError(f"{path} is damaged: its record of the losses so far is malformed; take another checkpoint "
                        f"or train again")


def load_model(path: Path, device: torch.device | str = "cpu"):
    """(model in eval mode on device, tokenizer, state) of a checkpoint that load() has checked, else one line; where
    a run's ckpt_best.pt is refused and its ckpt_last.pt would be read, the line says so (that file is then read once
    to find out, onto device, on this failure only)."""
    from model import GPT

    try:
        state = load(path, device)
    except UserError as err:
        last = Path(path).parent / LAST
        if Path(path).name != BEST or not last.is_file():
            raise
        try:
            load(last, device)
        except Exception:  # (whatever stops it, the refusal of ckpt_best.pt is what the user asked about)
            raise err from None
        raise UserError(f"{err}; the run's last checkpoint reads well: --ckpt {shlex.quote(str(last))}") from None
    model = GPT(model_config_of(state, path))
    model.load_state_dict(state["model"])
    return model.to(device).eval(), CharTokenizer(state["vocab"]), state
