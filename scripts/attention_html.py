"""python scripts/attention_html.py --out_dir RUN --html FILE: your model, live in one self-contained web page (no
network, no external files): type any text and see, for every character, layer and head, where it looks, each step of
its attention with the model's own numbers, and the next character at any temperature."""
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

loaded = quiet_while_loading(__name__)  # a Ctrl-C while torch loads: one line, not the import's traceback

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

PARTS = Path(__file__).with_name("attention_page")  # page.html, and the scripts it takes in: gpt.js (the model),
SCRIPTS = ("GPT_JS", "gpt.js"), ("SAMPLING_JS", "sampling.js"), ("PAGE_JS", "page.js")  # sampling.js, page.js
SURROGATE = re.compile("[\ud800-\udfff]")
DEFAULT_TEXT = "ROMEO: But soft, what light through yonder window breaks?"
OPENING_CHARS = 64  # the longest opening line taken from the validation text
VAL_SEARCHED = 4096  # characters at the start of the validation text searched for a line
MAX_CORPUS_BYTES = 100_000_000  # a corpus file read again for its validation text (larger: the token cache only)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    p.add_argument("--out_dir", default="", help="a run folder: uses its ckpt_best, else ckpt_last")
    p.add_argument("--ckpt", default="", help="a checkpoint file (instead of --out_dir)")
    p.add_argument("--text", default=None, help="the text the page opens with (at most the model's block_size "
                                                "characters; the page lets you type another); by default a line of "
                                                "the run's own validation text (from its token cache, or its corpus "
                                                "file as the checkpoint records it), else a line of Romeo and Juliet "
                                                "less the characters the model never saw (or, where that leaves "
                                                "little, a line the model writes)")
    p.add_argument("--html", required=True, help="where to write the page (.html)")
    p.add_argument("--unknown", choices=("error", "skip"), default="error",
                   help="characters of --text the model never saw: stop with an error, or leave them out")
    return p


@torch.inference_mode()
def attention_of(model, ids: list[int]) -> list[list[list[list[float]]]]:
    """weights[layer][head][query] = the query's weights over keys 0..query (the causal half only), from the
    model's explicit path, in PyTorch: what the page computes in the browser."""
    model.eval()
    with recording_attention(model) as recorded:
        logits, _ = model(torch.tensor([ids], device=next(model.parameters()).device))
    for what, values in (("attention weights", recorded), ("outputs", [logits])):
        if not all(torch.isfinite(layer).all() for layer in values):
            raise UserError(f"the model's {what} for this text are not numbers (NaN or inf): its numbers overflow; "
                            f"its weights are damaged or too large to compute with")
    return [[[row[:q + 1] for q, row in enumerate(head.tolist())] for head in layer[0].float()] for layer in recorded]


def carried_weights(model) -> tuple[dict[str, list[int]], str]:
    """Every tensor of the model's state dict (the output head once, when it is the token embedding) as float32 in
    one block: {name: [start, end]} in numbers, and the block's bytes in base64."""
    tensors, parts, at = {}, [], 0
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_weights:
            continue
        values = tensor.detach().float().contiguous().view(-1)
        tensors[name] = [at, at + values.numel()]
        parts.append(values)
        at += values.numel()
    blob = torch.cat(parts).numpy().astype("<f4").tobytes()  # little-endian, as Float32Array reads it everywhere
    return tensors, base64.b64encode(blob).decode("ascii")


def page(model, vocab: str, text: str, title: str, about: dict) -> str:
    """The page's HTML: the parts put together with the model's data."""
    tensors, weights = carried_weights(model)
    # The vocabulary as code points: one number per character, so that no character outside the Basic Multilingual
    # Plane (two UTF-16 units in JavaScript) and no lone surrogate (a vocabulary read with unicode_escape can hold
    # them) can merge with its neighbour and shift the ids after it.
    data = {"title": title, "about": about, "text": text, "vocab": [ord(ch) for ch in vocab],
            "config": model.config.to_dict(), "form": asdict(FORMS[model.config.attention_score]),
            "rope_base": ROPE_BASE,  # (no setting holds it: the page's rotary tables and formula read it here)
            "sampling": [{"name": option.name, "default": option.default} for option in fields(Sampling)],
            "tensors": tensors, "weights": weights}
    html = (PARTS / "page.html").read_text(encoding="utf-8")
    for mark, name in SCRIPTS:
        script = (PARTS / name).read_text(encoding="utf-8")
        assert "</script" not in script.lower(), name  # a script's text may not end its own element
        html = html.replace(f"/*{mark}*/", script)
    blob = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")  # nothing in the data can close the script
    blob = SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", blob)  # a lone surrogate has no UTF-8: escaped
    return html.replace("/*DATA*/null", blob)


class Opening(NamedTuple):
    """The text the page opens on, and where it came from, as facts the page words in the reader's language:
    source is "given" (--text), "line" (a whole line of the validation text), "lines" (whole lines of it joined,
    newlines kept: a corpus of short lines), "default" (a line of Romeo and Juliet) or "written" (by the model);
    why, for the last two, says why the validation text was not used: "unrecorded" (the checkpoint names no corpus),
    "missing" (no token cache and no corpus file), "changed" (the corpus file differs from what the run read, or
    cannot be read again), "large" (no token cache, and the corpus file is over MAX_CORPUS_BYTES), "short" (no
    stretch of it long enough whose every character the model knows)."""
    text: str
    source: str
    why: str = ""


def validation_start(state: dict) -> tuple[str | None, str]:
    """The first VAL_SEARCHED characters of the run's validation text: from its prepared token cache in this user's
    cache folder (a checkpoint's cache_dir is never taken: the file may come from someone else), found by the corpus
    checksum the checkpoint records, one that data.prepare.cache_entry passes, with the same encoding, split and
    vocabulary (ids read through another are another text); else from its corpus file, where that is one regular file
    of the size and checksum recorded (data.gate.recorded_text). Where neither is there: None, and why (Opening's
    why)."""
    data, run = state.get("data") or {}, state.get("run_config") or {}
    sha256, n_train = data.get("sha256"), data.get("n_train")
    if not sha256 or n_train is None:
        return None, "unrecorded"
    settings = {"encoding": run.get("encoding", "utf-8"), "encoding_errors": run.get("encoding_errors", "strict"),
                "val_fraction": run.get("val_fraction", 0.1)}
    for entry in sorted((default_cache_dir() / "prepared").glob(f"{sha256[:20]}-*")):
        try:
            meta = cache_entry(entry)[0]  # (checked as training checks an entry: format, vocabulary, files, ids)
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
            continue  # a damaged or foreign entry: the next, or the corpus file
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
    """A stretch of the run's validation text, every character known to the model, at most length characters: the
    first whole line of at least 20 (fewer for a shorter window), cut to length; else, for a corpus of short lines
    (poems, say), the first run of whole lines that, joined with their newlines, reaches 20 characters without
    passing length. Where there is none: why (Opening's why)."""
    start, why = validation_start(state)
    if start is None:
        return why
    least = min(20, length)
    lines = start.split("\n")[1:-1]  # whole lines: the first may begin mid-line, the last end there
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
    """The text the page opens with: --text checked; by default a stretch of the run's own validation text, else a
    line of Romeo and Juliet less what the model cannot read, or, where that leaves little, a line the model writes
    itself; with why the validation text was not used."""
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
        raise UserError("--text is empty; give the text to open the page with, or leave --text out")
    unknown = tokenizer.unknown(args.text)
    if unknown and args.unknown == "error":
        raise UserError(f"--text has {len(unknown)} character(s) the model never saw: "
                        f"{' '.join(repr(ch) for ch in unknown[:20])}; pass --unknown skip to leave them out")
    text = "".join(ch for ch in args.text if ch in tokenizer.stoi)
    if not text:
        raise UserError("--text has no character the model knows")
    if len(text) > block_size:
        raise UserError(f"--text has {len(text)} characters; this model reads at most {block_size} (its "
                        f"block_size); shorten it")
    return Opening(text, "given")


# Why the validation text was not used, as the script says it (the page says it in the reader's language).
NOT_VALIDATION = {
    "unrecorded": "the checkpoint records no corpus",
    "missing": "neither the run's token cache nor its corpus file is there",
    "changed": "the run's token cache is gone and its corpus file has changed since the run read it",
    "large": f"the run's token cache is gone and its corpus file is too large to read again (over "
             f"{MAX_CORPUS_BYTES // 1_000_000} MB)",
    "short": "no stretch of its validation text of 20 characters or more has only characters the model knows",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    html = check_output_file(args.html, "--html", (".html", ".htm"))
    path = find(args.out_dir, args.ckpt)
    model, tokenizer, state = checkpoint.load_model(path, "cpu")
    cfg = model.config
    if cfg.n_layer == 0:
        raise UserError(f"{path} has no attention layers (n_layer 0); choose a model with blocks")
    size = model.num_params(non_embedding=False)  # every weight the page carries (a tied head once)
    if size > MAX_PARAMETERS:
        raise UserError(f"{path} has {size:,} parameters; the page carries at most {MAX_PARAMETERS:,} parameters "
                        f"(every weight in float32, {MAX_PARAMETERS * 4 * 4 / 3 / 1e6:.1f} MB of page); choose a "
                        f"smaller model")
    opening = opening_text(args, model, tokenizer, state, cfg.block_size)
    text = opening.text
    try:
        attention_of(model, tokenizer.encode(text) or [0])
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    # the line under the title, as facts: the page words it in the reader's language
    about = {"path": str(path), "step": state["iter"], "n_layer": cfg.n_layer, "n_head": cfg.n_head,
             "head_size": cfg.head_size, "n_embd": cfg.n_embd, "millions": f"{size / 1e6:.2f}",
             "corpus": state.get("data", {}).get("source"), "opening": opening.source, "why": opening.why}
    written = page(model, tokenizer.chars, text, "Your model, thinking", about)
    write_text_atomic(html, written, "the page", "--html")
    if opening.why:
        instead = "a line of Romeo and Juliet" if opening.source == "default" else "text the model wrote"
        print(f"the page opens on {instead}, not on the run's validation text: {NOT_VALIDATION[opening.why]}",
              file=sys.stderr)
    print(f"wrote {html} ({html.stat().st_size / 1e6:.1f} MB): the model runs in the page; open it in a "
          f"browser (no network needed) and type", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
