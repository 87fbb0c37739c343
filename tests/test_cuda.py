"""What only a GPU can check (skipped without CUDA): bfloat16 and float16 training with the scaler, torch.compile,
batches gathered from the GPU-resident corpus, and sampling with fixed shapes, no host sync and a compiled step."""
import pytest
import torch

from conftest import train_debug
from data import Batches
from model import GPT, ModelConfig
from model.generate import compiled_step, generate
from training import checkpoint
from training.opening import prepare_data

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_training_learns_and_resumes_exactly(corpus, tmp_path, dtype, optimizer):
    common = ("--device", "cuda:0", "--dtype", dtype, "--log_interval", "1", "--eval_interval", "10",
              "--optimizer", optimizer, "--lr_decay_iters", "20")  # the 20-step schedule for the run stopped at 10
    whole = train_debug(corpus, tmp_path / "whole", "--max_iters", "20", *common)
    train_debug(corpus, tmp_path / "parts", "--max_iters", "10", *common)
    resumed = train_debug(corpus, tmp_path / "parts", "--max_iters", "20", "--resume", *common)
    assert whole["history"][-1][1] < whole["history"][0][1]
    assert [loss for _, loss in resumed["history"]] == [loss for it, loss in whole["history"] if it > 10]
    state = checkpoint.load(tmp_path / "whole" / "ckpt_last.safetensors")
    assert (state["scaler"] is not None) == (dtype == "float16")  # float16 scales its loss, bfloat16 needs not


@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_a_compiled_run_matches_an_eager_one(corpus, tmp_path, scope):
    """Compiled on the GPU (inductor, Triton), and nothing fell back: a run whose compilation failed trains
    uncompiled, and would match the eager run exactly."""
    import train
    from configs import load_config
    common = ("--device", "cuda", "--dtype", "float32", "--max_iters", "10", "--log_interval", "1")
    eager = train_debug(corpus, tmp_path / "eager", "--compile", "false", *common)
    cfg, _, explicit = load_config(["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"),
                                    "--out_dir", str(tmp_path / "compiled"), "--compile", "true", "--compile_scope",
                                    scope, *common], False)
    messages = []
    compiled = train.train(cfg, explicit, say=messages.append)
    assert any(m.startswith("torch.compile (") for m in messages), messages
    assert not any("torch.compile failed" in m for m in messages), messages
    for (_, a), (_, b) in zip(eager["history"], compiled["history"], strict=True):
        assert a == pytest.approx(b, rel=1e-3)


def test_batches_from_the_resident_corpus_equal_those_read_from_disk(corpus, tmp_path):
    from configs import load_config
    cfg, _, _ = load_config(["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "c")], False)
    prepared = prepare_data(cfg, lambda message: None)
    on_gpu = Batches(prepared, 16, 4, "cuda", seed=5, resident=True)
    from_disk = Batches(prepared, 16, 4, "cuda", seed=5, resident=False)
    assert on_gpu.resident is not None
    for split in ("train", "val"):
        for a, b in zip(on_gpu.get_batch(split), from_disk.get_batch(split)):
            assert torch.equal(a, b) and a.device.type == "cuda"


@pytest.fixture
def sharp_model():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=17, block_size=24, n_layer=2, n_head=2, n_embd=16, position="rope"))
    for p in model.parameters():  # sharper than the initialisation, so greedy decoding is not trivially constant
        p.data.normal_(0, 0.3)
    return model.cuda().eval()


def test_sampling_on_the_gpu_equals_the_cpu_and_reads_back_once(sharp_model, host_reads, monkeypatch):
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8]]
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # float32 products as the CPU does them
    with host_reads() as reads:
        on_gpu = generate(sharp_model, prompts, 60, temperature=0)
    assert len(reads) == 1  # the tokens, once, at the end
    assert on_gpu == generate(sharp_model, prompts, 60, temperature=0, use_cache=False)
    assert on_gpu == generate(sharp_model.cpu(), prompts, 60, temperature=0)


@pytest.fixture
def graphs():
    """graphs() -> (CUDA graphs recorded, inductor's cudagraph_skips) since the fixture began: recordings counted by
    scripts/bench.py's GraphRecordings (graph trees' empty pool keeper left out), and a step that inductor could not
    put in a graph (a mutated input, a CPU tensor, ...) counts a skip and runs without one."""
    from bench import GraphRecordings
    from torch._dynamo.utils import counters
    counters.clear()
    with GraphRecordings() as recorded:
        yield lambda: (recorded.count, counters["inductor"]["cudagraph_skips"])


def test_the_compiled_decoding_step_is_compiled_once_and_agrees(sharp_model, graphs):
    """A padded batch of three rows, the window sliding, two calls: one compilation, one CUDA graph recorded and
    replayed after, nothing skipped or fallen back, the eager text."""
    torch.compiler.reset()
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8]]
    said = []
    step = compiled_step("cuda", warn=said.append)  # inductor with CUDA graphs
    eager = generate(sharp_model, prompts, 60, temperature=0)
    # (config.patch: undoing a pytest monkeypatch deletes the setting from dynamo's config, and the next test to set
    # it fails.)
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = [generate(sharp_model, prompts, 60, temperature=0, step=step) for _ in range(2)]
    assert said == [] and graphs() == (1, 0)
    assert compiled[0] == compiled[1] == eager


def test_sampling_with_bfloat16_weights_reads_back_once_and_compiles_once(sharp_model, host_reads, graphs):
    """sample.py's CUDA default: the weights cast to bfloat16 once, no autocast; the token loop still reads nothing
    back, and the compiled step (CUDA graphs) is compiled once and replays the same tokens on a second call."""
    model = sharp_model.to(torch.bfloat16)
    torch.compiler.reset()
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8]]
    with host_reads() as reads:
        eager = generate(model, prompts, 60, temperature=0)
    assert len(reads) == 1 and all(len(row) == 60 for row in eager)
    said = []
    step = compiled_step("cuda", warn=said.append)
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = [generate(model, prompts, 60, temperature=0, step=step) for _ in range(2)]
    assert said == [] and graphs() == (1, 0)
    assert compiled[0] == compiled[1]


def test_the_compiled_step_reuses_the_models_caches_and_the_text_is_a_fresh_caches(sharp_model, graphs):
    """generate() keeps a model's caches between calls of one shape, so the CUDA graph that reads them at fixed
    addresses is recorded once (sample.py --stream calls it once per row); what a call left there is never read."""
    torch.compiler.reset()
    said = []
    step = compiled_step("cuda", warn=said.append)
    generate(sharp_model, [[9] * 20, list(range(17))], 40, temperature=0, step=step)  # another text in the caches
    caches = sharp_model.decode_caches[1]
    prompts = [[1, 2, 3, 4, 5], [6]]
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = generate(sharp_model, prompts, 40, temperature=0, step=step)
    assert sharp_model.decode_caches[1] is caches
    assert said == [] and graphs() == (1, 0)  # recorded by the first call, replayed by the second
    sharp_model.decode_caches = None
    assert again == generate(sharp_model, prompts, 40, temperature=0)
