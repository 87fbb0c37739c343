"""The benchmark harness runs end to end on the debug config and reports every figure, consistently."""
import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest


FIGURES = ("ms_per_iter", "ms_forward_backward", "ms_update", "update_operations", "tokens_per_sec", "flops_per_token",
           "achieved_flops", "peak_flops", "mfu",
           "sample_chars_per_sec_cached", "sample_chars_per_sec_uncached", "sample_cache_speedup", "prepare_mb_per_sec")


def test_bench_reports_every_figure(tmp_path, small_text, script):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_text, encoding="utf-8")
    out = tmp_path / "bench.json"
    result = script("bench.py", "--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"),
                    "--iters", "3", "--warmup", "1", "--sample_tokens", "20", "--prepare_mb", "1", "--json", str(out))
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
    assert figures["device"] == "cpu, float32" and figures["optimizer"] == "adamw" \
        and figures["sample_dtype"] == "float32"


def test_bench_compare_times_each_variant_in_turn(tmp_path, small_text, script):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_text, encoding="utf-8")
    out = tmp_path / "compare.json"
    result = script("bench.py", "--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"),
                    "--iters", "2", "--warmup", "1", "--rounds", "3", "--compare", "batch_size=4,8", "--compare",
                    "n_embd=32,64", "--json", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    variants = report["variants"]
    assert [v["variant"] for v in variants] == \
        [{"batch_size": b, "n_embd": e} for b in ("4", "8") for e in ("32", "64")]
    for v in variants:
        assert v["tokens_per_iter"] == int(v["variant"]["batch_size"]) * 32  # the override reached the run
        assert len(v["ms_per_iter_rounds"]) == 3
        assert v["ms_per_iter"] == pytest.approx(sorted(v["ms_per_iter_rounds"])[1])  # the median round
        assert v["tokens_per_sec"] == pytest.approx(v["tokens_per_iter"] / v["ms_per_iter"] * 1000)
        assert v["mfu"] == pytest.approx(v["flops_per_token"] * v["tokens_per_sec"] / v["peak_flops"])
        assert v["time_vs_first"] == pytest.approx(v["ms_per_iter"] / variants[0]["ms_per_iter"])
    assert variants[1]["params"] > variants[0]["params"]  # n_embd 64 is the bigger model
    assert result.stdout.count("batch_size=") == 4 and "time vs first" in result.stdout


@pytest.mark.parametrize("spec", ["dtype", "colour=red,blue", "dtype=float32", "dtype=float32,"])
def test_bench_compare_rejects_a_bad_spec(tmp_path, spec, capsys):
    import bench
    from errors import run_cli
    returncode = run_cli(bench.main, ["--config", "debug", "--compare", spec])  # in-process: no torch start-up each
    stderr = capsys.readouterr().err
    assert returncode == 2
    assert stderr.startswith("error: --compare") and len(stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, words", [(["--batch", "0"], "argument --batch: 0 is not a whole number of at least 1"),
                                         (["--n_embd", "7"], "n_embd (7) must be divisible by n_head (6)")])
def test_bench_sample_refuses_bad_settings_in_one_line(args, words, capsys):
    import bench_sample
    from errors import run_cli
    assert run_cli(bench_sample.main, args) == 2
    assert capsys.readouterr().err.startswith(f"error: {words}")


def test_mfu_never_passes_100_percent_when_the_peak_was_measured_low():
    import bench
    run = {"tokens_per_iter": 1000, "flops_per_token": 1e6}
    figures = bench.speed(run, seconds=0.01, peak_flops=1e9)  # achieved 1e11 FLOP/s against a "peak" of 1e9
    assert figures["mfu"] == 1.0 and figures["peak_flops"] == figures["achieved_flops"] == pytest.approx(1e11)
    assert bench.speed(run, seconds=0.01, peak_flops=4e11)["mfu"] == pytest.approx(0.25)  # an honest peak: uncapped


@pytest.mark.slow
def test_bench_run_times_the_whole_command_and_reports_the_runs_own_figures(tmp_path, small_text, script):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_text, encoding="utf-8")
    out, figures = tmp_path / "runs", tmp_path / "runs.json"
    done = script("bench_run.py", "--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"),
                  "--max_iters", "6", "--out_dir", str(out), "--json", str(figures))
    assert done.returncode == 0, done.stderr
    [row] = json.loads(figures.read_text(encoding="utf-8"))["variants"]
    [run] = row["runs"]
    summary = json.loads((out / "01-r1" / "summary.json").read_text(encoding="utf-8"))
    assert (run["full_val_loss"], run["train_seconds"], run["model_step"]) == \
        (summary["full_val_loss"], summary["train_seconds"], summary["model_step"])
    assert run["phases"] == summary["seconds"] and run["whole_seconds"] >= summary["seconds"]["opening"]
    # timed from outside: the whole process, start-up included (which the run reads off /proc in 10 ms ticks)
    assert run["whole_seconds"] >= summary["seconds"]["total"] - 0.02
    assert f"{summary['full_val_loss']:.4f}" in done.stdout and "step 6" in (out / "01-r1.log").read_text()

    from common.run_folder import RunDir
    held = RunDir(out).claim(say=print)  # another bench_run at work in the folder: its runs' logs are not touched
    busy = script("bench_run.py", "--config", "debug", "--data", str(corpus), "--out_dir", str(out))
    held.release()
    assert busy.returncode == 2 and f"{out} is in use by process" in busy.stderr
    assert "step 6" in (out / "01-r1.log").read_text()

    assert run["threads"] == 1 and run["expected_seconds"] == summary["expected_seconds"]  # (debug: --num_threads 1)
    assert f"; 1 thread, expected {run['expected_seconds'][0]:.0f}" in done.stdout

    refused = script("bench_run.py", "--config", "debug", "--out_dir", str(tmp_path / "x"), "--resume")
    assert refused.returncode == 2 and refused.stderr == ("error: bench_run.py chooses each run's folder. Leave --out_dir, "
                                                          "--resume and --overwrite out\n")
    failed = script("bench_run.py", "--config", "debug", "--data", str(tmp_path / "missing.txt"), "--out_dir", str(out))
    said = failed.stderr.strip().splitlines()[-1]  # after the progress line, one line: the run's own error, its log
    assert failed.returncode == 2 and said.startswith("error: python train.py --config debug --data"), failed.stderr
    assert "no such file or folder" in said and said.endswith("01-r1.log)")


@pytest.mark.slow
def test_bench_run_busy_runs_cpu_bound_processes_beside_the_runs_and_ends_them(tmp_path, small_text, script,
                                                                              monkeypatch):
    """--busy 1: one process keeps a core busy when the run starts, and is gone when the sitting ends; the figures
    say so."""
    import bench_run
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_text, encoding="utf-8")
    out, figures = tmp_path / "runs", tmp_path / "runs.json"

    def busy_loops() -> list[int]:  # this process's children that loop (another engineer's may run beside)
        found = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and b"while True: pass" in (entry / "cmdline").read_bytes() and \
                        f"PPid:\t{os.getpid()}\n" in (entry / "status").read_text():
                    found.append(int(entry.name))
        return found
    seen, run_once = [], bench_run.run_once
    monkeypatch.setattr(bench_run, "run_once", lambda *args: seen.append(busy_loops()) or run_once(*args))
    done = script("bench_run.py", "--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"),
                  "--max_iters", "2", "--out_dir", str(out), "--busy", "1", "--json", str(figures))
    assert done.returncode == 0, done.stderr
    assert json.loads(figures.read_text(encoding="utf-8"))["busy"] == 1 and "beside 1 CPU-bound process" in done.stdout
    assert len(seen) == 1 and len(seen[0]) == 1 and busy_loops() == []
    assert script("bench_run.py", "--busy", "-1").returncode == 2


@pytest.mark.slow
def test_bench_run_seeds_and_nanogpt_give_the_mean_spread_and_ratio_of_the_runs_they_made(tmp_path, small_text, script,
                                                                                          monkeypatch):
    """bench_run.py --seeds A,B --nanogpt DIR runs the variant once per seed (each run's config holds its seed) and,
    before each, nanoGPT's CPU recipe: its train.py (here a stand-in checkout that records its command line and hands
    over a checkpoint of ours in nanoGPT's layout) in a copy of the checkout, on input.txt = the --data file, prepared
    by its own prepare.py. The table's mean, spread and ratio are those of the runs' own figures; nanoGPT's loss is its
    checkpoint's full validation; the first table's row is the runs' medians, loss included (not the last seed's loss
    beside the median time); the user's checkout is left byte for byte as it was. A relative --out_dir means the folder
    under the current one, for nanoGPT's runs too (which run in the copy's folder)."""
    import torch
    import bench_run
    from conftest import train_debug
    from training.checkpoint import load, load_model

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_text, encoding="utf-8")
    summary = train_debug(corpus, tmp_path / "ours", "--max_iters", "10")
    model, tokenizer, state = load_model(tmp_path / "ours" / "ckpt_best.safetensors")
    checkout = tmp_path / "nanoGPT"
    (checkout / "config").mkdir(parents=True)
    (checkout / "data" / "shakespeare_char").mkdir(parents=True)
    (checkout / "config" / "train_shakespeare_char.py").write_text("dataset = 'shakespeare_char'\n")
    (checkout / "model.py").write_text("from model import GPT, ModelConfig as GPTConfig\n")  # our GPT, its names
    torch.save({"model": model.state_dict(), "model_args": model.config.to_dict(),
                "config": {"dataset": "shakespeare_char"}, "iter_num": state["iter"],
                "best_val_loss": torch.tensor(state["best_val_loss"])}, tmp_path / "theirs.pt")
    (checkout / "train.py").write_text(
        "import json, shutil, sys\n"
        "out = next(a for a in sys.argv if a.startswith('--out_dir=')).split('=', 1)[1]\n"
        f"shutil.os.makedirs(out); shutil.copyfile({str(tmp_path / 'theirs.pt')!r}, out + '/ckpt.pt')\n"
        f"open({str(tmp_path / 'argv.txt')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    (checkout / "data" / "shakespeare_char" / "prepare.py").write_text(  # its split and ids: ours, as theirs are
        "import numpy as np\ntext = open('input.txt').read()\nids = {c: i for i, c in enumerate(sorted(set(text)))}\n"
        "np.array([ids[c] for c in text[int(len(text) * 0.9):]], dtype=np.uint16).tofile('val.bin')\n")
    before = {p: p.read_bytes() for p in checkout.rglob("*") if p.is_file()}
    out, figures = tmp_path / "runs", tmp_path / "runs.json"
    monkeypatch.chdir(tmp_path)
    done = script("bench_run.py", "--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"),
                  "--max_iters", "6", "--out_dir", "runs", "--json", str(figures), "--seeds", "3,5",
                  "--nanogpt", str(checkout))
    assert done.returncode == 0, done.stderr
    assert {p: p.read_bytes() for p in checkout.rglob("*") if p.is_file()} == before
    said = [json.loads(line) for line in (tmp_path / "argv.txt").read_text().splitlines()]
    assert said == [bench_run.NANOGPT_CPU_RECIPE + [f"--out_dir={out / name}"] for name in ("nanogpt-s3-r1",
                                                                                           "nanogpt-s5-r1")]
    got = json.loads(figures.read_text(encoding="utf-8"))
    assert [r["full_val_loss"] for r in got["nanogpt"]] == pytest.approx([summary["full_val_loss"]] * 2, rel=1e-6)
    [row] = got["variants"]
    runs = {seed: json.loads((out / f"01-s{seed}-r1" / "summary.json").read_text()) for seed in (3, 5)}
    assert [load(out / f"01-s{seed}-r1" / "ckpt_last.safetensors")["run_config"]["seed"]
            for seed in (3, 5)] == [3, 5]
    losses = [runs[3]["full_val_loss"], runs[5]["full_val_loss"]]
    assert [r["full_val_loss"] for r in row["runs"]] == losses and losses[0] != losses[1]  # two seeds: two models
    assert row["mean_full_val_loss"] == pytest.approx(sum(losses) / 2)
    assert row["loss_spread"] == pytest.approx(abs(losses[0] - losses[1]))
    nano_mean = sum(r["whole_seconds"] for r in got["nanogpt"]) / 2
    assert row["times_nanogpt"] == pytest.approx(row["mean_whole_seconds"] / nano_mean)
    assert f"{row['mean_full_val_loss']:.4f}" in done.stdout and f"{row['times_nanogpt']:.2f}x" in done.stdout
    # the first table's row is one variant's medians, its loss too: not the last seed's loss beside the median time
    first = next(line for line in done.stdout.splitlines() if line.startswith("as given")).split()
    wholes = [r["whole_seconds"] for r in got["variants"][0]["runs"]]
    assert first[2:5] == [f"{sum(wholes) / 2:.1f}", f"{sum(r['train_seconds'] for r in runs.values()) / 2:.1f}",
                          f"{sum(losses) / 2:.4f}"], done.stdout

    import bench  # --compare config=A,B: two presets, a name and a file, each a variant of its own
    assert bench.parse_compare(["config=debug,my.toml"]) == [{"config": "debug"}, {"config": "my.toml"}]
    seeded = script("bench_run.py", "--config", "debug", "--seed", "2", "--seeds", "1,2", "--out_dir", str(out))
    assert seeded.returncode == 2 and seeded.stderr == "error: --seeds chooses each run's seed. Leave --seed out\n"
    nameless = script("bench_run.py", "--config", "debug", "--nanogpt", str(checkout), "--out_dir", str(out))
    assert nameless.returncode == 2 and nameless.stderr == ("error: --nanogpt needs the text as a file. "
                                                            "Name it with --data FILE\n")
    elsewhere = script("bench_run.py", "--config", "debug", "--data", str(corpus), "--nanogpt", str(tmp_path),
                       "--out_dir", str(out))
    assert elsewhere.returncode == 2 and elsewhere.stderr == (f"error: --nanogpt {tmp_path}: not a checkout of "
                                                              f"karpathy/nanoGPT. Clone it and name its folder\n")

    # a link planted where the runs go is refused, never written through; a nanoGPT stopped by SIGTERM stops the bench
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    for planted in ("nanogpt-code", "nanogpt-s1-r1"):
        links = tmp_path / f"links-{planted}"
        links.mkdir()
        (links / planted).symlink_to(target, target_is_directory=True)
        refused = script("bench_run.py", "--config", "debug", "--data", str(corpus), "--max_iters", "2",
                         "--seeds", "1", "--nanogpt", str(checkout), "--out_dir", str(links))
        assert refused.returncode == 2 and f"{links / planted} is a link, which a run never makes there" in \
            refused.stderr, refused.stderr
        assert [p.name for p in target.iterdir()] == ["keep.txt"] and (target / "keep.txt").read_text() == "mine"
    shutil.copytree(checkout, tmp_path / "dying")
    (tmp_path / "dying" / "train.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    ended = script("bench_run.py", "--config", "debug", "--data", str(corpus), "--seeds", "1",
                   "--nanogpt", str(tmp_path / "dying"), "--out_dir", str(tmp_path / "dying-runs"))
    assert ended.returncode == 130 and "stopped during nanoGPT's train.py (exit code -15" in ended.stderr, ended.stderr


def test_score_nanogpt_gives_a_runs_own_full_validation(tmp_path, small_text, script):
    """scripts/score_nanogpt.py, handed a run of ours laid out as nanoGPT's (a model.py with its names, a checkpoint of
    its keys, val.bin holding the last 10% of the text as its prepare.py writes it), reports that run's own full
    validation: the same windows, scored the same way."""
    import numpy as np
    import torch
    from conftest import train_debug
    from training.checkpoint import load_model

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_text, encoding="utf-8")
    summary = train_debug(corpus, tmp_path / "run", "--max_iters", "30")  # debug: cpu, float32
    model, tokenizer, state = load_model(tmp_path / "run" / "ckpt_best.safetensors")
    nanogpt = tmp_path / "nanogpt"
    (nanogpt / "data" / "chars").mkdir(parents=True)
    (nanogpt / "model.py").write_text("from model import GPT, ModelConfig as GPTConfig\n")  # our GPT, its names
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()},  # as a compiled model saves
                "model_args": model.config.to_dict(), "config": {"dataset": "chars"}, "iter_num": state["iter"],
                "best_val_loss": torch.tensor(state["best_val_loss"])}, nanogpt / "ckpt.pt")
    val = small_text[int(len(small_text) * 0.9):]
    np.array(tokenizer.encode(val), dtype=np.uint16).tofile(nanogpt / "data" / "chars" / "val.bin")
    done = script("score_nanogpt.py", str(nanogpt), str(nanogpt / "ckpt.pt"), "--device", "cpu", "--dtype", "float32",
                  "--batch_size", "5")
    assert done.returncode == 0, done.stderr
    assert f"step {state['iter']}" in done.stdout and "full validation " in done.stdout
    import score_nanogpt  # the figure to more places than it prints: float32 sums in another order, nothing more
    from common.machine import setup
    rt = setup("cpu", "float32")
    scored = score_nanogpt.full_validation(score_nanogpt.load_nanogpt(nanogpt, nanogpt / "ckpt.pt", rt.device)[0],
                                           np.fromfile(nanogpt / "data" / "chars" / "val.bin", dtype=np.uint16),
                                           model.config.block_size, 5, rt)
    assert scored == pytest.approx(summary["full_val_loss"], rel=1e-6)
    missing = script("score_nanogpt.py", str(tmp_path), str(nanogpt / "ckpt.pt"))
    assert missing.returncode == 2 and "has no model.py" in missing.stderr
    ours = script("score_nanogpt.py", str(nanogpt), str(tmp_path / "run" / "ckpt_best.safetensors"))  # not nanoGPT's layout
    assert ours.returncode == 2 and ours.stderr.count("\n") == 1 and "not a readable nanoGPT checkpoint" in ours.stderr
    for args, said in (({"n_layer": 200, "n_embd": 8192}, "(n_layer 200) do not fit its "),  # before anything is built
                       ({"n_embd": 8192, "n_head": 2}, "do not fit its weights (blocks.0.attn.c_attn.bias: (24576,)")):
        hostile = torch.load(nanogpt / "ckpt.pt", weights_only=True)
        hostile["model_args"] = {**hostile["model_args"], **args}
        torch.save(hostile, tmp_path / "hostile.pt")
        refused = script("score_nanogpt.py", str(nanogpt), str(tmp_path / "hostile.pt"))
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and said in refused.stderr, refused.stderr



def test_bench_counts_the_hosts_waits_per_training_step_and_fails_above_the_bound(tmp_path, small_text, script):
    """bench.py --host_syncs MOST counts the values read from the device over --iters steps (on a CPU: with Muon, the
    step's finite flag, read there for free, once a step; AdamW reads none), names the line of the project's code
    that read it, and exits 1 above MOST per step."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_text, encoding="utf-8")
    common = ("--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"), "--iters", "3",
              "--warmup", "1")
    over = script("bench.py", *common, "--optimizer", "muon", "--host_syncs", "0")
    assert over.returncode == 1 and "host waits for the device: 3 in 3 training steps (1.00 per step, at most 0" \
        in over.stdout, over.stdout + over.stderr
    assert "\n  3 x training/optim.py:" in over.stdout and "(step_if_finite)" in over.stdout, over.stdout
    assert script("bench.py", *common, "--optimizer", "muon", "--host_syncs", "1").returncode == 0
    none = script("bench.py", *common, "--optimizer", "adamw", "--host_syncs", "0")
    assert none.returncode == 0 and "host waits for the device: 0 in 3 training steps" in none.stdout


def test_bench_sample_keeps_one_cache_per_shape_across_its_timed_runs(monkeypatch):
    """bench_sample alternates 1 row and a batch on one model, and generate() keeps one shape of caches per model:
    each shape keeps its caches from the warm-up to the last round, the same tensors at the same addresses, so no
    timed run pays for reallocating them (nor, compiled, for recording its CUDA graph again)."""
    import torch
    import bench_sample
    from model import GPT, ModelConfig
    seen = {}

    def recording(model, prompts, *args, **kwargs):
        out = bench_sample.generate.__wrapped__(model, prompts, *args, **kwargs)
        if kwargs.get("use_cache", True):
            caches = model.decode_caches[1]
            seen.setdefault(len(prompts), []).append((caches, [c.keys.data_ptr() for c in caches]))
        return out
    recording.__wrapped__ = bench_sample.generate
    monkeypatch.setattr(bench_sample, "generate", recording)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16))
    bench_sample.bench_sampling(model, "cpu", [torch.float32], 4, batch=3, rounds=2)
    assert sorted(seen) == [1, 3]
    for rows, calls in seen.items():
        assert len(calls) == 1 + 2  # the warm-up and two rounds
        first, addresses = calls[0]
        assert all(caches is first and ptrs == addresses for caches, ptrs in calls), rows


def test_host_waits_on_cuda_count_each_synchronizing_call_where_it_happened_and_not_the_modes_own_note(monkeypatch):
    """HostWaits on CUDA counts torch's "called a synchronizing CUDA operation" warnings, each at the project's line that
    made the call, and not the note torch gives once a process when the mode is set (which names "synchronizing
    operations" too). torch's sync debug mode is played by stand-ins that warn as torch does."""
    import warnings
    import torch
    import bench
    from bench import HostWaits

    def set_mode(mode):  # torch warns this note at the first setting in a process
        if mode == "warn":
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations")
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    monkeypatch.setattr(bench, "sync", lambda device: None)

    def read_back():  # what torch says at a wait (the warning comes while the call is on the stack)
        warnings.warn("called a synchronizing CUDA operation")

    with HostWaits(torch.device("cuda")) as waits:
        read_back()
        read_back()
    assert waits.count == 2
    [(place, n)] = waits.places.items()
    assert n == 2 and place.startswith("tests/test_bench.py:") and place.endswith(" (read_back)"), place


def test_graph_recordings_count_every_cuda_graph_but_the_one_graph_trees_keep_their_pool_with(monkeypatch):
    """GraphRecordings counts each CUDA graph recorded inside it (each capture_begin, however deep below graph trees'
    frames), except the empty graph that graph trees' manager records to keep its memory pool alive; capture_begin is
    as it was after. torch's graph trees and torch.cuda.graph are played by stand-ins compiled under their file
    names."""
    import textwrap
    import torch
    from bench import GraphRecordings

    begun = []

    def stand_in(graph, *args, **kwargs):
        begun.append(graph)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", stand_in)
    torch_code = {}
    exec(compile("import torch\ndef graph(name):\n    torch.cuda.CUDAGraph.capture_begin(name)\n",
                 "/lib/torch/cuda/graphs.py", "exec"), torch_code)  # torch.cuda.graph: the recording one level down
    exec(compile(textwrap.dedent("""
        class CUDAGraphTreeManager:
            def __init__(self):
                graph("the pool keeper")

        class CUDAGraphNode:
            def record(self):
                graph("a step")
        """), "/lib/torch/_inductor/cudagraph_trees.py", "exec"), torch_code)

    with GraphRecordings() as recorded:
        torch_code["CUDAGraphTreeManager"]()
        node = torch_code["CUDAGraphNode"]()
        node.record()
        node.record()
        torch_code["graph"]("torch.cuda.graph in a user's code")
    assert recorded.count == 3
    assert begun == ["the pool keeper", "a step", "a step", "torch.cuda.graph in a user's code"]
    assert torch.cuda.CUDAGraph.capture_begin is stand_in


def test_score_nanogpt_scores_in_the_precision_evaluate_py_uses_for_a_run_of_ours(tmp_path, small_text, script):
    """A run of ours trained with --dtype auto is scored by evaluate.py in its own precision (bfloat16 on a CPU with
    bfloat16 units, float32 elsewhere); score_nanogpt.py, left to its default, scores a nanoGPT checkpoint in that same
    precision, so a comparison's two figures are measured alike (never float32 beside bfloat16)."""
    import json
    import numpy as np
    import torch
    from conftest import train_debug
    from training.checkpoint import load_model

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_text, encoding="utf-8")
    train_debug(corpus, tmp_path / "run", "--max_iters", "2", "--dtype", "auto", "--full_val", "false")
    done = script("evaluate.py", "--out_dir", str(tmp_path / "run"), "--data", str(corpus), "--json",
                  str(tmp_path / "figures.json"), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    ours = json.loads((tmp_path / "figures.json").read_text())["dtype"]
    assert f", in {ours}\n" in done.stderr
    model, tokenizer, state = load_model(tmp_path / "run" / "ckpt_best.safetensors")
    nanogpt = tmp_path / "nanogpt"
    (nanogpt / "data" / "chars").mkdir(parents=True)
    (nanogpt / "model.py").write_text("from model import GPT, ModelConfig as GPTConfig\n")
    torch.save({"model": model.state_dict(), "model_args": model.config.to_dict(), "config": {"dataset": "chars"},
                "iter_num": state["iter"], "best_val_loss": torch.tensor(2.0)}, nanogpt / "ckpt.pt")
    np.array(tokenizer.encode(small_text[-2000:]), dtype=np.uint16).tofile(nanogpt / "data" / "chars" / "val.bin")
    scored = script("score_nanogpt.py", str(nanogpt), str(nanogpt / "ckpt.pt"), "--device", "cpu")
    assert scored.returncode == 0 and scored.stdout.rstrip().endswith(f" on cpu, {ours})"), scored.stdout
