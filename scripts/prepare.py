"""python scripts/prepare.py --data FILE|FOLDER|shakespeare|pystdlib: tokenize a corpus into the cache."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import ArgumentParser, UserError, quiet_while_loading, run_cli  # noqa: E402

with quiet_while_loading(__name__):
    from data import default_cache_dir, prepare, resolve


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    p.add_argument("--data", default="shakespeare", help="a text file, a folder of text files, shakespeare or pystdlib")
    p.add_argument("--cache_dir", default=str(default_cache_dir()), help="where downloads and token files go")
    p.add_argument("--val_fraction", type=float, default=0.1, help="the last fraction of the text, for validation")
    p.add_argument("--encoding", default="utf-8", help="the corpus files' encoding")
    p.add_argument("--encoding_errors", default="strict", help="strict | replace | ignore undecodable bytes")
    args = p.parse_args(argv)
    if not 0 < args.val_fraction < 1:
        raise UserError(f"--val_fraction {args.val_fraction}: must be between 0 and 1, e.g. 0.1")
    corpus = resolve(args.data, Path(args.cache_dir))
    prepared = prepare(corpus, Path(args.cache_dir), args.val_fraction, args.encoding, args.encoding_errors)
    meta = prepared.meta
    size_mb = sum(p.stat().st_size for p in corpus.files) / 1e6
    speed = "cache up to date" if prepared.reused else f"{size_mb / max(prepared.seconds, 1e-9):.1f} MB/s"
    print(f"corpus      {meta['source']} ({meta['files']} file{'s' if meta['files'] != 1 else ''}, {size_mb:.2f} MB)")
    print(f"characters  {meta['n_chars']:,}")
    print(f"vocabulary  {meta['vocab_size']:,} characters, stored as {meta['dtype']}")
    print(f"split       {meta['n_train']:,} train / {meta['n_val']:,} validation")
    print(f"prepared    {prepared.seconds:.2f} s ({speed})")
    print(f"cache       {prepared.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
