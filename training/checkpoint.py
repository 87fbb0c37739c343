"""Checkpoints: self-describing files written atomically and read without unpickling code."""
from __future__ import annotations

import pickle
from pathlib import Path

import torch

from errors import UserError
from training.files import write_atomic

FORMAT = 1
BEST, LAST = "ckpt_best.pt", "ckpt_last.pt"  # a run folder's two checkpoints: its model, and the latest state
ASIDE = ".replaced"  # where --overwrite keeps the old run until the new one has saved a checkpoint
# Everything a checkpoint holds, defined once: key -> (the types it may have, who needs it). "sample": every reader
# (enough to sample from it); "resume": what --resume needs besides; "later": added since, read with a default when an
# older checkpoint lacks it. training.build.capture() writes exactly these keys (tested), restore() reads them.
CONTENTS = {
    "format": (int, "sample"), "model": (dict, "sample"), "model_config": (dict, "sample"),
    "run_config": (dict, "sample"), "vocab": (str, "sample"), "iter": (int, "sample"),
    "optimizer": (dict, "resume"), "rng": (dict, "resume"), "best_val_loss": ((int, float), "resume"),
    "scaler": ((dict, type(None)), "later"), "train_seconds": ((int, float), "later"), "eval_done": (bool, "later"),
    "last_eval": (dict, "later"), "evals_since_best": (int, "later"), "data": (dict, "later"),
}
REQUIRED = {key: kind for key, (kind, needed_by) in CONTENTS.items() if needed_by == "sample"}
RESUMABLE = {key: kind for key, (kind, needed_by) in CONTENTS.items() if needed_by == "resume"}
LATER = {key: kind for key, (kind, needed_by) in CONTENTS.items() if needed_by == "later"}


def non_finite(weights: dict) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf, if any."""
    return next((name for name, t in weights.items()
                 if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all()), None)


def save(state: dict, path: Path) -> None:
    """Write to a temporary name, flush it to disk, then rename over the old file: never half a checkpoint."""
    bad = non_finite(state.get("model", {}))
    if bad:
        raise UserError(f"refusing to write {path}: the weights are not finite (NaN or inf in {bad}); the previous "
                        f"checkpoint is kept")
    write_atomic(path, lambda f: torch.save({"format": FORMAT, **state}, f), "checkpoint")


def find(out_dir: str, ckpt: str, names: tuple[str, ...] = (BEST, LAST)) -> Path:
    """The checkpoint a script should read: --ckpt FILE, else the first of names in the run folder (by default the
    run's model, ckpt_best.pt: the lowest validation loss it measured; ckpt_last.pt only where there is none)."""
    if ckpt:
        return Path(ckpt)
    if not out_dir:
        raise UserError("say which model: --out_dir DIR (a training run's folder) or --ckpt FILE")
    for name in names:
        if (Path(out_dir) / name).exists():
            return Path(out_dir) / name
    if any((Path(out_dir) / ASIDE / name).exists() for name in names):  # an --overwrite that stopped before saving
        raise UserError(f"{out_dir} holds no {' or '.join(names)}: an --overwrite stopped before its first checkpoint, "
                        f"and the run it was replacing waits in {Path(out_dir) / ASIDE}; python train.py --out_dir "
                        f"{out_dir} --resume puts it back and continues it")
    raise UserError(f"{out_dir} holds no {' or '.join(names)}; train first: python train.py --out_dir {out_dir}")


def load(path: Path, device: torch.device | str = "cpu") -> dict:
    """Read a checkpoint with weights_only=True (tensors and plain data only) and check that it is complete."""
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; train one first (python train.py) or pass --ckpt FILE")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err) and "GLOBAL" in str(err):  # it names code to run
            raise UserError(f"{path} was refused: it asks to run code or build objects beyond tensors and plain "
                            f"data, which a checkpoint of this trainer never does") from None
        raise UserError(f"{path} is not a readable checkpoint (UnpicklingError); it may be truncated or "
                        f"not a checkpoint at all") from None
    except Exception as err:  # truncated zip, random bytes, wrong file type
        raise UserError(f"{path} is not a readable checkpoint ({type(err).__name__}); it may be truncated or "
                        f"not a checkpoint at all") from None
    check_fields(state, REQUIRED, path)
    if state["format"] != FORMAT:
        raise UserError(f"{path} has checkpoint format {state['format']}, this version reads format {FORMAT}; "
                        f"use the version of this trainer that wrote it")
    if state["iter"] < 0:
        raise UserError(f"{path} is damaged: its step is {state['iter']}")
    bad = non_finite(state["model"])
    if bad:
        raise UserError(f"{path} holds weights that are not finite (NaN or inf in {bad}); it cannot be used: "
                        f"take another checkpoint (ckpt_best.pt or ckpt_last.pt) or train again")
    return state


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


def check_resumable(state: dict, path: Path) -> None:
    """What --resume needs beyond what sampling needs, checked before any of it is used (the later additions only
    where present: an older checkpoint resumes with their defaults)."""
    check_fields(state, RESUMABLE, path)
    check_fields(state, {key: kind for key, kind in LATER.items() if key in state}, path)
    rng = state["rng"]
    batches = rng.get("batches")
    if not (isinstance(rng.get("torch"), torch.Tensor) and isinstance(batches, dict)
            and isinstance(batches.get("generator"), torch.Tensor)):
        raise UserError(f"{path} is damaged: its random-number states are missing or malformed, so it cannot be "
                        f"resumed exactly; sample from it, or start a new run")


def load_model(path: Path, device: torch.device | str = "cpu"):
    """A checkpoint's model (in eval mode) and tokenizer, with a one-line error for any inconsistency."""
    from data.tokenizer import CharTokenizer
    from model import GPT, ModelConfig

    state = load(path, device)
    try:
        config = ModelConfig(**state["model_config"])
        tokenizer = CharTokenizer(state["vocab"])
    except (TypeError, ValueError) as err:
        raise UserError(f"{path} has an inconsistent model config or vocabulary ({err})") from None
    if tokenizer.vocab_size != config.vocab_size:
        raise UserError(f"{path} is inconsistent: its vocabulary has {tokenizer.vocab_size} characters "
                        f"but its model expects {config.vocab_size}")
    model = GPT(config)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, TypeError, AttributeError) as err:
        raise UserError(f"{path}: the weights do not fit the model config ({str(err).splitlines()[0][:150]})") from None
    return model.to(device).eval(), tokenizer, state
