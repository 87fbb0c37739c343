"""torch.hub's entry to a trained run: torch.hub.load(CHECKOUT, "chargpt", RUN_FOLDER, source="local")."""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import sys
from pathlib import Path
from typing import Iterator

import torch

dependencies = ["torch", "numpy"]

HERE = str(Path(__file__).resolve().parent)
OWN = ("model", "data", "common", "training", "configs", "errors")
_ours: dict = {}  # this checkout's modules, once imported


def _owned(name: str) -> bool:
    return name.split(".", 1)[0] in OWN


@contextlib.contextmanager
def _project(*names: str) -> Iterator[list]:
    """This checkout's modules, names imported, for the duration; then the caller's modules back."""
    theirs = {name: module for name, module in sys.modules.items() if _owned(name)}
    for name in theirs:
        del sys.modules[name]
    sys.modules.update(_ours)
    sys.path.insert(0, HERE)
    try:
        yield [importlib.import_module(name) for name in names]
    finally:
        sys.path.remove(HERE)
        for name in [name for name in sys.modules if _owned(name)]:
            _ours[name] = sys.modules.pop(name)
        sys.modules.update(theirs)


class TrainedRun:
    """A trained run's model, in eval mode, and tokenizer."""

    def __init__(self, model, tokenizer, state: dict, path: Path):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self.step = state["iter"]
        data = state.get("data") if isinstance(state.get("data"), dict) else {}
        self.default_prompt = tokenizer.default_prompt(data.get("first_char"))
        loss = state.get("best_val_loss")
        self.val_loss = loss if isinstance(loss, float) and math.isfinite(loss) else None
        run = state.get("run_config") if isinstance(state.get("run_config"), dict) else {}
        self.run_dtype = run.get("dtype", "auto")
        self.batch_size = run.get("batch_size", 16)

    def _ids(self, text: str, what: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"the {what} must be a str, not {type(text).__name__}")
        unknown = self.tokenizer.unknown(text)
        if not text or unknown:
            raise ValueError(f"the {what} needs characters the model knows; unknown: {sorted(set(unknown))[:10]}")
        return self.tokenizer.encode(text)

    def generate(self, prompt: str | list[str] | tuple[str, ...] | None = None, max_new_tokens: int = 500,
                 seed: int = 1337, **sampling) -> str | list[str]:
        """The prompt's continuation, or a list of them for a list, as sample.py draws them."""
        batch = isinstance(prompt, (list, tuple))
        if not (batch or prompt is None or isinstance(prompt, str)):
            raise TypeError(f"the prompt must be a str, or a list or tuple of them, not {type(prompt).__name__}")
        prompts = list(prompt) if batch else [self.default_prompt if prompt is None else prompt]
        if not prompts:
            raise ValueError("generate() needs a prompt, or a list of at least one")
        rows = [self._ids(text, "prompt") for text in prompts]
        with _project("model.generate", "common.machine") as (generate, machine):
            generate.check_length_and_seed(max_new_tokens, seed)
            known = [option.name for option in dataclasses.fields(generate.Sampling)]
            if unknown := [name for name in sampling if name not in known]:
                raise TypeError(f"generate() got an unexpected keyword argument {unknown[0]!r}; it takes the prompt, "
                                f"max_new_tokens, seed, {', '.join(known)}")
            options = dataclasses.asdict(generate.Sampling(**sampling))
            device, n = self.model.wte.weight.device, int(max_new_tokens)
            need = generate.bytes_needed(self.model, len(rows), max(map(len, rows)), n)
            with machine.fits_in_memory(need, device, f"{len(rows):,} prompt(s) and {n:,} new characters",
                                        "ask for fewer max_new_tokens or fewer prompts", MemoryError):
                new = generate.generate(self.model, rows, n, **options, finite_only=True,
                                        generator=torch.Generator(device=device).manual_seed(int(seed)))
        texts = [self.tokenizer.decode(row) for row in new]
        return texts if batch else texts[0]

    def logits(self, text: str):
        """(len(text), vocab) float32 logits after each character of text."""
        ids = self._ids(text, "text")
        if len(ids) > self.model.config.block_size:
            raise ValueError(f"the text has {len(ids)} characters, more than the model's block_size "
                             f"{self.model.config.block_size}; give a shorter one, or use score()")
        with torch.inference_mode():
            return self.model(torch.tensor([ids], device=self.model.wte.weight.device))[0][0].float()

    def score(self, text: str, stride: int | None = None) -> float:
        """Bits per character of text, as scripts/evaluate.py measures it."""
        ids = self._ids(text, "text")
        if len(ids) < 2:
            raise ValueError("score() needs at least two characters: the first is only context")
        with _project("training.evaluation", "common.machine", "data.loader", "errors") as modules:
            evaluation, machine, loader, errors = modules
            place, block_size = self.model.wte.weight.device, self.model.config.block_size
            try:
                runtime = machine.Runtime(place, machine.pick_dtype(self.run_dtype, place))
            except errors.UserError as err:
                raise ValueError(f"{err}; move the model with to(device) first") from None
            windows = loader.Windows(len(ids), block_size, block_size if stride is None else stride)
            nats, scored = evaluation.score(self.model, torch.tensor(ids, dtype=torch.int32), windows,
                                            self.batch_size, runtime.autocast)
        return nats / scored / math.log(2)

    def to(self, device=None, dtype=None) -> "TrainedRun":
        """The model moved to device and/or cast to dtype; returns self."""
        if device is not None:
            with _project("common.machine", "errors") as (machine, errors):
                try:
                    device = machine.usable_device(device, "move the model to",
                                                   f"keep it on {self.model.wte.weight.device}")
                except errors.UserError as err:
                    raise ValueError(str(err)) from None
        self.model.to(device=device, dtype=dtype)
        return self

    def __repr__(self) -> str:
        loss = f", validation loss {self.val_loss:.4f}" if self.val_loss is not None else ""
        return f"TrainedRun({str(self.path)!r}, step {self.step}{loss}, {self.model.num_params():,} parameters)"


def chargpt(run: str, device: str = "cpu") -> TrainedRun:
    """The model of a run folder or checkpoint file, on device."""
    with _project("training.checkpoint", "common.run_folder", "errors") as (checkpoint, run_folder, errors):
        where = Path(run).expanduser()
        try:
            path = where if where.is_file() else run_folder.find(str(where), "", option="the run argument")
            model, tokenizer, state = checkpoint.load_model(path, device)
        except errors.UserError as err:
            raise ValueError(str(err)) from None
    return TrainedRun(model, tokenizer, state, path)
