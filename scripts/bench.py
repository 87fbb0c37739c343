"""python scripts/bench.py [train.py options]: training, sampling and data speed, with MFU; --compare times
training under each value in turn, round after round, in one process."""
from __future__ import annotations

import collections
import contextlib
import inspect
import itertools
import statistics
import sys
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from common.machine import for_sampling, setup, sync  # noqa: E402
from configs import load_config  # noqa: E402
from configs.schema import FIELDS  # noqa: E402
from errors import UserError, run_cli  # noqa: E402
from training.device import measure_peak_flops  # noqa: E402
from training.opening import build_run, prepare_data  # noqa: E402
from train import forward_backward, train_step, update  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from bench_prepare import count, figures_parser, measure, print_table, write_figures  # noqa: E402
from bench_sample import bench_sampling, dtype_name, timed  # noqa: E402


class CountOperations(TorchDispatchMode):
    """ops.count: the operations that compute or copy inside the block (about a GPU launch each)."""

    LAUNCH_NOTHING = frozenset({"_unsafe_view", "_record_function_enter_new", "_record_function_exit"})

    def __init__(self, seen=lambda func: None):
        super().__init__()
        self.count, self.seen = 0, seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not (func.is_view or func.overloadpacket.__name__ in self.LAUNCH_NOTHING)
        self.seen(func)
        return func(*args, **(kwargs or {}))


def build_training(cfg, rt, say=print) -> dict:
    """A run's model and its training step, as train.py builds them."""
    run, _ = build_run(cfg, rt, prepare_data(cfg, say), say=say)
    autocast = rt.autocast()
    return {"model": run.model, "params": run.model.num_params(non_embedding=False),
            "matmul_shape": (cfg.batch_size * cfg.block_size, cfg.n_embd, 4 * cfg.n_embd),  # the largest product
            "flops_per_token": run.flops_per_token, "tokens_per_iter": run.tokens_per_iter,
            "step": lambda: train_step(run.step_model, run.optimizer, run.scaler, run.batches, autocast, cfg,
                                       cfg.learning_rate, rt),
            "forward_backward": lambda: forward_backward(run.step_model, run.optimizer, run.scaler, run.batches,
                                                         autocast, cfg, rt),
            "update": lambda: update(run.step_model, run.optimizer, run.scaler, cfg, cfg.learning_rate, rt)}


class HostWaits(contextlib.ExitStack):
    """The host's waits for the device inside the block, by place: on CUDA, torch's sync debug warnings;
    elsewhere, each tensor value read into Python."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device, self.places = device, collections.Counter()

    @property
    def count(self) -> int:
        return sum(self.places.values())

    def seen(self) -> None:
        """Count one wait at the project's innermost line on the stack."""
        ours = [(path, f) for f in traceback.extract_stack() if (path := Path(f.filename).resolve()) != HERE
                and path.is_relative_to(ROOT) and "site-packages" not in f.filename]
        self.places[f"{ours[-1][0].relative_to(ROOT)}:{ours[-1][1].lineno} ({ours[-1][1].name})" if ours
                    else "(inside torch)"] += 1

    def describe(self) -> str:
        return "".join(f"\n  {n} x {place}" for place, n in self.places.most_common())

    def __enter__(self) -> "HostWaits":
        super().__enter__()
        sync(self.device)
        if self.device.type != "cuda":
            reads = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)
            self.enter_context(CountOperations(lambda func: func in reads and self.seen()))
            return self
        self.enter_context(warnings.catch_warnings())
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def show(message, category, *rest, **kw):
            if "called a synchronizing CUDA operation" in str(message):
                self.seen()
            elif "debug mode is a prototype" not in str(message):  # torch's note when the mode is set: no wait
                shown(message, category, *rest, **kw)
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        self.callback(torch.cuda.set_sync_debug_mode, 0)
        return self


class GraphRecordings:
    """graphs.count: the CUDA graphs recorded inside the block, less the empty one that keeps graph trees' pool."""

    def __init__(self):
        self.count = 0

    def __enter__(self) -> "GraphRecordings":
        self._begin = begin = torch.cuda.CUDAGraph.capture_begin

        def counted(graph, *args, **kwargs):
            frame = inspect.currentframe().f_back  # the pool keeper is recorded from graph trees' manager
            while frame is not None and not frame.f_code.co_filename.endswith("cudagraph_trees.py"):
                frame = frame.f_back
            self.count += frame is None or type(frame.f_locals.get("self")).__name__ != "CUDAGraphTreeManager"
            return begin(graph, *args, **kwargs)
        torch.cuda.CUDAGraph.capture_begin = counted
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.CUDAGraph.capture_begin = self._begin


def repeat(step, times: int) -> None:
    for _ in range(times):
        step()


def speed(run: dict, seconds: float, peak_flops: float) -> dict:
    """ms/iter, tokens/s, achieved FLOP/s and MFU of a step of these seconds."""
    tokens_per_sec = run["tokens_per_iter"] / seconds
    achieved = run["flops_per_token"] * tokens_per_sec
    peak_flops = max(peak_flops, achieved)  # a step faster than the measured ceiling is the ceiling
    return {"ms_per_iter": seconds * 1000, "tokens_per_sec": tokens_per_sec, "achieved_flops": achieved,
            "peak_flops": peak_flops, "mfu": achieved / peak_flops}


COMPARABLE = (set(FIELDS) - {"config_name"}) | {"config"}  # every train.py option


def parse_compare(specs: list[str]) -> list[dict[str, str]]:
    """["dtype=float32,bfloat16", "compile=false,true"] -> every combination, as {field: value} dicts."""
    axes = []
    for spec in specs:
        field, _, values = spec.partition("=")
        if field not in COMPARABLE or not values or not all(values.split(",")):
            raise UserError(f"--compare {spec}: not FIELD=A,B of a train.py field. Give e.g. dtype=float32,bfloat16")
        axes.append([(field, value) for value in values.split(",")])
    variants = [dict(combination) for combination in itertools.product(*axes)]
    if len(variants) < 2:
        raise UserError("--compare: one value is no comparison. Give two, e.g. dtype=float32,bfloat16")
    return variants


def options(variant: dict[str, str]) -> list[str]:
    return [part for field, value in variant.items() for part in (f"--{field}", value)]


def variant_name(variant: dict[str, str]) -> str:
    return ",".join(f"{field}={value}" for field, value in variant.items()) or "as given"


def compare(rest: list[str], variants: list[dict[str, str]], rounds: int, iters: int, warmup: int) -> list[dict]:
    """Time each variant's step in turn, rounds times: medians and ratios to the first."""
    default_threads = torch.get_num_threads()
    runs, peaks = [], {}
    for variant in variants:
        cfg, _, _ = load_config(rest + options(variant), torch.cuda.is_available())
        rt = setup(cfg.device, cfg.dtype, cfg.num_threads)
        run = build_training(cfg, rt, say=print if not runs else lambda message: None)  # say the corpus once
        run.update(variant=variant, rt=rt, threads=cfg.num_threads or default_threads, seconds=[])
        torch.set_num_threads(run["threads"])
        repeat(run["step"], warmup)
        runs.append(run)
    for _ in range(rounds):
        for run in runs:
            torch.set_num_threads(run["threads"])
            run["seconds"].append(timed(lambda: repeat(run["step"], iters), run["rt"].device) / iters)
    torch.set_num_threads(default_threads)
    results = []
    for run in runs:
        rt = run["rt"]
        key = (str(rt.device), rt.dtype, run["matmul_shape"])
        peaks[key] = peaks.get(key) or measure_peak_flops(rt.device, rt.dtype, [run["matmul_shape"]])
        results.append({**{k: run[k] for k in ("variant", "threads", "params", "tokens_per_iter", "flops_per_token")},
                        "device": rt.describe(), **speed(run, statistics.median(run["seconds"]), peaks[key]),
                        "ms_per_iter_rounds": [t * 1000 for t in run["seconds"]]})
        results[-1]["time_vs_first"] = results[-1]["ms_per_iter"] / results[0]["ms_per_iter"]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = figures_parser(__doc__)
    parser.add_argument("--iters", type=count, default=20, help="timed training steps (per round with --compare)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed training steps first")
    parser.add_argument("--sample_tokens", type=count, default=500, help="characters generated per sampling figure")
    parser.add_argument("--prepare_mb", type=count, default=50, help="MB of generated text for the prepare speed")
    parser.add_argument("--compare", action="append", default=[], metavar="FIELD=A,B",
                        help="time training under each value of a train.py field in turn (repeatable)")
    parser.add_argument("--rounds", type=count, default=7, help="rounds of --compare")
    parser.add_argument("--host_syncs", type=float, default=None, metavar="MOST",
                        help="only count the host's waits over --iters steps: exit 1 above MOST a step")
    args, rest = parser.parse_known_args(argv)
    if args.warmup < 0:
        raise UserError(f"--warmup {args.warmup}: must be at least 0")
    cfg, note, _ = load_config(rest, torch.cuda.is_available())
    if args.compare:
        results = compare(rest, parse_compare(args.compare), args.rounds, args.iters, args.warmup)
        print(f"{note}\n{len(results)} variants, each timed for {args.iters} steps in turn, {args.rounds} rounds "
              "(medians; min-max of the rounds)")
        print_table(["variant", "ms/iter", "min-max", "tokens/s", "MFU", "time vs first"], [
            [variant_name(r["variant"]), f"{r['ms_per_iter']:.1f}",
             f"{min(r['ms_per_iter_rounds']):.1f}-{max(r['ms_per_iter_rounds']):.1f}", f"{r['tokens_per_sec']:,.0f}",
             f"{r['mfu'] * 100:.1f}%", f"{r['time_vs_first']:.2f}"] for r in results])
        write_figures(args.json, {"config": cfg.config_name, "rounds": args.rounds, "iters": args.iters,
                                  "variants": results})
        return 0
    rt = setup(cfg.device, cfg.dtype, cfg.num_threads)
    run = build_training(cfg, rt)
    repeat(run["step"], args.warmup)
    if args.host_syncs is not None:
        with HostWaits(rt.device) as waits:
            repeat(run["step"], args.iters)
        print(f"host waits for the device: {waits.count} in {args.iters} training steps "
              f"({waits.count / args.iters:.2f} per step, at most {args.host_syncs:g} allowed), {rt.describe()}"
              + waits.describe())
        return 0 if waits.count / args.iters <= args.host_syncs else 1
    f = {"config": cfg.config_name, "device": rt.describe(), "threads": torch.get_num_threads(),
         "optimizer": cfg.optimizer}
    step, forward_backward, update = run.pop("step"), run.pop("forward_backward"), run.pop("update")
    seconds = timed(lambda: repeat(step, args.iters), rt.device) / args.iters
    halves = [0.0, 0.0]  # a step's two halves, each timed alone
    for _ in range(args.iters):
        halves[0] += timed(forward_backward, rt.device)
        halves[1] += timed(update, rt.device)
    f["ms_forward_backward"], f["ms_update"] = (half * 1000 / args.iters for half in halves)
    forward_backward()
    with CountOperations() as ops:
        update()
    f["update_operations"] = ops.count
    model = run.pop("model")
    f.update(run)
    f.update(speed(run, seconds, measure_peak_flops(rt.device, rt.dtype, [run.pop("matmul_shape")])))
    sample_dtype = for_sampling(rt, cfg.dtype, model.num_params(non_embedding=False)).dtype
    f.update(bench_sampling(model, rt.device_type, [sample_dtype], args.sample_tokens,
                            compile=rt.device_type == "cuda"))
    f["sample_dtype"] = dtype_name(sample_dtype)
    f["prepare_mb_per_sec"] = measure(args.prepare_mb)["mb_per_s"]
    compiled = f", {f['sample_chars_per_sec_compiled']:,.0f} compiled" if "sample_chars_per_sec_compiled" in f else ""
    print(note)
    for name, value in (
            ("device", f"{f['device']} ({f['threads']} threads)"),
            ("model", f"{f['params'] / 1e6:.2f}M parameters, {cfg.n_layer}x{cfg.n_head}x{cfg.n_embd}, "
                      f"block {cfg.block_size}, batch {cfg.batch_size}, {cfg.optimizer}"),
            ("train step", f"{f['ms_per_iter']:.1f} ms/iter, {f['tokens_per_sec']:,.0f} tokens/s"),
            ("its halves", f"{f['ms_forward_backward']:.1f} ms forward and backward, {f['ms_update']:.1f} ms update "
                           f"(with clipping; {f['update_operations']} operations), each timed alone"),
            ("model FLOPs", f"{f['flops_per_token'] / 1e6:.2f} MFLOP/token, {f['achieved_flops'] / 1e9:.1f} GFLOP/s"),
            ("peak (matmul)", f"{f['peak_flops'] / 1e9:.1f} GFLOP/s in {dtype_name(rt.dtype)}"),
            ("MFU", f"{f['mfu'] * 100:.1f}%"),
            ("sampling", f"{f['sample_chars_per_sec_cached']:,.0f} chars/s with KV cache, "
                         f"{f['sample_chars_per_sec_uncached']:,.0f} without ({f['sample_cache_speedup']:.1f}x), "
                         f"{f['sample_chars_per_sec_batch8_cached']:,.0f} for 8 rows{compiled}, {f['sample_dtype']}"),
            ("data prepare", f"{f['prepare_mb_per_sec']:.1f} MB/s")):
        print(f"{name:<13}  {value}")
    write_figures(args.json, f)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
