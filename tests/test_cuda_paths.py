"""The CUDA-only code's logic, checked on a CPU with torch.cuda's functions stood in for where only the call matters:
the device a run makes current, the dtype auto picks on GPUs that only emulate bfloat16."""
import contextlib

import pytest
import torch
from common.machine import Runtime, pick_dtype, setup
from training.optim import AdamW


@pytest.fixture
def a_gpu_that_emulates_bfloat16(monkeypatch):
    """torch.cuda as on a machine with two T4s or V100s (compute capability 7): is_bf16_supported() is True only
    counting emulation."""
    made_current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    return made_current


def test_a_gpu_chosen_by_index_is_made_current_in_one_process(a_gpu_that_emulates_bfloat16):
    """--device cuda:1 without torchrun makes cuda:1 current, as under torchrun: the RNG state saved and restored,
    and the sampler's events, are the current device's, so it must be cuda:1."""
    rt = setup("cuda:1", "float32")
    assert rt.device == torch.device("cuda", 1) and a_gpu_that_emulates_bfloat16 == [torch.device("cuda", 1)]


def test_a_gpu_index_past_the_machines_count_is_one_line_and_exit_2(a_gpu_that_emulates_bfloat16, monkeypatch,
                                                                     corpus, tmp_path, capsys):
    """--device cuda:2 on a machine with two GPUs, and torchrun with more processes on a machine than it has GPUs,
    are each one line, exit 2, before the run folder is made: not CUDA's raw error (a traceback) when the run makes
    the device current."""
    import train
    from common import machine
    from errors import UserError, run_cli
    from training import device
    out = tmp_path / "run"
    argv = ["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"), "--out_dir", str(out),
            "--device", "cuda:2"]
    assert run_cli(train.main, argv) == 2
    assert capsys.readouterr().err.splitlines() == ["error: --device cuda:2: this machine has 2 GPUs (cuda:0 to "
                                                    "cuda:1); give one of them, or --device cuda"]
    assert not out.exists() and a_gpu_that_emulates_bfloat16 == []  # nothing made, no device made current
    assert machine.pick_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(UserError, match=r"^torchrun started 3 processes on this machine, which has 2 GPUs \(cuda:0 "
                                        r"to cuda:1\)\. Give --nproc_per_node at most 2$"):
        device.init(device.Dist(rank=2, local_rank=2, world_size=3), "cuda")
    assert a_gpu_that_emulates_bfloat16 == []


def test_auto_picks_float16_where_bfloat16_is_only_emulated(a_gpu_that_emulates_bfloat16):
    assert pick_dtype("auto", torch.device("cuda", 0)) == torch.float16
    assert pick_dtype("bfloat16", torch.device("cuda", 0)) == torch.bfloat16  # asked for by name: as asked


@pytest.mark.parametrize("emulated", [True, False])
def test_muons_newton_schulz_follows_autos_rule_bfloat16_only_where_the_gpu_has_it(monkeypatch, emulated):
    """A V100 or T4 only emulates bfloat16, where --dtype auto picks float16: Muon's Newton-Schulz products run in
    float32 there, and in bfloat16 on a GPU that has it."""
    from model import GPT, ModelConfig
    from training.optim import configure_optimizer
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
                        or not emulated)
    model = GPT(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    optimizer = configure_optimizer(model, 1e-2, 0.1, (0.9, 0.95), "cuda", kind="muon")
    assert optimizer.muon.ns_dtype == (torch.float32 if emulated else torch.bfloat16)
    assert (pick_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16) == (not emulated)  # the same rule


def test_with_the_float16_scaler_a_loss_that_is_not_finite_still_counts(monkeypatch):
    """float16 trains with a gradient scaler, which skips a step whose gradients overflow: its normal search for a
    scale, not counted. But a loss that is itself not finite is the run going wrong, and must reach the non-finite
    watch: otherwise --max_nonfinite_steps never fires for a float16 run."""
    from types import SimpleNamespace
    from train import train_step

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3))

        def forward(self, x, y):
            return None, (self.weight * x).sum() * y

    model = Model()
    optimizer = AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=True)  # the CUDA scaler's logic, on the CPU
    rt = Runtime(torch.device("cpu"), torch.float32)
    cfg = SimpleNamespace(grad_accum_steps=1, grad_clip=1.0)
    for y, finite in ((1.0, True), (float("nan"), False)):
        batches = SimpleNamespace(get_batch=lambda split: (torch.ones(3), torch.tensor(y)))
        assert bool(train_step(model, optimizer, scaler, batches, contextlib.nullcontext(), cfg, 0.1, rt)[2]) \
            is finite
    assert torch.isfinite(model.weight).all()  # the bad step was skipped
    assert scaler.get_scale() == 65536.0 / 2  # and the scaler lowered its scale after it


def test_a_float16_run_whose_gradients_overflow_at_every_step_stops_with_the_non_finite_line(corpus, tmp_path,
                                                                                             monkeypatch):
    """float16's scaler skips a step whose gradients overflow and halves its scale: its search, not counted while the
    scale is above 1. Below that the gradients overflow float16 unscaled, and a run whose every step overflows (its
    loss finite all along) must stop with the non-finite line, not skip every step to the end. Stood in on the CPU:
    the CUDA scaler's logic with a scaled loss whose every gradient overflows."""
    from conftest import train_debug
    from errors import UserError

    class Overflowing(torch.amp.GradScaler):
        def scale(self, outputs):
            return super().scale(outputs) * float("inf")  # every gradient inf, as float16's overflowing ones are

    monkeypatch.setattr(Runtime, "grad_scaler", lambda self: Overflowing("cpu", init_scale=2.0 ** 4))
    with pytest.raises(UserError) as stopped:
        train_debug(corpus, tmp_path / "run", "--max_iters", "40", "--log_interval", "1", "--eval_interval", "20",
                    "--max_nonfinite_steps", "3")
    # scales 16, 8, 4 and 2 are the search; the steps at 1, 1/2 and 1/4 (steps 5 to 7) count
    assert str(stopped.value).startswith("stopped at step 7: 3 steps in a row had a non-finite loss or gradient")


def test_float16_steps_muon_and_adamw_as_one_without_the_host_reading_the_device(host_reads):
    """With float16 the scaler's own step() would read its overflow flag on the host for any optimizer but fused
    AdamW (Muon and AdamW together included): a wait for the GPU at every step. The step is skipped on the device
    instead, and a step under a power-of-two scale is exactly the plain step."""
    from types import SimpleNamespace
    from model import GPT, ModelConfig
    from training.optim import configure_optimizer
    from train import update

    def one_step(scale):
        torch.manual_seed(0)
        model = GPT(ModelConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
        optimizer = configure_optimizer(model, 1e-2, 0.1, (0.9, 0.95), "cuda", kind="muon")
        scaler = torch.amp.GradScaler("cpu", init_scale=scale or 1.0, enabled=scale is not None)
        x = torch.randint(0, 11, (4, 8))
        scaler.scale(model(x, x)[1]).backward()
        as_on_a_gpu = SimpleNamespace(device=SimpleNamespace(type="cuda"))  # the step as on a GPU, its tensors here
        with host_reads() as reads:
            update(model, optimizer, scaler, SimpleNamespace(grad_clip=1.0), 1e-2, as_on_a_gpu)
        return model.state_dict(), reads

    (plain, _), (scaled, reads) = one_step(None), one_step(2.0 ** 10)
    assert reads == []
    for name in plain:
        torch.testing.assert_close(scaled[name], plain[name], rtol=0, atol=0)


def test_mfu_under_torchrun_is_each_processs_share_of_its_own_device(monkeypatch):
    """tokens per step count every process's batch, and the peak is one device's: two processes at 30% each read 30%
    each (nanoGPT counts per GPU too)."""
    from types import SimpleNamespace
    import train
    from train import StepLog

    logged = {}
    writer = SimpleNamespace(add_scalar=lambda tag, value, it: logged.update({tag: value}))
    log = SimpleNamespace(writer=lambda: writer, lines=None, wandb=None, to_wandb=lambda *args: None)
    clock = SimpleNamespace(trained=10.0, started=100.0)  # 10 s of training by the log line at step 10
    monkeypatch.setattr(train.time, "perf_counter", lambda: 100.0)
    run = SimpleNamespace(tokens_per_iter=2000, flops_per_token=300.0, cfg=SimpleNamespace(max_iters=20))
    session = SimpleNamespace(run=run, log=log, clock=clock, d=SimpleNamespace(world_size=2),
                              progress=SimpleNamespace(it=0, last_eval={}, losses={"train": []}),
                              slowdown_watch=lambda: None)  # a GPU run's: no watch on its steps
    bar = SimpleNamespace(set_postfix_str=lambda *args, **kwargs: None)
    peak = 300.0 * 2000 / 2 / 0.3  # the FLOP/s at which one process's share is 30%
    steps = StepLog(session, bar, peak_flops=peak)
    steps.logged = (0, 0.0)  # the last log line: step 0, no training yet
    steps.write(10, 1e-3, torch.tensor(2.0), torch.tensor(1.0), torch.tensor(0))
    assert logged["perf/mfu"] == pytest.approx(30.0)


def test_compile_fallback_gives_up_compiling_for_a_compiler_failure_only():
    """A compiler that fails is warned about once and the call repeated uncompiled; running out of memory is the
    run's own problem and reaches it (the one-line out-of-memory message), with compilation left on and nothing
    called 'torch.compile failed'."""
    from training.device import CompileFallback

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


def test_a_backward_that_fails_to_compile_falls_back_and_the_step_is_the_uncompiled_one():
    """AOTAutograd compiles a compiled forward's backward at the first .backward(), outside the fallback's call: a
    failure there turns compilation off with the warning, and the step is computed again from where it began (same
    batch, same dropout): exactly the step an uncompiled run takes, not the end of the run."""
    from types import SimpleNamespace
    from model import GPT, ModelConfig
    from training.device import CompileFallback
    from train import train_step

    class FailsInBackward(torch.autograd.Function):  # a stand-in for inductor failing on the backward graph
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("BackendCompilerFailed: inductor: C++ compile error (stand-in)")

    class Batches:
        def __init__(self):
            self.generator = torch.Generator().manual_seed(3)

        def get_batch(self, split):
            x = torch.randint(0, 11, (4, 8), generator=self.generator)
            return x, x.roll(-1, 1)

        def state_dict(self):
            return self.generator.get_state()

        def load_state_dict(self, state):
            self.generator.set_state(state)

    def one_step(compiled: bool):
        torch.manual_seed(0)
        model = GPT(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.2)).train()
        optimizer = AdamW(model.parameters(), lr=0.1)
        said, step_model = [], model
        if compiled:
            step_model = CompileFallback(model, lambda x, y: (None, FailsInBackward.apply(model(x, y)[1])), said.append)
        cfg = SimpleNamespace(grad_accum_steps=2, grad_clip=1.0)
        rt = Runtime(torch.device("cpu"), torch.float32)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        loss = train_step(step_model, optimizer, scaler, Batches(), contextlib.nullcontext(), cfg, 0.1, rt)[0]
        return model.state_dict(), loss, said, step_model

    plain, plain_loss, _, _ = one_step(False)
    fell_back, loss, said, fallback = one_step(True)
    assert len(said) == 1 and "torch.compile failed (RuntimeError: BackendCompilerFailed" in said[0]
    assert fallback.compiled is None and torch.equal(loss, plain_loss)
    for name in plain:
        assert torch.equal(fell_back[name], plain[name]), name


def test_the_failed_attempts_activations_are_freed_before_the_step_is_computed_again():
    """The retry after a backward that failed to compile must not run while the failed attempt's activations are still
    held (by its traceback, had the retry run inside the except block): a run near its memory limit would run out of
    memory there instead of falling back. A weak reference to a tensor the failed forward saved for its backward is
    dead when the retry reads its first batch."""
    import weakref
    from types import SimpleNamespace
    from model import GPT, ModelConfig
    from training.device import CompileFallback
    from train import train_step

    saved = []

    class FailsInBackward(torch.autograd.Function):  # a stand-in for inductor failing on the backward graph
        @staticmethod
        def forward(ctx, x):
            ctx.activations = torch.ones(1000) * x.detach()  # what a compiled block saves for its backward
            saved.append(weakref.ref(ctx.activations))
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("BackendCompilerFailed: inductor: C++ compile error (stand-in)")

    alive_at_each_batch = []

    class Batches:
        def get_batch(self, split):
            alive_at_each_batch.append([ref() is not None for ref in saved])
            x = torch.arange(8).repeat(4, 1) % 11
            return x, x.roll(-1, 1)

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    said = []
    step_model = CompileFallback(model, lambda x, y: (None, FailsInBackward.apply(model(x, y)[1])), said.append)
    train_step(step_model, AdamW(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu", enabled=False), Batches(),
               contextlib.nullcontext(), SimpleNamespace(grad_accum_steps=1, grad_clip=1.0), 0.1,
               Runtime(torch.device("cpu"), torch.float32))
    assert len(said) == 1 and len(saved) == 1  # it failed, and fell back
    assert alive_at_each_batch == [[], [False]]  # the retry's batch: the failed attempt's tensor already freed


def test_the_samplers_host_numbers_reach_a_gpu_without_making_the_host_wait(monkeypatch):
    """A prefill's padding and the prompts' ids go to a GPU from pinned memory with non_blocking=True: a copy from
    pageable memory waits for every kernel queued before it, at every window slide of a long sample."""
    from model.generate import on_device
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pinned") or self)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: calls.append((args, kwargs)) or self)
    gpu = torch.device("cuda", 0)
    assert on_device([[0, 5], [6, 7]], gpu).tolist() == [[0, 5], [6, 7]]
    assert calls == ["pinned", ((gpu,), {"non_blocking": True})]


def test_a_refused_recompilation_of_the_decoding_step_reaches_the_caller_and_is_no_fallback():
    """The CUDA tests check that the compiled decoding step compiles once per shape with dynamo's error_on_recompile:
    its RecompileError must reach them, not be taken for a compiler's failure and decoded eagerly (the eager text,
    and the test passing, whatever the step did)."""
    from model import GPT, ModelConfig
    from model.generate import compiled_step, generate
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    torch.compiler.reset()
    said = []
    step = compiled_step("cpu", "eager", said.append)  # dynamo's capture without a compiler: the check is dynamo's
    generate(model, [[1, 2]], 6, temperature=0, step=step)
    with torch._dynamo.config.patch(error_on_recompile=True):
        generate(model, [[1, 2]], 6, temperature=0, step=step)  # the same shape: no recompilation
        with pytest.raises(torch._dynamo.exc.RecompileError):
            generate(model, [[1, 2], [3]], 6, temperature=0, step=step)  # two rows: a new shape, refused
    assert said == []
