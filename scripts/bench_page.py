"""python scripts/bench_page.py --out_dir RUN: the attention page's size and forward-pass milliseconds in Chromium."""
from __future__ import annotations

import contextlib
import html as markup
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_prepare import write_figures  # noqa: E402
from common.run_folder import find  # noqa: E402
from errors import ArgumentParser, UserError, run_cli  # noqa: E402
from training import checkpoint  # noqa: E402

import attention_html  # noqa: E402

BROWSER_SECONDS = 600
MAX_PASSES = 1000
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak."


def run_browser(command: list[str], profile: Path | None = None) -> subprocess.CompletedProcess:
    """Chromium in its own process group, output captured. Stopped or too slow: the group killed, sockets removed."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=BROWSER_SECONDS)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            deadline = time.monotonic() + 10
            while running_in_group(process.pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            with contextlib.suppress(OSError, TypeError):
                folder = Path(os.readlink(profile / "SingletonSocket")).parent
                if folder.name.startswith("org.chromium.Chromium."):
                    shutil.rmtree(folder)
            raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def running_in_group(group: int) -> bool:
    """Whether a live process (not a zombie, as os.killpg counts) is still in the group."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            state, _, process_group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if state != "Z" and int(process_group) == group:
                return True
    return False


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    p.add_argument("--out_dir", default="", help="a run folder: uses its ckpt_best, else ckpt_last")
    p.add_argument("--ckpt", default="", help="a checkpoint file instead of --out_dir")
    p.add_argument("--chars", type=int, default=64, help="characters the forward pass reads")
    p.add_argument("--passes", type=int, default=30, help="forward passes timed")
    p.add_argument("--json", default="", help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.chars < 1 or not 1 <= args.passes <= MAX_PASSES:
        raise UserError(f"--chars must be positive and --passes from 1 to {MAX_PASSES}")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        raise UserError("Chromium is not installed; apt-get install chromium")
    path = find(args.out_dir, args.ckpt)
    model, tokenizer, _ = checkpoint.load_model(path, "cpu")
    if args.chars > model.config.block_size:
        raise UserError(f"--chars {args.chars}: this model reads at most {model.config.block_size} characters")
    known = "".join(ch for ch in TEXT if ch in tokenizer.stoi) or tokenizer.chars
    text = (known * (args.chars // len(known) + 1))[:args.chars]
    with tempfile.TemporaryDirectory() as folder:
        html = Path(folder) / "page.html"
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            code = run_cli(attention_html.main, ["--ckpt", str(path), "--html", str(html)])
        if code:
            print(said.getvalue(), end="", file=sys.stderr)
            return code
        size = html.stat().st_size
        try:
            profile = Path(folder) / "profile"
            done = run_browser([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                                f"--user-data-dir={profile}",
                                f"{html.as_uri()}#text={quote(text, safe='')}&bench={args.passes}"], profile)
        except subprocess.TimeoutExpired:
            raise UserError(f"Chromium ran over {BROWSER_SECONDS} s; ask for fewer --passes or --chars") from None
        version = run_browser([browser, "--version"]).stdout.strip()
    found = re.search(r'<pre id="numbers">(.*?)</pre>', done.stdout, flags=re.S)
    if done.returncode or not found:
        raise UserError(f"Chromium did not run the page (exit {done.returncode}): "
                        f"{done.stderr.strip().splitlines()[-1:] or 'no message'}")
    times = json.loads(markup.unescape(found.group(1)))["bench_all_ms"]
    figures = {"page_mb": round(size / 1e6, 2), "chars": args.chars, "passes": args.passes,
               "forward_ms_median": round(times[len(times) // 2], 1), "forward_ms_min": round(times[0], 1),
               "forward_ms_max": round(times[-1], 1), "browser": version, "checkpoint": str(path)}
    print(f"{path}: page {figures['page_mb']} MB; a forward pass over {args.chars} characters in {version}: "
          f"{figures['forward_ms_median']} ms (median of {args.passes}; {figures['forward_ms_min']} to "
          f"{figures['forward_ms_max']} ms)")
    write_figures(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
