"""torch.compile for a training run: each transformer block (one graph serves them all) or the whole model, with a
fallback to the uncompiled model, and a warning, when compiling fails."""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn as nn

from errors import in_one_line
from model.gpt import GPT
from training.runtime import is_out_of_memory


def compile_wanted(setting: str, device_type: str) -> bool:
    """--compile true, or auto on CUDA."""
    return setting == "true" or (setting == "auto" and device_type == "cuda")


class BlocksCompiled:
    """A view of a GPT whose blocks are compiled: the same parameters, buffers and submodules, except that its
    `blocks` are torch.compile'd copies of the model's. Every block has the same code and shapes, so dynamo compiles
    one graph and every layer runs it (PyTorch's "regional compilation"). The model itself is untouched: sampling and
    checkpoints keep using it, and uncompile() gives the view the plain blocks back.

    On a 2-core AMD EPYC, the 6x6x384 model, batch 2, an empty compile cache: the first training step took 20.1-20.6 s
    and the first evaluation 4.6-5.1 s, against 56.0-61.8 s and 14.0-21.2 s compiling the whole model; with the cache
    warm 1.9 s and 0.3 s against 3.6 s and 1.5 s; the steps that follow ran as fast (399-476 against 423-599 ms)."""

    def __init__(self, model: GPT, mode: str | None):
        self.plain = model.blocks
        self.view = copy.copy(model)  # a shallow copy: it shares every parameter, buffer and submodule ...
        self.view._modules = dict(model._modules)  # ... except the list of blocks, replaced below
        self.view._modules["blocks"] = nn.ModuleList(torch.compile(block, mode=mode) for block in model.blocks)

    def uncompile(self) -> None:
        self.view._modules["blocks"] = self.plain


def warn_failed(say, err: BaseException) -> None:
    say(f"warning: torch.compile failed ({in_one_line(err)}); continuing without it (--compile false skips the attempt)")


DEVICE_ERRORS = tuple(getattr(torch, name) for name in ("AcceleratorError",) if hasattr(torch, name))  # CUDA errors


class CompileFallback:
    """Calls `compiled` and, if it fails, warns once and calls `module` uncompiled from then on (after `uncompile`).

    Compilation happens on first use, so failures show up there: the failed call is repeated without compilation and
    the run goes on. Everything else (train(), eval(), no_sync(), ...) reaches the module."""

    def __init__(self, module, compiled: Callable, say=print, uncompile: Callable[[], None] = lambda: None):
        self.module, self.compiled, self.say, self.uncompile = module, compiled, say, uncompile
        # The backward of a compiled forward is compiled at its first .backward() (AOTAutograd compiles it lazily),
        # outside this call: training.step checks that one and calls fall_back() if it fails.
        self.backward_done = False

    @property
    def backward_unchecked(self) -> bool:
        return self.compiled is not None and not self.backward_done

    def fall_back(self, err: Exception) -> bool:
        """After err from compiled code: turn compilation off, with the warning, if err is the compiler's (True);
        False if it is the run's own (out of memory, a broken device: uncompiled code would fail too)."""
        if is_out_of_memory(err) or isinstance(err, DEVICE_ERRORS):
            return False
        warn_failed(self.say, err)
        self.compiled = None
        self.uncompile()
        return True

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as err:  # an inductor or driver problem must not end the run
                if not self.fall_back(err):
                    raise  # (the one-line out-of-memory message)
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.module, name)


def step_and_eval_models(model: GPT, wrap: Callable[[nn.Module], nn.Module], setting: str, device_type: str,
                         mode: str = "default", scope: str = "blocks", compile_eval: bool = True, say=print):
    """What the training loop calls and what evaluations call. wrap adds what the step needs around a model (DDP).

    compile on (--compile true, or auto on CUDA): scope "blocks" compiles each block (one graph for all of them,
    compiled about three times faster than the whole model's), "model" the whole model as one graph. mode is
    torch.compile's (configs.choices.COMPILE_MODES: none that replays CUDA graphs). compile_eval false:
    evaluations call the plain model, so only the training graph is compiled."""
    if not compile_wanted(setting, device_type):
        step_model = wrap(model)
        return step_model, step_model
    mode_arg = None if mode == "default" else mode
    # torch.compile may refuse at once (a Python that dynamo does not support yet, say): then only a warning. Only
    # the compiling is inside the try, so that a failure of the DDP wrapping is never called a compile failure.
    if scope == "model":  # the whole model is compiled with its DDP wrapper
        step_model = wrap(model)
        try:
            whole = torch.compile(step_model, mode=mode_arg)
        except RuntimeError as err:
            warn_failed(say, err)
            return step_model, step_model
        compiled = CompileFallback(step_model, whole, say)
    else:
        try:
            blocks = BlocksCompiled(model, mode_arg)
        except RuntimeError as err:
            warn_failed(say, err)
            step_model = wrap(model)
            return step_model, step_model
        step_model = wrap(blocks.view)
        compiled = CompileFallback(step_model, step_model, say, blocks.uncompile)
    return compiled, compiled if compile_eval else model
