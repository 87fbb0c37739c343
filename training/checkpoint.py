"""Checkpoints: what one holds (CONTENTS), captured from a run and restored into one, and the self-describing file,
written atomically and read without unpickling code, every part checked before it is used."""
from __future__ import annotations

import math
import pickle
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from configs.loader import checked_types
from configs.schema import FIELDS, TYPES
from errors import UserError, in_one_line
from training.device import Dist, free_memory, unavailable
from training.run_folder import write_atomic


class Run(Protocol):
    """What capture() and restore() read and write of a run: training.opening.Run has all of it (opening builds
    runs from checkpoints, so this module names the parts instead of importing it)."""
    model: torch.nn.Module
    model_cfg: Any
    cfg: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scaler: Any
    batches: Any
    rt: Any
    data_info: dict
    tokens_per_iter: int


FORMAT = 1
# Everything a checkpoint holds, defined once: key -> (the types it may have, who needs it). "sample": every reader
# (enough to sample from it); "resume": what --resume needs besides; "later": optional, read with a default where a
# checkpoint lacks it. capture() writes exactly these keys (tested), restore() reads them.
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


@dataclass
class Progress:
    """Where a run is, the training loop's state, saved whole in every checkpoint: the step, the best validation loss,
    seconds spent in training steps (evaluations, samples, pictures and checkpoint writes excluded), whether the
    evaluation due at this step has been done, the losses the last evaluation measured, how many evaluations in a
    row have not beaten the best (for --patience), and the run's losses so far (every session's, for loss.png):
    "train", (step, loss) at each log line, and "eval", (step, train loss, validation loss) at each evaluation. The
    training loop (train.py) advances it, its Session (training.session) records evaluations in it."""
    it: int = 0
    best_val: float = math.inf
    train_seconds: float = 0.0
    eval_done: bool = False
    last_eval: dict = field(default_factory=dict)
    evals_since_best: int = 0
    losses: dict = field(default_factory=lambda: {"train": [], "eval": []})


def capture(run: Run, progress: Progress) -> dict:
    """Everything a checkpoint holds (CONTENTS, with the format added when it is saved): weights, configs,
    vocabulary, optimizer, step, random streams. restore() is its inverse."""
    return {
        "model": run.model.state_dict(), "model_config": run.model_cfg.to_dict(), "run_config": run.cfg.to_dict(),
        "vocab": run.tokenizer.chars, "optimizer": run.optimizer.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler.is_enabled() else None,
        "iter": progress.it, "best_val_loss": progress.best_val, "train_seconds": progress.train_seconds,
        "eval_done": progress.eval_done, "last_eval": progress.last_eval, "evals_since_best": progress.evals_since_best,
        "data": run.data_info, "tokens_per_iter": run.tokens_per_iter, "losses": progress.losses,
        "rng": {"torch": torch.get_rng_state(), "batches": run.batches.state_dict(),
                "cuda": torch.cuda.get_rng_state() if run.rt.device_type == "cuda" else None},
    }


def restore(run: Run, state: dict, d: Dist = Dist()) -> Progress:
    """The state of a checkpoint (checked by load() and check_resumable()) into run; returns where the run is."""
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    if state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    run.batches.load_state_dict(state["rng"]["batches"])  # the same stream, whatever the number of ranks
    if d.world_size == 1:  # (ranks draw their own dropout streams: seed + rank)
        torch.set_rng_state(state["rng"]["torch"])
        if run.rt.device_type == "cuda" and state["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(state["rng"]["cuda"].cpu())
    # A checkpoint without the optional fields was saved after the evaluation at its step: that one was done. One
    # without the losses so far (an older one) gives a loss picture from this session on.
    losses = state.get("losses", {"train": [], "eval": []})
    return Progress(it=state["iter"], best_val=state["best_val_loss"], train_seconds=state.get("train_seconds", 0.0),
                    eval_done=state.get("eval_done", True), last_eval=state.get("last_eval", {}),
                    evals_since_best=state.get("evals_since_best", 0),
                    losses={"train": [tuple(point) for point in losses["train"]],
                            "eval": [tuple(point) for point in losses["eval"]]})


def non_finite(weights: dict) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf, if any."""
    return next((name for name, t in weights.items()
                 if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all()), None)


def save(state: dict, path: Path) -> None:
    """Write to a temporary name, flush it to disk, then rename over the old file: never half a checkpoint."""
    bad = non_finite(state.get("model", {}))
    if bad:
        raise UserError(f"refusing to write {path}: the weights are not finite (NaN or inf in {bad}): training "
                        f"diverged; the previous checkpoint is kept; try a lower --learning_rate (or --dtype float32), "
                        f"then --resume")
    write_atomic(path, lambda f: torch.save({"format": FORMAT, **state}, f), "checkpoint")



def load(path: Path, device: torch.device | str = "cpu") -> dict:
    """Read a checkpoint with weights_only=True (tensors and plain data only) and check that it is complete."""
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; train one first (python train.py) or pass --ckpt FILE")
    target = device_to_load_onto(device, path)
    try:
        state = torch.load(path, map_location=target, weights_only=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err) and "GLOBAL" in str(err):  # it names code to run
            raise UserError(f"{path} was refused: it asks to run code or build objects beyond tensors and plain "
                            f"data, which a checkpoint of this trainer never does") from None
        raise UserError(f"{path} is not a readable checkpoint (UnpicklingError); it may be truncated or "
                        f"not a checkpoint at all") from None
    except Exception as err:  # truncated zip, random bytes, wrong file type; or a device that cannot hold it
        if target.type != "cpu" and readable_on_cpu(path):  # the file is sound: the device (or its dtypes) is not
            raise UserError(f"{path} is readable, but {target} cannot hold its weights ({in_one_line(err)}); load it "
                            f"onto cpu") from None
        raise UserError(f"{path} is not a readable checkpoint ({type(err).__name__}); it may be truncated or "
                        f"not a checkpoint at all") from None
    check_fields(state, REQUIRED, path)
    check_fields(state, {key: kind for key, kind in LATER.items() if key in state}, path)  # present: of their type
    if state["format"] != FORMAT:
        raise UserError(f"{path} has checkpoint format {state['format']}, this version reads format {FORMAT}; "
                        f"use the version of this trainer that wrote it")
    if state["iter"] < 0:
        raise UserError(f"{path} is damaged: its step is {state['iter']}")
    if "losses" in state:
        check_losses(state["losses"], state["iter"], path)
    check_tensors(state["model"], path)
    bad = non_finite(state["model"])
    if bad:
        raise UserError(f"{path} holds weights that are not finite (NaN or inf in {bad}); it cannot be used: "
                        f"take another checkpoint (ckpt_best.pt or ckpt_last.pt) or train again")
    # every known field of the run's settings of its type (--resume checks their values too: config_from_dict)
    checked_types({k: v for k, v in state["run_config"].items() if k in FIELDS}, f"{path} is damaged")
    check_model(state, path)
    return state


def device_to_load_onto(device: torch.device | str, path: Path) -> torch.device:
    """The device a checkpoint is loaded onto, or one line saying that this machine has no such device (before the
    file is read, so that it is never mistaken for a damaged file)."""
    try:
        target = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UserError(f"cannot load {path} onto {device!r}: not a device; give cpu, cuda, cuda:N or mps") from None
    if reason := unavailable(target):
        raise UserError(f"cannot load {path} onto {target}: {reason}; load it onto cpu") from None
    return target


def readable_on_cpu(path: Path) -> bool:
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return False
    return True


WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_tensors(weights: dict, path: Path) -> None:
    """Every entry of the model a named, ordinary tensor of real numbers: the kinds a saved model holds. A meta,
    sparse or nested tensor, or one of complex or whole numbers, would fail (or silently compute something else)
    once it met the model."""
    for name, t in weights.items():
        if not (isinstance(name, str) and isinstance(t, torch.Tensor)):
            raise UserError(f"{path} is damaged: its model holds entries that are not named tensors")
        kind = ("a meta tensor (shape without values)" if t.is_meta else "a nested tensor" if t.is_nested else
                f"a {t.layout} tensor" if t.layout != torch.strided else
                f"a {t.dtype} tensor" if t.dtype not in WEIGHT_DTYPES else None)
        if kind:
            raise UserError(f"{path} is damaged: its weight {name[:80]} is {kind}, where a model holds ordinary "
                            f"floating-point tensors; take another checkpoint or train again")


def model_config_of(state: dict, path: Path):
    """The checkpoint's ModelConfig, every field of its own type and consistent with the vocabulary, or one line."""
    from data.tokenizer import CharTokenizer
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


def check_model(state: dict, path: Path) -> None:
    """The model the config describes, checked against the saved weights before it is built: a config is only words,
    and one that asks for 200 layers of width 8192 beside a few kilobytes of weights would otherwise allocate hundreds
    of GB. The model is built on the meta device (shapes, no memory), after its layer count is checked against the
    saved blocks (so even that costs no more than the file); then every weight's name and shape must match, and
    what the real model would take beyond the saved weights (its copy of them, the rotary tables, which are not
    saved) must fit in the free memory."""
    from model import GPT

    config, weights = model_config_of(state, path), state["model"]
    blocks = {name.split(".")[1] for name in weights if name.startswith("blocks.")}
    if blocks != {str(i) for i in range(config.n_layer)}:
        raise UserError(f"{path}: the weights do not fit the model config (n_layer {config.n_layer}, but the weights "
                        f"hold {len(blocks)} blocks)")
    try:
        with torch.device("meta"):
            skeleton = GPT(config)
    except (OverflowError, RuntimeError, ValueError) as err:  # sizes no tensor can have
        raise UserError(f"{path}: its model config describes a model that cannot be built "
                        f"({str(err).splitlines()[0][:120]}); it is damaged") from None
    wanted = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    saved = {name: tuple(t.shape) for name, t in weights.items()}
    if wanted != saved:
        name = next(n for n in sorted(wanted.keys() | saved.keys()) if wanted.get(n) != saved.get(n))
        raise UserError(f"{path}: the weights do not fit the model config ({name}: the config gives "
                        f"{shape_text(wanted.get(name))}, the file holds {shape_text(saved.get(name))})")
    need = sum(t.numel() * 4 for t in [*skeleton.parameters(), *skeleton.buffers()])  # float32
    free = free_memory()
    if free is not None and need > free:
        raise UserError(f"{path}: its model would need about {need / 2**30:.1f} GiB of memory, more than the "
                        f"{free / 2**30:.1f} GiB this machine has free (block_size {config.block_size} x n_layer "
                        f"{config.n_layer} x n_embd {config.n_embd}); use it on a machine with more memory")


def shape_text(shape: tuple | None) -> str:
    return "no such weight" if shape is None else "(" + ", ".join(map(str, shape)) + ")"


def check_fields(state, fields: dict, path: Path) -> None:
    """Every field present and of its type (bool is not taken for a number), or a one-line error naming them."""
    if not isinstance(state, dict):
        raise UserError(f"{path} is not a checkpoint of this trainer (it holds a {type(state).__name__})")
    missing = [k for k in fields if k not in state]
    if missing:
        raise UserError(f"{path} is not a complete checkpoint (missing {', '.join(missing)})")
    wrong = [k for k in fields if not of_type(state[k], fields[k])]
    if wrong:
        raise UserError(f"{path} is damaged: {', '.join(f'{k} is a {type(state[k]).__name__}' for k in wrong)}")


def of_type(value, kind) -> bool:
    """isinstance, except that a bool is not taken for a number."""
    return isinstance(value, kind) and (not isinstance(value, bool) or kind is bool)


def check_losses(losses: dict, it: int, path: Path) -> None:
    """The losses so far (Progress.losses): "train" a list of (step, loss), "eval" of (step, train loss, validation
    loss), steps whole numbers from 0 to the checkpoint's, losses numbers; else one line."""
    def points(name: str, width: int) -> bool:
        series = losses.get(name)
        return isinstance(series, (list, tuple)) and all(
            isinstance(point, (list, tuple)) and len(point) == width and type(point[0]) is int and 0 <= point[0] <= it
            and all(of_type(value, (int, float)) for value in point[1:]) for point in series)

    if not (set(losses) == {"train", "eval"} and points("train", 2) and points("eval", 3)):
        raise UserError(f"{path} is damaged: its record of the losses so far is malformed; take another checkpoint "
                        f"or train again")


def check_resumable(state: dict, path: Path) -> None:
    """What --resume needs beyond what sampling needs, checked before any of it is used (load() has checked the
    later additions where present: an older checkpoint resumes with their defaults)."""
    check_fields(state, RESUMABLE, path)
    rng = state["rng"]
    batches = rng.get("batches")
    if not (isinstance(rng.get("torch"), torch.Tensor) and isinstance(batches, dict)
            and isinstance(batches.get("generator"), torch.Tensor)):
        raise UserError(f"{path} is damaged: its random-number states are missing or malformed, so it cannot be "
                        f"resumed exactly; sample from it, or start a new run")


def load_model(path: Path, device: torch.device | str = "cpu"):
    """A checkpoint's model (in eval mode) and tokenizer, with a one-line error for any inconsistency (load() has
    checked the config against the weights before anything is built)."""
    from data.tokenizer import CharTokenizer
    from model import GPT

    state = load(path, device)
    model = GPT(model_config_of(state, path))
    model.load_state_dict(state["model"])
    return model.to(device).eval(), CharTokenizer(state["vocab"]), state
