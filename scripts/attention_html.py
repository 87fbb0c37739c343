"""python scripts/attention_html.py --out_dir RUN --html FILE: your model in one web page: type text, see where each
head looks and the next character."""
from __future__ import annotations

import base64
import json
import re
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import quiet_while_loading  # noqa: E402

loaded = quiet_while_loading(__name__)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common.run_folder import find, write_text_atomic  # noqa: E402
from data.corpus import default_cache_dir  # noqa: E402
from data.gate import open_regular, read_blocks, recorded_text  # noqa: E402
from data.prepare import cache_entry  # noqa: E402
from errors import ArgumentParser, UserError, check_output_file, run_cli  # noqa: E402
from model.attention import ROPE_BASE, recording_attention  # noqa: E402
from model.generate import Sampling, generate  # noqa: E402
from model.scoring import FORMS  # noqa: E402
from training import checkpoint  # noqa: E402
from training.report import PAGE_MAX_PARAMETERS as MAX_PARAMETERS  # noqa: E402
loaded()

PARTS = Path(__file__).with_name("attention_page")
SCRIPTS = ("GPT_JS", "gpt.js"), ("SAMPLING_JS", "sampling.js"), ("PAGE_JS", "page.js")
SURROGATE = re.compile("[\ud800-\udfff]")
DEFAULT_TEXT = "ROMEO: But soft, what light through yonder window breaks?"
OPENING_CHARS = 64  # the longest opening line
VAL_SEARCHED = 4096  # validation characters searched for a line
MAX_CORPUS_BYTES = 100_000_000  # a larger corpus is not read again


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    p.add_argument("--out_dir", default="", help="a run folder: uses its ckpt_best, else ckpt_last")
    p.add_argument("--ckpt", default="", help="a checkpoint file instead of --out_dir")
    p.add_argument("--text", default=None, help="the opening text, at most block_size characters "
                                                "(default: a validation line)")
    p.add_argument("--html", required=True, help="where to write the page (.html)")
    p.add_argument("--unknown", choices=("error", "skip"), default="error",
                   help="unseen characters in --text: stop, or drop them")
    return p


@torch.inference_mode()
def attention_of(model, ids: list[int]) -> list[list[list[list[float]]]]:
    """weights[layer][head][query]: the query's weights over keys 0..query."""
    model.eval()
    with recording_attention(model) as recorded:
        logits, _ = model(torch.tensor([ids], device=next(model.parameters()).device))
    for what, values in (("attention weights", recorded), ("outputs", [logits])):
        if not all(torch.isfinite(layer).all() for layer in values):
            raise UserError(f"the model's {what} are not numbers (NaN or inf): its weights are too large")
    return [[[row[:q + 1] for q, row in enumerate(head.tolist())] for head in layer[0].float()] for layer in recorded]


def carried_weights(model) -> tuple[dict[str, list[int]], str]:
    """{name: [start, end]} and every tensor (a tied head once) as one float32 block in base64."""
    tensors, parts, at = {}, [], 0
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_weights:
            continue
        values = tensor.detach().float().contiguous().view(-1)
        tensors[name] = [at, at + values.numel()]
        parts.append(values)
        at += values.numel()
    blob = torch.cat(parts).numpy().astype("<f4").tobytes()  # little-endian, as Float32Array reads it
    return tensors, base64.b64encode(blob).decode("ascii")


def page(model, vocab: str, text: str, title: str, about: dict) -> str:
    tensors, weights = carried_weights(model)
    # Code points: in JavaScript a two-unit character cannot merge with its neighbour.
    data = {"title": title, "about": about, "text": text, "vocab": [ord(ch) for ch in vocab],
            "config": model.config.to_dict(), "form": asdict(FORMS[model.config.attention_score]),
            "rope_base": ROPE_BASE,
            "sampling": [{"name": option.name, "default": option.default} for option in fields(Sampling)],
            "tensors": tensors, "weights": weights}
    html = (PARTS / "page.html").read_text(encoding="utf-8")
    for mark, name in SCRIPTS:
        script = (PARTS / name).read_text(encoding="utf-8")
        assert "</script" not in script.lower(), name
        html = html.replace(f"/*{mark}*/", script)
    blob = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")  # the data cannot close the script
    blob = SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", blob)  # a lone surrogate has no UTF-8
    return html.replace("/*DATA*/null", blob)


class Opening(NamedTuple):
    """source: given, line, lines, default or written; why: a key of NOT_VALIDATION or ""."""
    text: str
    source: str
    why: str = ""


def validation_start(state: dict) -> tuple[str | None, str]:
    """The run's first validation characters, from its token cache or recorded corpus; else None and why."""
    data, run = state.get("data") or {}, state.get("run_config") or {}
    sha256, n_train = data.get("sha256"), data.get("n_train")
    if not sha256 or n_train is None:
        return None, "unrecorded"
    settings = {"encoding": run.get("encoding", "utf-8"), "encoding_errors": run.get("encoding_errors", "strict"),
                "val_fraction": run.get("val_fraction", 0.1)}
    for entry in sorted((default_cache_dir() / "prepared").glob(f"{sha256[:20]}-*")):
        try:
            meta = cache_entry(entry)[0]
            if meta is None or meta["sha256"] != sha256 or meta["vocab"] != state.get("vocab") or any(
                    meta[key] != value for key, value in settings.items()):
                continue
            dtype = np.dtype(meta["dtype"])
            f, size = open_regular(entry / "val.bin", "the cache entry's")
            with f:
                wanted = min(size, VAL_SEARCHED * dtype.itemsize) // dtype.itemsize * dtype.itemsize
                ids = np.frombuffer(b"".join(read_blocks(f, wanted, entry / "val.bin", "the cache entry's",
                                                         file_size=size)), dtype=dtype)
            return "".join(meta["vocab"][i] for i in ids), ""
        except (OSError, ValueError, KeyError, IndexError, TypeError, UserError):
            continue
    source = Path(data.get("source", ""))
    try:
        if not source.is_file():
            return None, "missing"
        if source.stat().st_size > MAX_CORPUS_BYTES:
            return None, "large"
        raw = recorded_text(source, data, MAX_CORPUS_BYTES)  # None: not the text the run read
        text = raw.decode(settings["encoding"], settings["encoding_errors"]) if raw is not None else None
    except (OSError, UnicodeError, UserError, LookupError):
        return None, "changed"
    return (None, "changed") if text is None else (text[n_train:n_train + VAL_SEARCHED], "")


def validation_opening(state: dict, tokenizer, length: int) -> Opening | str:
    """The first line of 20+ known characters, else the first short lines that reach 20; else why."""
    start, why = validation_start(state)
    if start is None:
        return why
    least = min(20, length)
    lines = start.split("\n")[1:-1]
    for line in lines:
        if len(line.strip()) >= least and all(ch in tokenizer.stoi for ch in line):
            return Opening(line[:length], "line")
    for first in range(len(lines)):
        joined = lines[first]
        for line in lines[first + 1:]:
            if len(joined) + 1 + len(line) > length:
                break
            joined += "\n" + line
        if len(joined.strip()) >= least and all(ch in tokenizer.stoi for ch in joined):
            return Opening(joined, "lines")
    return "short"


def opening_text(args, model, tokenizer, state: dict, block_size: int) -> Opening:
    """--text checked; else validation text, a line of Romeo and Juliet, or a line the model writes."""
    if args.text is None:
        found = validation_opening(state, tokenizer, min(OPENING_CHARS, block_size))
        if isinstance(found, Opening):
            return found
        text = "".join(ch for ch in DEFAULT_TEXT if ch in tokenizer.stoi)[:block_size]
        if len(text) >= min(20, block_size):
            return Opening(text, "default", found)
        prompt = tokenizer.encode(tokenizer.default_prompt())
        written = generate(model, [prompt], min(40, block_size) - len(prompt), temperature=0.8,
                           generator=torch.Generator().manual_seed(0))[0]
        return Opening(tokenizer.decode(prompt + written), "written", found)
    if not args.text:
        raise UserError("--text is empty; give a text, or leave --text out")
    unknown = tokenizer.unknown(args.text)
    if unknown and args.unknown == "error":
        raise UserError(f"--text has {len(unknown)} character(s) the model never saw: "
                        f"{' '.join(repr(ch) for ch in unknown[:20])}; pass --unknown skip to drop them")
    text = "".join(ch for ch in args.text if ch in tokenizer.stoi)
    if not text:
        raise UserError("--text has no character the model knows")
    if len(text) > block_size:
        raise UserError(f"--text has {len(text)} characters; this model reads at most {block_size}; shorten it")
    return Opening(text, "given")


# Why the validation text was not used (page.js has the Chinese).
NOT_VALIDATION = {
    "unrecorded": "the checkpoint records no corpus",
    "missing": "neither the run's token cache nor its corpus file is there",
    "changed": "the run's token cache is gone and its corpus file has changed",
    "large": f"the run's token cache is gone and its corpus file is over {MAX_CORPUS_BYTES // 1_000_000} MB",
    "short": "no 20-character stretch of its validation text has only known characters",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    html = check_output_file(args.html, "--html", (".html", ".htm"))
    path = find(args.out_dir, args.ckpt)
    model, tokenizer, state = checkpoint.load_model(path, "cpu")
    cfg = model.config
    if cfg.n_layer == 0:
        raise UserError(f"{path} has no attention layers (n_layer 0); choose a model with blocks")
    size = model.num_params(non_embedding=False)
    if size > MAX_PARAMETERS:
        raise UserError(f"{path} has {size:,} parameters; the page carries at most {MAX_PARAMETERS:,}; "
                        "choose a smaller model")
    opening = opening_text(args, model, tokenizer, state, cfg.block_size)
    try:
        attention_of(model, tokenizer.encode(opening.text) or [0])
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    about = {"path": str(path), "step": state["iter"], "n_layer": cfg.n_layer, "n_head": cfg.n_head,
             "head_size": cfg.head_size, "n_embd": cfg.n_embd, "millions": f"{size / 1e6:.2f}",
             "corpus": state.get("data", {}).get("source"), "opening": opening.source, "why": opening.why,
             "because": NOT_VALIDATION.get(opening.why)}
    written = page(model, tokenizer.chars, opening.text, "Your model, thinking", about)
    write_text_atomic(html, written, "the page", "--html")
    if opening.why:
        instead = "a line of Romeo and Juliet" if opening.source == "default" else "text the model wrote"
        print(f"the page opens on {instead}, not on the run's validation text: {NOT_VALIDATION[opening.why]}",
              file=sys.stderr)
    print(f"wrote {html} ({html.stat().st_size / 1e6:.1f} MB): open it in a browser and type", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
