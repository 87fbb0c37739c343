"""python scripts/export.py --out_dir RUN [--to DIR]: a trained model as files other programs read: model.safetensors,
config.json, vocab.json and, with requirements-export.txt, model.onnx."""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import (ArgumentParser, BooleanFlag, Interrupted, UserError, disk_error, in_one_line,  # noqa: E402
                    output_folder, quiet_while_loading, run_cli, space_or_place)

with quiet_while_loading(__name__):
    import torch

    from common.machine import is_out_of_memory
    from common.run_folder import WriteFailed, find, holder, write_atomic, write_text_atomic
    from data.gate import read_small
    from model.attention import ROPE_BASE
    from training.checkpoint import load_model

FORMAT = 1  # of config.json and vocab.json
ONNX_NEEDS = ("onnx", "onnxscript")  # what torch.onnx.export(dynamo=True) imports
ONNX_OPSET = 18


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    p.add_argument("--out_dir", default="", help="a run folder: exports its ckpt_best, else ckpt_last")
    p.add_argument("--ckpt", default="", help="a checkpoint file (instead of --out_dir)")
    p.add_argument("--to", default="", help="the folder to write into (default: export/ in the run's folder)")
    p.add_argument("--onnx", default=None, action=BooleanFlag,
                   help="also write model.onnx (default: if onnx and onnxscript are installed)")
    return p


def model_config(model, state: dict, path: Path) -> dict:
    """config.json: every setting the forward pass depends on, and where the weights came from."""
    rope = {"rope_base": ROPE_BASE} if model.config.position == "rope" else {}
    head = ("the tied head stored too (lm_head.weight, equal to wte.weight)" if model.config.tie_weights else
            "the head its own (lm_head.weight)")
    return {"model_type": "chargpt", "format": FORMAT, **model.config.to_dict(), **rope,
            "weights": f"model.safetensors: every weight by its PyTorch name, float32, {head}",
            "onnx": "model.onnx: idx, int64 (batch, time <= block_size) -> logits, float32 (batch, time, vocab_size); "
                    "row t scores the character after idx[:, :t + 1]",
            "checkpoint": str(path), "step": state["iter"]}


def write_safetensors(model, target: Path) -> None:
    """The weights in float32; a tied head is written twice, as safetensors shares no memory."""
    from safetensors.torch import save

    weights = {name: tensor.detach().to("cpu", torch.float32).contiguous().clone()
               for name, tensor in model.state_dict().items()}
    write_atomic(target, lambda f: f.write(save(weights, metadata={"format": "pt"})), "the weights", "--to")


class Logits(torch.nn.Module):
    """The forward pass as exported: (B, T) ids -> (B, T, vocab) logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)[0]


def write_onnx(model, target: Path) -> None:
    """model.onnx, its batch and length (up to block_size) left open."""
    import logging
    import tempfile
    import warnings

    for block in model.blocks:  # the fused kernel's causal flag does not export with an open length
        block.attn.path = "explicit"
    block_size = model.config.block_size
    example = torch.zeros(2, min(8, block_size), dtype=torch.long)
    shapes = {"idx": {0: torch.export.Dim("batch", min=1), 1: torch.export.Dim("time", min=1, max=block_size)}}
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's
        graph = Path(scratch) / "model.onnx"
        try:
            torch.onnx.export(Logits(model).eval(), (example,), str(graph), dynamo=True, input_names=["idx"],
                              output_names=["logits"], dynamic_shapes=shapes, opset_version=ONNX_OPSET,
                              external_data=False, verbose=False)
        except OSError as err:  # the exporter's write names no file
            raise WriteFailed(f"could not write the ONNX graph {target} ({disk_error(err)})", "nothing was written",
                              space_or_place(err, "--to")) from None
        except Exception as err:  # e.g. an onnxscript that does not match this torch
            if isinstance(err, MemoryError) or is_out_of_memory(err):
                raise UserError("out of memory while exporting the ONNX graph, so nothing was written; free some "
                                "memory, or pass --onnx=false") from None
            raise UserError(f"the ONNX graph could not be exported ({in_one_line(err)}), so nothing was written; "
                            f"pip install --upgrade -r requirements-export.txt, or pass --onnx=false") from None
        write_atomic(target, lambda f: f.write(graph.read_bytes()), "the ONNX graph", "--to")


SCRATCH_MARK = "export-scratch"  # an empty file, made first in each scratch folder
NAMES = ("model.safetensors", "config.json", "vocab.json", "model.onnx")


def is_scratch(entry: Path) -> bool:
    """Whether entry is an export's scratch folder, .export-PID-..., holding SCRATCH_MARK or nothing."""
    if not re.fullmatch(r"\.export-[0-9]+-.*", entry.name, re.DOTALL) or entry.is_symlink() or not entry.is_dir():
        return False
    mark = entry / SCRATCH_MARK
    return (mark.is_file() and not mark.is_symlink()) or not any(entry.iterdir())


def exported(file: Path) -> bool:
    """Whether file is a plain file, and a config.json or vocab.json with an export's marks."""
    if file.is_symlink() or not file.is_file():
        return False
    if file.suffix != ".json":
        return True
    try:
        data = json.loads(read_small(file, "the export's", 16 << 20).decode("utf-8"))
    except (OSError, ValueError, RecursionError, UserError):
        return False
    return isinstance(data, dict) and isinstance(data.get("format"), int) and (
        data.get("model_type") == "chargpt" if file.name == "config.json" else isinstance(data.get("chars"), list))


def refuse_others(folder: Path) -> None:
    """An export writes only into a new or empty folder, or over an earlier export."""
    entries = sorted(p.name for p in folder.iterdir() if not is_scratch(p))
    earlier = any(name in entries and exported(folder / name) for name in ("config.json", "vocab.json"))
    replaced = [name for name in NAMES if name in entries and not (earlier and exported(folder / name))]
    if replaced or (entries and not earlier):
        shown = replaced or entries[:3] + ["..."] * (len(entries) > 3)
        raise UserError(f"--to {folder} holds {', '.join(shown)}, not an earlier export's; choose another --to, a new "
                        f"or empty folder")


@contextlib.contextmanager
def alone_in(folder: Path):
    """folder locked by this export, so two exports never mix their files."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"--to {folder}: another export is writing into it now; wait for it to finish, or choose "
                            f"another --to") from None
        yield
    finally:
        os.close(fd)


def write_all(model, tokenizer, state: dict, path: Path, folder: Path, onnx: bool, moved: list[str]) -> list[str]:
    """The export's files, written in a scratch folder, then moved into folder and named in moved."""
    import tempfile

    names = list(NAMES[:3 + onnx])
    for scratch in filter(is_scratch, folder.iterdir()):  # left by a killed export; we hold the lock
        shutil.rmtree(scratch, ignore_errors=True)
    with contextlib.ExitStack() as stack:
        try:
            new = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=folder, prefix=f".export-{os.getpid()}-")))
            (new / SCRATCH_MARK).touch()
        except OSError as err:
            raise UserError(f"--to {folder} cannot be written ({disk_error(err)}); nothing was written; "
                            f"{space_or_place(err, '--to')}") from None
        try:
            write_safetensors(model, new / names[0])
            write_text_atomic(new / "config.json", json.dumps(model_config(model, state, path), indent=1) + "\n",
                              "config.json", "--to")
            vocab = {"format": FORMAT, "chars": list(tokenizer.chars),
                     "meaning": "id i is chars[i]"}
            write_text_atomic(new / "vocab.json", json.dumps(vocab, indent=1, ensure_ascii=False) + "\n",
                              "vocab.json", "--to")
            if onnx:
                write_onnx(model, new / "model.onnx")
        except WriteFailed as err:  # named by folder, not the scratch folder
            raise WriteFailed(err.failed.replace(str(new), str(folder)), err.kept, err.fix) from None
        for name in names:
            os.replace(new / name, folder / name)
            moved.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    missing = [name for name in ONNX_NEEDS if importlib.util.find_spec(name) is None]
    if args.onnx and missing:
        raise UserError(f"--onnx needs {' and '.join(missing)}: pip install -r requirements-export.txt")
    path = find(args.out_dir, args.ckpt)
    model, tokenizer, state = load_model(path, "cpu")
    folder = Path(args.to) if args.to else path.parent / "export"
    with output_folder(folder, "--to"), alone_in(folder):
        if owner := holder(folder):
            raise UserError(f"--to {folder} is the folder of a run that {owner} is training; choose another --to")
        refuse_others(folder)
        onnx = args.onnx is not False and not missing
        if not onnx and (folder / "model.onnx").exists():
            needs = f", or pip install -r requirements-export.txt ({' and '.join(missing)})" if missing else ""
            raise UserError(f"--to {folder} holds a model.onnx this export would not replace; move it away, or choose "
                            f"another --to{needs}")
        moved: list[str] = []
        try:
            written = write_all(model, tokenizer, state, path, folder, onnx, moved)
        except KeyboardInterrupt:
            if not moved:
                raise Interrupted(f"interrupted before anything was written into {folder}; what was there is as it "
                                  f"was") from None
            raise Interrupted(f"interrupted while moving files into {folder}: only {', '.join(moved)} are new; "
                              f"export again") from None
    print(f"{path}: step {state['iter']}, {model.num_params(non_embedding=False):,} parameters; wrote "
          f"{', '.join(written)} into {folder}")
    if owner := holder(path.parent):  # its checkpoint may be replaced by a better one
        print(f"note: {owner} is still training {path.parent}; this export is of its {path.name} at step "
              f"{state['iter']}", file=sys.stderr)
    if args.onnx is None and missing:
        print(f"model.onnx was not written: it needs {' and '.join(missing)} (pip install -r requirements-export.txt)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
