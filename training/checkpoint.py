"""Checkpoints: self-describing files written atomically and read without unpickling code."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from errors import UserError

FORMAT = 1
REQUIRED = ("format", "model", "model_config", "run_config", "vocab", "iter")


def save(state: dict, path: Path) -> None:
    """Write to a temporary name, flush it to disk, then rename over the old file: never half a checkpoint."""
    weights = state.get("model", {})
    if not all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point()):
        raise UserError(f"refusing to write {path}: the weights are not finite (NaN or inf); the previous "
                        f"checkpoint is kept")
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise UserError(f"could not write checkpoint {path} ({err.strerror or err}); "
                        f"the previous checkpoint is untouched; free some disk space or choose another --out_dir") from None


def find(out_dir: str, ckpt: str) -> Path:
    """The checkpoint a script should read: --ckpt FILE, else the run folder's ckpt_best.pt, else ckpt_last.pt."""
    if ckpt:
        return Path(ckpt)
    if not out_dir:
        raise UserError("say which model: --out_dir DIR (a training run's folder) or --ckpt FILE")
    for name in ("ckpt_best.pt", "ckpt_last.pt"):
        if (Path(out_dir) / name).exists():
            return Path(out_dir) / name
    raise UserError(f"{out_dir} holds no ckpt_best.pt or ckpt_last.pt; train first: python train.py --out_dir {out_dir}")


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
    missing = [k for k in REQUIRED if not isinstance(state, dict) or k not in state]
    if missing:
        raise UserError(f"{path} is not a complete checkpoint (missing {', '.join(missing)})")
    if state["format"] != FORMAT:
        raise UserError(f"{path} has checkpoint format {state['format']}, this version reads format {FORMAT}; "
                        f"use the version of this trainer that wrote it")
    return state


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
