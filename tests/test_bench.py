"""The benchmark harness runs end to end on the debug config and reports every figure, consistently."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT

FIGURES = ("ms_per_iter", "tokens_per_sec", "flops_per_token", "achieved_flops", "peak_flops", "mfu",
           "sample_chars_per_sec_cached", "sample_chars_per_sec_uncached", "sample_cache_speedup", "prepare_mb_per_sec")


def test_bench_reports_every_figure(tmp_path, small_text):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_text, encoding="utf-8")
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--config", "debug",
                             "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"), "--iters", "3",
                             "--warmup", "1", "--sample_tokens", "20", "--prepare_mb", "1", "--json", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert all(figures[name] > 0 for name in FIGURES)
    assert figures["sample_same_tokens"] is True  # the cache changes speed, never the text
    # the debug model: 2 layers, 32 wide, block 32, its vocabulary from the corpus
    n_params = figures["params"]
    assert figures["flops_per_token"] == 6 * n_params + 12 * 2 * 32 * 32
    assert figures["tokens_per_iter"] == 8 * 32
    assert figures["tokens_per_sec"] == pytest.approx(figures["tokens_per_iter"] / figures["ms_per_iter"] * 1000)
    assert figures["mfu"] == pytest.approx(figures["achieved_flops"] / figures["peak_flops"])
    assert "MFU" in result.stdout and "tokens/s" in result.stdout
    assert figures["device"] == "cpu, float32" and figures["optimizer"] == "adamw" and figures["sample_dtype"] == "float32"
