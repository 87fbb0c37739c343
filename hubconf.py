"""torch.hub's entry to a trained run: torch.hub.load(CHECKOUT, "chargpt", RUN_FOLDER, source="local") gives the run's
model and tokenizer, with generate(prompt) -> text, from any Python program, without putting this checkout on its path.

This project's modules have plain top-level names (model, data, training, configs, errors), which a program may
use for its own modules. So they are imported here under those names only while this file's code runs, and the
program's own modules of the same names are put back in sys.modules afterwards; every call that may import
(loading, generating) runs inside the same swap."""
from __future__ import annotations

import contextlib
import importlib
import math
import sys
from pathlib import Path
from typing import Iterator

dependencies = ["torch", "numpy"]  # what torch.hub checks before it calls an entry

HERE = str(Path(__file__).resolve().parent)
OWN = ("model", "data", "training", "configs", "errors")
_ours: dict = {}  # this checkout's modules, once imported


def _owned(name: str) -> bool:
    return name.split(".", 1)[0] in OWN


@contextlib.contextmanager
def _project() -> Iterator[None]:
    """This checkout's modules in sys.modules (and the checkout on sys.path) for the duration; the caller's own
    modules of those names, if any, back afterwards."""
    theirs = {name: module for name, module in sys.modules.items() if _owned(name)}
    for name in theirs:
        del sys.modules[name]
    sys.modules.update(_ours)
    sys.path.insert(0, HERE)
    try:
        yield
    finally:
        sys.path.remove(HERE)
        for name in [name for name in sys.modules if _owned(name)]:
            _ours[name] = sys.modules.pop(name)
        sys.modules.update(theirs)


class TrainedRun:
    """A trained run's model (a torch.nn.Module, in eval mode) and tokenizer, and text generation with sample.py's
    settings and defaults."""

    def __init__(self, model, tokenizer, state: dict, path: Path):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self.step = state["iter"]
        data = state.get("data") if isinstance(state.get("data"), dict) else {}
        self.default_prompt = tokenizer.default_prompt(data.get("first_char"))
        loss = state.get("best_val_loss")
        self.val_loss = loss if isinstance(loss, float) and math.isfinite(loss) else None

    def generate(self, prompt: str | None = None, max_new_tokens: int = 500, temperature: float = 0.8,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 1337) -> str:
        """The prompt's continuation (the new text only; the prompt left out: sample.py's default, a newline where
        the text has them): the same seed and settings give the same text as
        python scripts/sample.py --prompt PROMPT --stream with those settings."""
        import torch

        prompt = self.default_prompt if prompt is None else prompt
        unknown = self.tokenizer.unknown(prompt)
        if not prompt or unknown:
            raise ValueError(f"the prompt needs at least one character, all of them known to the model; unknown: "
                             f"{sorted(set(unknown))[:10]}")
        with _project():
            generate = importlib.import_module("model.generate")
            device = self.model.wte.weight.device
            generator = torch.Generator(device=device).manual_seed(seed)
            new = generate.generate(self.model, [self.tokenizer.encode(prompt)], max_new_tokens,
                                    temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                                    finite_only=True)  # NaN or inf scores: a ValueError, never text drawn from them
        return self.tokenizer.decode(new[0])

    def __repr__(self) -> str:
        loss = f", validation loss {self.val_loss:.4f}" if self.val_loss is not None else ""
        return f"TrainedRun({str(self.path)!r}, step {self.step}{loss}, {self.model.num_params():,} parameters)"


def chargpt(run: str, device: str = "cpu") -> TrainedRun:
    """The model of a run folder written by train.py (its ckpt_best.pt, else ckpt_last.pt), or of a checkpoint file,
    read with weights_only=True and checked as every script checks it; on device ("cpu", "cuda", "cuda:N")."""
    with _project():
        checkpoint = importlib.import_module("training.checkpoint")
        run_folder = importlib.import_module("training.run_folder")
        errors = importlib.import_module("errors")
        where = Path(run).expanduser()
        try:
            path = where if where.is_file() else run_folder.find(str(where), "")
            model, tokenizer, state = checkpoint.load_model(path, device)
        except errors.UserError as err:
            raise ValueError(str(err)) from None
    return TrainedRun(model, tokenizer, state, path)
