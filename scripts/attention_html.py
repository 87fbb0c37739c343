"""python scripts/attention_html.py --out_dir RUN --text "..." --html FILE: one self-contained web page (no network,
no external files) showing, for each character of your text, which earlier characters each head attends to."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from errors import ArgumentParser, UserError, exit_without_teardown, run_cli  # noqa: E402
from model.attention import recording_attention  # noqa: E402
from training import checkpoint  # noqa: E402
from training.files import check_output_file, write_text_atomic  # noqa: E402

PAGE = Path(__file__).with_name("attention_page.html")  # the page's markup, style and script; the data goes in


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    p.add_argument("--out_dir", default="", help="a run folder: uses its ckpt_best.pt, else ckpt_last.pt")
    p.add_argument("--ckpt", default="", help="a checkpoint file (instead of --out_dir)")
    p.add_argument("--text", required=True, help="the text to look at (at most the model's block_size characters)")
    p.add_argument("--html", required=True, help="where to write the page (.html)")
    p.add_argument("--unknown", choices=("error", "skip"), default="error",
                   help="characters the model never saw: stop with an error, or leave them out")
    return p


@torch.inference_mode()
def attention_of(model, ids: list[int]) -> list[list[list[list[float]]]]:
    """weights[layer][head][query] = the query's weights over keys 0..query (the causal half only), from the
    model's explicit path."""
    model.eval()
    with recording_attention(model) as recorded:
        model(torch.tensor([ids], device=next(model.parameters()).device))
    if not all(torch.isfinite(layer).all() for layer in recorded):
        raise UserError("the model's attention weights for this text are not numbers (NaN or inf): its numbers "
                        "overflow; its weights are damaged or too large to compute with")
    return [[[row[:q + 1] for q, row in enumerate(head.tolist())] for head in layer[0].float()] for layer in recorded]


def page(text: str, weights, title: str, about: str) -> str:
    data = {"text": text, "weights": [[[[round(w, 5) for w in row] for row in head] for head in layer]
                                      for layer in weights], "title": title, "about": about}
    blob = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")  # nothing in the data can close the script
    return PAGE.read_text(encoding="utf-8").replace("/*DATA*/null", blob)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    html = check_output_file(args.html, "--html", (".html", ".htm"))
    if not args.text:
        raise UserError("--text is empty; give the text whose attention you want to see")
    path = checkpoint.find(args.out_dir, args.ckpt)
    model, tokenizer, state = checkpoint.load_model(path, "cpu")
    if model.config.n_layer == 0:
        raise UserError(f"{path} has no attention layers (n_layer 0); choose a model with blocks")
    unknown = tokenizer.unknown(args.text)
    if unknown and args.unknown == "error":
        raise UserError(f"--text has {len(unknown)} character(s) the model never saw: "
                        f"{' '.join(repr(ch) for ch in unknown[:20])}; pass --unknown skip to leave them out")
    text = "".join(ch for ch in args.text if ch in tokenizer.stoi)
    if not text:
        raise UserError("--text has no character the model knows")
    if len(text) > model.config.block_size:
        raise UserError(f"--text has {len(text)} characters; this model reads at most {model.config.block_size} "
                        f"(its block_size); shorten it")
    try:
        weights = attention_of(model, tokenizer.encode(text))
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    cfg = model.config
    about = (f"{path}: step {state['iter']}, {cfg.n_layer} layers x {cfg.n_head} heads, "
             f"trained on {state.get('data', {}).get('source', 'an unrecorded corpus')}")
    shown = text if len(text) <= 40 else text[:39] + "\u2026"
    write_text_atomic(html, page(text, weights, f"Attention on \u201c{shown}\u201d", about), "the page", "--html")
    print(f"wrote {html}: {len(text)} characters, {cfg.n_layer} layers x {cfg.n_head} heads; open it in a browser "
          f"(no network needed)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    exit_without_teardown(run_cli(main))
