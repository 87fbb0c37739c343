"""python scripts/bench_prepare.py [--mb 200]: data preparation's MB/s and peak memory on a generated corpus.

Also the benchmarks' shared parser (with --json) and figures writer."""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.run_folder import write_text_atomic  # noqa: E402
from errors import ArgumentParser, UserError, check_output_file, run_cli  # noqa: E402

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from data.corpus import resolve
from data.prepare import prepare
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
prepared = prepare(resolve({corpus!r}, Path({cache!r})), Path({cache!r}))
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "rss_after_imports_mb": base / 1024,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "n_chars": prepared.meta["n_chars"], "vocab_size": prepared.meta["vocab_size"]}}))
"""


def figures_parser(doc: str, **kwargs) -> ArgumentParser:
    """A benchmark's parser: doc's first paragraph after its colon, and a checked --json."""
    parser = ArgumentParser(description=doc.split(":", 1)[1].split("\n\n")[0].strip(), **kwargs)
    parser.add_argument("--json", default="", type=figures_file, help="also write the figures to this JSON file")
    return parser


def figures_file(path: str) -> str:
    """--json's file, checked before the work begins; "" for none."""
    return path and str(check_output_file(path, "--json"))


def count(text: str) -> int:
    """An option's whole number, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number of at least 1")
    return int(text)


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """Columns as wide as their widest cell; the first and last left-aligned, the others right-aligned."""
    widths = [max(map(len, column)) for column in zip(header, *rows)]
    for row in [header, *rows]:
        print(row[0].ljust(widths[0]), *map(str.rjust, row[1:-1], widths[1:-1]), row[-1], sep="  ")


def write_figures(path: str, figures: dict) -> None:
    """Write the figures as JSON where --json named a file."""
    if path:
        write_text_atomic(Path(path), json.dumps(figures, indent=1) + "\n", "the figures file", "--json")


def measure(megabytes: int) -> dict:
    """Figures of preparing a generated corpus of this size (ASCII, accents, CJK) in its own process."""
    words = ["the", "king", "hath", "spoken", "naïve", "café", "東京", "言葉", "ROMEO:", "thou", "art", "\n"]
    block = " ".join(random.Random(0).choices(words, k=200_000))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        with open(corpus, "w", encoding="utf-8") as f:
            for _ in range(-(-megabytes * 1_000_000 // len(block.encode()))):
                f.write(block)
        size_mb = corpus.stat().st_size / 1e6
        code = CHILD.format(root=str(ROOT), corpus=str(corpus), cache=str(Path(tmp) / "cache"))
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if child.returncode != 0:
            last = (child.stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
            raise UserError(f"preparing the {size_mb:.0f} MB corpus failed: {last.removeprefix('error: ')[:300]}")
        figures = json.loads(child.stdout)
    return {**figures, "corpus_mb": size_mb, "mb_per_s": size_mb / figures["seconds"]}


def main(argv: list[str] | None = None) -> int:
    parser = figures_parser(__doc__)
    parser.add_argument("--mb", type=count, default=200, help="size of the generated corpus in MB")
    args = parser.parse_args(argv)
    f = measure(args.mb)
    print(f"corpus {f['corpus_mb']:.0f} MB, {f['n_chars']:,} characters, vocabulary {f['vocab_size']}")
    print(f"prepare {f['seconds']:.2f} s = {f['mb_per_s']:.1f} MB/s; peak RSS {f['peak_rss_mb']:.0f} MB "
          f"({f['rss_after_imports_mb']:.0f} MB of it imports)")
    write_figures(args.json, f)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
