"""python scripts/attention_map.py --out_dir DIR --text "ROMEO: ..." --png FILE: draw a model's attention, one panel
per head."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import quiet_while_loading  # noqa: E402

loaded = quiet_while_loading(__name__)

import torch  # noqa: E402

from common.pictures import attention_figure, missing_note, picture_formats, save_figure  # noqa: E402
from common.run_folder import find  # noqa: E402
from errors import ArgumentParser, UserError, check_output_file, run_cli  # noqa: E402
from model.attention import attention_weights  # noqa: E402
from training.checkpoint import load_model  # noqa: E402
loaded()


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("FILE: ", 1)[1])
    p.add_argument("--out_dir", default="", help="a run folder: uses its ckpt_best, else ckpt_last")
    p.add_argument("--ckpt", default="", help="a checkpoint file instead of --out_dir")
    p.add_argument("--text", required=True, help="the text, at most block_size characters")
    p.add_argument("--png", required=True, help="where to write the picture")
    p.add_argument("--layer", type=int, default=None, help="a layer, counted from 1 (default: the last)")
    p.add_argument("--head", type=int, default=None, help="one head, counted from 1 (default: all)")
    args = p.parse_args(argv)
    check_output_file(args.png, "--png", picture_formats())
    path = find(args.out_dir, args.ckpt)
    model, tokenizer, _ = load_model(path)
    cfg = model.config
    missing = tokenizer.unknown(args.text)
    if missing:
        raise UserError(f"--text has characters the model never saw: {' '.join(map(repr, missing))}; remove them")
    if not 0 < len(args.text) <= cfg.block_size:
        raise UserError(f"--text has {len(args.text)} characters; give 1 to {cfg.block_size}")
    if cfg.n_layer == 0:
        raise UserError(f"{path} has no attention layers (n_layer 0); choose a model with blocks")
    layer = cfg.n_layer if args.layer is None else args.layer
    if not 1 <= layer <= cfg.n_layer:
        raise UserError(f"--layer {layer}: the model has layers 1 to {cfg.n_layer}")
    if args.head is not None and not 1 <= args.head <= cfg.n_head:
        raise UserError(f"--head {args.head}: the model has heads 1 to {cfg.n_head}")
    weights = attention_weights(model, tokenizer.encode(args.text))
    if not all(torch.isfinite(w).all() for w in weights):
        raise UserError(f"{path}: the model's attention weights are not numbers (NaN or inf): its weights are "
                        "too large")
    heads = None if args.head is None else [args.head - 1]
    if note := missing_note(args.text):
        print(note, file=sys.stderr)
    save_figure(attention_figure(weights[layer - 1], args.text, layer - 1, heads, every_label=True), args.png, "--png")
    print(f"wrote {args.png}: layer {layer}, {'head ' + str(args.head) if heads else f'{cfg.n_head} heads'}, "
          f"{len(args.text)} characters")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
