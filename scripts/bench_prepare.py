"""python scripts/bench_prepare.py [--mb 200]: data-preparation throughput (MB/s) and peak memory on a generated
corpus."""
from __future__ import annotations

import json
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


def make_corpus(path: Path, megabytes: int) -> None:
    """Varied text (ASCII, accents, CJK) up to the size."""
    import random
    rng = random.Random(0)
    words = ["the", "king", "hath", "spoken", "naïve", "café", "東京", "言葉", "ROMEO:", "thou", "art", "\n"]
    target = megabytes * 1_000_000
    with open(path, "w", encoding="utf-8") as f:
        block = " ".join(rng.choice(words) for _ in range(200_000))
        written = 0
        while written < target:
            f.write(block)
            written += len(block.encode("utf-8"))


def measure(megabytes: int) -> dict:
    """Prepare a generated corpus of this size in a process of its own: its seconds, MB/s and peak memory."""
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        make_corpus(corpus, megabytes)
        size_mb = corpus.stat().st_size / 1e6
        code = CHILD.format(root=str(ROOT), corpus=str(corpus), cache=str(Path(tmp) / "cache"))
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if child.returncode != 0:
            last = (child.stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
            raise UserError(f"preparing the {size_mb:.0f} MB corpus failed: {last.removeprefix('error: ')[:300]}")
        figures = json.loads(child.stdout)
    return {**figures, "corpus_mb": size_mb, "mb_per_s": size_mb / figures["seconds"]}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("--mb", type=int, default=200, help="size of the generated corpus in MB")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.mb < 1:
        parser.error(f"--mb {args.mb}: must be at least 1")
    if args.json:
        check_output_file(args.json, "--json")
    figures = measure(args.mb)
    size_mb = figures["corpus_mb"]
    print(f"corpus {size_mb:.0f} MB, {figures['n_chars']:,} characters, vocabulary {figures['vocab_size']}")
    print(f"prepare {figures['seconds']:.2f} s = {figures['mb_per_s']:.1f} MB/s; "
          f"peak RSS {figures['peak_rss_mb']:.0f} MB "
          f"({figures['rss_after_imports_mb']:.0f} MB of it before preparing: Python, numpy, torch)")
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(figures, indent=1) + "\n", "the figures file", "--json")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
