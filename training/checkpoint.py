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


def load(path: Path, device: torch.device | str = "cpu") -> dict:
    """Read a checkpoint with weights_only=True (tensors and plain data only) and check that it is complete."""
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; train one first (python train.py) or pass --ckpt FILE")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else "unsupported content"
        raise UserError(f"{path} was refused: it holds more than tensors and plain data ({first[:120]}); "
                        f"only load checkpoints you trust, written by this trainer") from None
    except Exception as err:  # truncated zip, random bytes, wrong file type
        raise UserError(f"{path} is not a readable checkpoint ({type(err).__name__}); it may be truncated or "
                        f"not a checkpoint at all") from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED):
        missing = [k for k in REQUIRED if not isinstance(state, dict) or k not in state]
        raise UserError(f"{path} is not a complete checkpoint (missing {', '.join(missing)})")
    if state["format"] != FORMAT:
        raise UserError(f"{path} has checkpoint format {state['format']}, this version reads format {FORMAT}; "
                        f"use the version of this trainer that wrote it")
    return state
