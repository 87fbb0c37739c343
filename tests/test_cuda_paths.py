"""The CUDA-only code's logic, checked on a CPU with torch.cuda's functions stood in for where only the call matters:
the device a run makes current, the dtype auto picks on GPUs that only emulate bfloat16."""
import pytest
import torch

from training import runtime


@pytest.fixture
def a_gpu_that_emulates_bfloat16(monkeypatch):
    """torch.cuda as on a T4 or V100 (compute capability 7): is_bf16_supported() is True only counting emulation."""
    made_current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    return made_current


def test_a_gpu_chosen_by_index_is_made_current_in_one_process(a_gpu_that_emulates_bfloat16):
    """--device cuda:1 without torchrun: the RNG state saved and restored, and the sampler's events, are the current
    device's, so it must be cuda:1 (set_device had been called under torchrun only)."""
    rt = runtime.setup("cuda:1", "float32")
    assert rt.device == torch.device("cuda", 1) and a_gpu_that_emulates_bfloat16 == [torch.device("cuda", 1)]


def test_auto_picks_float16_where_bfloat16_is_only_emulated(a_gpu_that_emulates_bfloat16):
    assert runtime.pick_dtype("auto", torch.device("cuda", 0)) == torch.float16
    assert runtime.pick_dtype("bfloat16", torch.device("cuda", 0)) == torch.bfloat16  # asked for by name: as asked


def test_with_the_float16_scaler_a_loss_that_is_not_finite_still_counts(monkeypatch):
    """float16 trains with a gradient scaler, which skips a step whose gradients overflow: its normal search for a
    scale, not counted. But a loss that is itself not finite is the run going wrong, and must reach the non-finite
    watch (it had been told every float16 step was finite, so --max_nonfinite_steps never fired)."""
    from types import SimpleNamespace
    from training.step import train_step

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3))

        def forward(self, x, y):
            return None, (self.weight * x).sum() * y

    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=True)  # the CUDA scaler's logic, on the CPU
    rt = runtime.Runtime(torch.device("cpu"), torch.float32)
    cfg = SimpleNamespace(grad_accum_steps=1, grad_clip=1.0)
    for y, finite in ((1.0, True), (float("nan"), False)):
        batches = SimpleNamespace(get_batch=lambda split: (torch.ones(3), torch.tensor(y)))
        assert bool(train_step(model, optimizer, scaler, batches, rt, cfg, 0.1)[2]) is finite
    assert torch.isfinite(model.weight).all()  # the scaler skipped the bad step


def test_mfu_under_torchrun_is_each_processs_share_of_its_own_device():
    """tokens per step count every process's batch, and the peak is one device's: two processes at 30% each had
    read 60% (nanoGPT counts per GPU too)."""
    from types import SimpleNamespace
    from training.step_log import StepLog

    logged = {}
    s = SimpleNamespace(run=SimpleNamespace(tokens_per_iter=2000, flops_per_token=300.0),
                        progress=SimpleNamespace(it=10, last_eval={}), cfg=SimpleNamespace(log_interval=10, max_iters=20),
                        d=SimpleNamespace(world_size=2),
                        log=SimpleNamespace(scalars=lambda it, values: logged.update(values), line=lambda text: None))
    clock = SimpleNamespace(step_seconds=lambda: 1.0)
    watch = SimpleNamespace(longest=torch.tensor(0), looked=lambda: None)
    bar = SimpleNamespace(set_postfix_str=lambda *args, **kwargs: None)
    peak = 300.0 * 2000 / 2 / 0.3  # the FLOP/s at which one process's share is 30%
    StepLog(s, bar, clock, watch, peak).write(1e-3, torch.tensor(2.0), torch.tensor(1.0))
    assert logged["perf/mfu"] == pytest.approx(30.0)


def test_compile_fallback_gives_up_compiling_for_a_compiler_failure_only():
    """A compiler that fails is warned about once and the call repeated uncompiled; running out of memory is the
    run's own problem (the one-line out-of-memory message), which the fallback had swallowed, turning compilation off
    and calling it 'torch.compile failed'."""
    from training.compiling import CompileFallback

    def fails_with(err):
        def compiled(*args):
            raise err
        return compiled

    said = []
    fallback = CompileFallback(lambda x: x + 1, fails_with(RuntimeError("inductor: C++ compile error")), said.append)
    assert fallback(1) == 2 and len(said) == 1 and fallback.compiled is None
    fallback = CompileFallback(lambda x: x + 1, fails_with(torch.OutOfMemoryError("CUDA out of memory")), said.append)
    with pytest.raises(torch.OutOfMemoryError):
        fallback(1)
    assert fallback.compiled is not None and len(said) == 1
