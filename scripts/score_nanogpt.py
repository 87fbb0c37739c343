"""python scripts/score_nanogpt.py NANOGPT_DIR CKPT: a nanoGPT checkpoint's full validation, measured as ours is.

nanoGPT splits and numbers the characters as we do, so its val.bin is our validation split."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common.machine import Runtime, setup  # noqa: E402
from data.loader import val_window_starts  # noqa: E402
from errors import ArgumentParser, UserError, run_cli  # noqa: E402


def load_nanogpt(folder: Path, ckpt: Path, device: torch.device):
    """nanoGPT's GPT with the checkpoint's weights, in eval mode, and the checkpoint's facts."""
    if not (folder / "model.py").is_file():
        raise UserError(f"{folder} has no model.py; give the folder of a nanoGPT checkout")
    if not ckpt.is_file():
        raise UserError(f"no checkpoint at {ckpt}; give its train.py's ckpt.pt")
    spec = importlib.util.spec_from_file_location("nanogpt_model", folder / "model.py")
    nanogpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nanogpt)
    try:
        state = torch.load(ckpt, map_location=device, weights_only=True)
        weights = {k.removeprefix("_orig_mod."): v for k, v in state["model"].items()}
        check_shapes(nanogpt, state["model_args"], weights, ckpt)
        model = nanogpt.GPT(nanogpt.GPTConfig(**state["model_args"]))
        model.load_state_dict(weights)
        facts = {"step": state["iter_num"], "estimate": float(state["best_val_loss"]),
                 "dataset": state["config"]["dataset"], "block_size": state["model_args"]["block_size"]}
    except UserError:
        raise
    except Exception as err:  # truncated, refused, or not in nanoGPT's layout
        missing = f": no {err}" if isinstance(err, KeyError) else ""
        raise UserError(f"{ckpt} is not a readable nanoGPT checkpoint ({type(err).__name__}{missing}); give its "
                        f"train.py's ckpt.pt") from None
    return model.to(device).eval(), facts


def check_shapes(nanogpt, model_args: dict, weights: dict, ckpt: Path) -> None:
    """Refuse model_args that do not give the saved weights' names and shapes (built on the meta device)."""
    n_layer = model_args.get("n_layer")
    if not isinstance(n_layer, int) or not 0 <= n_layer <= len(weights):
        raise UserError(f"{ckpt}: its model_args (n_layer {n_layer!r}) do not fit its {len(weights)} weights")
    with torch.device("meta"), contextlib.redirect_stdout(io.StringIO()):  # nanoGPT prints a count
        wanted = {name: tuple(t.shape) for name, t in nanogpt.GPT(nanogpt.GPTConfig(**model_args)).state_dict().items()}
    saved = {name: tuple(t.shape) for name, t in weights.items()}
    if wanted != saved:
        name = next(n for n in sorted(wanted.keys() | saved.keys()) if wanted.get(n) != saved.get(n))
        raise UserError(f"{ckpt}: its model_args do not fit its weights ({name}: {wanted.get(name)} by the args, "
                        f"{saved.get(name)} in the file)")


@torch.inference_mode()
def full_validation(model, val: np.ndarray, block_size: int, batch_size: int, rt: Runtime) -> float:
    starts = val_window_starts(len(val), block_size)
    steps = np.arange(block_size + 1)
    total = 0.0
    for i in range(0, len(starts), batch_size):
        rows = torch.from_numpy(val[starts[i:i + batch_size, None] + steps].astype(np.int64)).to(rt.device)
        with rt.autocast():
            _, loss = model(rows[:, :-1].contiguous(), rows[:, 1:].contiguous())
        total += loss.double().item() * len(rows)
    return total / len(starts)


def score(folder: Path, ckpt: Path, rt: Runtime, batch_size: int = 64) -> tuple[float, dict]:
    """The full validation on the folder's val.bin, and the checkpoint's facts."""
    model, facts = load_nanogpt(folder, ckpt, rt.device)
    val_path = folder / "data" / facts["dataset"] / "val.bin"
    if not val_path.is_file():
        raise UserError(f"{val_path} is missing; run nanoGPT's prepare.py in that folder first")
    val = np.fromfile(val_path, dtype=np.uint16)
    facts["windows"] = len(val_window_starts(len(val), facts["block_size"]))
    return full_validation(model, val, facts["block_size"], batch_size, rt), facts


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split(":", 1)[1].split("\n\n")[0].strip())
    parser.add_argument("nanogpt_dir", type=Path, help="a checkout of karpathy/nanoGPT, its data prepared")
    parser.add_argument("ckpt", type=Path, help="the ckpt.pt its train.py saved")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="autocast precision; auto: as train.py's auto")
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args(argv)
    rt = setup(args.device, args.dtype)
    loss, facts = score(args.nanogpt_dir, args.ckpt, rt, args.batch_size)
    print(f"nanoGPT {args.ckpt}: step {facts['step']}, its own estimate {facts['estimate']:.4f}; "
          f"full validation {loss:.4f} ({facts['windows']} windows of {facts['block_size']} on {rt.device.type}, "
          f"{str(rt.dtype).removeprefix('torch.')})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
