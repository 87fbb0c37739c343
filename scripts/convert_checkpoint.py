"""python scripts/convert_checkpoint.py RUN: a run's old checkpoints (.pt) into .safetensors files beside them."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import ArgumentParser, UserError, in_one_line, quiet_while_loading, run_cli  # noqa: E402

with quiet_while_loading(__name__):
    import torch

    from common.run_folder import OLD_CHECKPOINTS
    from training import checkpoint


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description="Convert old checkpoints (.pt) into .safetensors files; only your own.")
    p.add_argument("old", type=Path, nargs="+", help="old checkpoints, such as RUN/ckpt_last.pt, or run folders")
    olds = [(path, not given.is_dir()) for given in p.parse_args(argv).old for path in
            ([given / name for name in OLD_CHECKPOINTS if (given / name).is_file()] if given.is_dir() else [given])]
    if not olds:
        raise UserError("no old checkpoint there (ckpt_best.pt, ckpt_last.pt); give a run folder or a .pt file")
    for old, named in olds:
        convert(old, named)
    return 0


def convert(old: Path, named: bool) -> None:
    """One old checkpoint into a .safetensors file beside it; one found in a folder and converted before is skipped."""
    new = old.with_suffix(".safetensors")
    if not old.is_file():
        raise UserError(f"{old} is not a file; give an old checkpoint, such as RUN/ckpt_last.pt")
    if old.suffix == ".safetensors":
        raise UserError(f"{old} is already of the new format; nothing to convert")
    if new.exists():
        if not named:
            print(f"{new} already exists: {old} was converted before", file=sys.stderr)
            return
        raise UserError(f"{new} already exists; remove it first to convert {old} again")
    print(f"reading {old}, trusted as your own: torch.load cannot bound its memory or time", file=sys.stderr)
    try:
        state = torch.load(old, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UserError(f"{old} is not a readable old checkpoint ({in_one_line(err)}); nothing was written") from None
    if not (isinstance(state, dict) and state.get("format") == 1 and isinstance(state.get("model"), dict)
            and isinstance(state.get("model_config"), dict)):
        raise UserError(f"{old} is not a checkpoint of format 1 of this trainer; nothing was written")
    if bad := checkpoint.non_finite(state["model"]):
        raise UserError(f"{old} holds NaN or inf weights (in {bad}); nothing was written")
    try:
        checkpoint.save({**state, "format": checkpoint.FORMAT}, new)
        checkpoint.load(new, resume="optimizer" in state)  # read back as every reader does
    except Exception as err:
        new.unlink(missing_ok=True)
        message = str(err) if isinstance(err, UserError) else in_one_line(err)
        raise UserError(f"{old} could not be converted ({message}); nothing was written") from None
    print(f"wrote {new}; {old} is kept")


if __name__ == "__main__":
    sys.exit(run_cli(main))
