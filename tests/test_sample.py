"""Sampling: the KV cache changes nothing but speed, batching changes nothing per row, bad input is refused."""
import contextlib
import copy
import io
import os
import select
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import train
from configs import load_config
from errors import UserError, run_cli
from model import GPT, ModelConfig
from model.generate import compiled_step, draw, generate, logits_to_probs, one_token_step
from model.kv_cache import Decoding
from training.checkpoint import load_model
import sample as sample_cli
from conftest import ROOT, checkpoint_parts, patient, set_attention_path, write_checkpoint

CFG = ModelConfig(vocab_size=17, block_size=24, n_layer=2, n_head=2, n_embd=16)


@pytest.fixture(scope="module", params=["learned", "rope"])
def model(request):
    torch.manual_seed(0)
    m = GPT(ModelConfig(**{**CFG.to_dict(), "position": request.param})).eval()
    for p in m.parameters():  # sharper than the initialisation, so greedy decoding is not trivially constant
        p.data.normal_(0, 0.3)
    return m


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, small_text_module):
    tmp = tmp_path_factory.mktemp("sample")
    corpus = tmp / "corpus.txt"
    corpus.write_text(small_text_module, encoding="utf-8")
    cfg, _, explicit = load_config(["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp / "cache"),
                                    "--out_dir", str(tmp / "run"), "--max_iters", "200", "--eval_interval", "100"],
                                   False)
    train.train(cfg, explicit, say=lambda m: None)
    return tmp / "run"


@pytest.fixture(scope="module")
def small_text_module():
    from conftest import play_text
    return play_text(20000)


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
def test_cached_logits_equal_a_full_forward(model, attention):
    """A prefill of 9 columns, then one token at a time at its slot of a fixed 24-slot cache: each step's logits equal
    reading the whole (left-padded) window again, and each row's equal reading that row alone."""
    set_attention_path(model, attention)
    idx = torch.randint(0, 17, (3, 20), generator=torch.Generator().manual_seed(1))
    pad = torch.tensor([0, 7, 14])  # rows of 20, 13 and 6 real tokens; the third has none in the prefill
    state = Decoding.cached(2, 3, 2, 24, 8)
    state.pad, state.input_pos = pad, torch.arange(9)
    cached = [model(idx[:, :9], decoding=state)[0]]
    for t in range(9, 20):
        state.input_pos = torch.tensor([t])
        cached.append(model(idx[:, t:t + 1], decoding=state)[0])
    for t in range(14, 20):  # once every row has a real token: cached = the whole window read again = the row alone
        window, _ = model(idx[:, :t + 1], decoding=Decoding(pad=pad))
        torch.testing.assert_close(cached[t - 8], window, rtol=1e-5, atol=1e-5)
        for b, first in enumerate(pad.tolist()):
            alone, _ = model(idx[b:b + 1, first:t + 1])
            torch.testing.assert_close(window[b], alone[0, -1:], rtol=1e-5, atol=1e-5)
    set_attention_path(model, "sdpa")


def test_the_device_draw_is_torch_multinomial_token_for_token():
    """draw() (the exponential race, no host sync) picks what torch.multinomial picks from the same random stream."""
    probs = logits_to_probs(torch.randn(5, 40, generator=torch.Generator().manual_seed(0)) * 3, top_k=30)
    for seed in range(100):
        ours = draw(probs, torch.Generator().manual_seed(seed))
        torchs = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).squeeze(-1)
        assert torch.equal(ours, torchs)


def test_the_token_loop_reads_nothing_back_from_the_device(model, host_reads):
    """Nothing in the per-token loop waits for the device: one read at the end, however many tokens and windows."""
    counts = []
    for new_tokens in (3, 60):  # 60 slides the 24-token window four times
        with host_reads() as reads:
            generate(model, [[1, 2, 3], [4]], new_tokens, temperature=0.9, top_k=8, top_p=0.9,
                     generator=torch.Generator().manual_seed(0))
        counts.append(len(reads))
    assert counts == [1, 1]


@pytest.mark.parametrize("chunk", [1, 7])
def test_streamed_chunks_are_the_returned_tokens_in_order(model, chunk):
    got = []
    new = generate(model, [[1, 2, 3], [4]], 30, generator=torch.Generator().manual_seed(2), chunk=chunk,
                   on_tokens=lambda ids: got.append(ids.clone()))
    assert [c.size(1) for c in got] == [chunk] * (30 // chunk) + ([30 % chunk] if 30 % chunk else [])
    assert torch.cat(got, dim=1).tolist() == new


def test_cached_decoding_equals_full_recompute_past_block_size(run_dir):
    trained, tokenizer, _ = load_model(run_dir / "ckpt_last.safetensors")  # block_size 32
    prompts = [tokenizer.encode("The"), tokenizer.encode("First Citizen:\nBefore we proceed any")]
    cached = generate(trained, prompts, 100, temperature=0)
    uncached = generate(trained, prompts, 100, temperature=0, use_cache=False)
    assert cached == uncached and all(len(row) == 100 for row in cached)
    assert len(set(cached[0])) > 3  # a real text, not one repeated character
    seeded = [generate(trained, prompts, 100, temperature=1.0, generator=torch.Generator().manual_seed(0),
                       use_cache=use_cache) for use_cache in (True, False)]
    assert seeded[0] == seeded[1]


def test_each_row_of_a_padded_batch_equals_generating_it_alone(model):
    prompts = [[4], [1, 2, 3, 4, 5, 6, 7], [9, 9, 2, 0], list(range(16)) * 2]
    batched = generate(model, prompts, 40, temperature=0)
    assert batched == [generate(model, [p], 40, temperature=0)[0] for p in prompts]


def test_the_caches_are_allocated_once_per_model_and_what_they_held_before_is_never_read(model):
    def fixed_shapes(m, ids, state):  # any step but the eager one reads the whole cache, as on a GPU
        return one_token_step(m, ids, state)
    fresh, prompts = copy.deepcopy(model), [[3, 1], [5, 6, 7, 8, 9]]
    for step in (one_token_step, fixed_shapes):
        model.decode_caches = None
        generate(model, [[9] * 20, list(range(17))], 30, temperature=0, step=step)  # the caches hold another text
        caches = model.decode_caches[1]
        again = generate(model, prompts, 30, temperature=0, step=step)
        assert model.decode_caches[1] is caches and all(c.keys.abs().sum() > 0 for c in caches)  # the same tensors
        fresh.decode_caches = None
        assert again == generate(fresh, prompts, 30, temperature=0, step=step)  # as from new caches
    generate(model, [[1]], 5)  # another batch size: its caches replace the old ones
    assert model.decode_caches[0][0] == 1 and model.decode_caches[1][0].keys.size(0) == 1


def test_same_seed_same_text_and_another_seed_another(model):
    def draw(seed):
        return generate(model, [[1, 2]], 50, temperature=1.0, top_k=10, generator=torch.Generator().manual_seed(seed))
    assert draw(5) == draw(5) and draw(5) != draw(6)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_sampling_at_a_temperature_draws_from_the_softmax_of_the_logits_over_it(model, temperature):
    """generate() at a temperature other than 0 and 1 draws each token as torch.multinomial does from
    softmax(logits / temperature) of the whole context read afresh, with the same random stream: written here
    without the sampler's functions (a sampler that ignored the temperature would draw other tokens)."""
    prompt, n = [1, 2, 3], 15  # within the 24-token window: no slide

    def reference(seed: int, temperature: float) -> list[int]:
        stream, ids = torch.Generator().manual_seed(seed), list(prompt)
        with torch.no_grad():
            for _ in range(n):
                logits = model(torch.tensor([ids]))[0][:, -1]  # (1, vocab)
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                ids.append(int(torch.multinomial(probs, 1, generator=stream)))
        return ids[len(prompt):]

    for seed in range(4):
        ours = generate(model, [prompt], n, temperature=temperature, generator=torch.Generator().manual_seed(seed))
        assert ours[0] == reference(seed, temperature)
    assert any(reference(seed, temperature) != reference(seed, 1.0) for seed in range(4))  # the temperature tells


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.05, 0.2, 0.25]]))
    assert logits_to_probs(logits, top_k=2).nonzero()[:, 1].tolist() == [0, 3]
    probs = logits_to_probs(logits, top_p=0.7)  # 0.5 + 0.25 reaches 0.7: keep those two, renormalised
    torch.testing.assert_close(probs, torch.tensor([[0.5 / 0.75, 0.0, 0.0, 0.25 / 0.75]]))
    torch.testing.assert_close(logits_to_probs(logits, temperature=1.0), torch.tensor([[0.5, 0.05, 0.2, 0.25]]))
    assert logits_to_probs(logits, top_p=0.1).nonzero()[:, 1].tolist() == [0]  # the top token always stays


# --- the command line ------------------------------------------------------------------------------
def sample(*args):
    """scripts/sample.py run in this process (no interpreter and torch start-up per call): exit code and output."""
    out, err = io.StringIO(), io.StringIO()
    device = [] if "--device" in args else ["--device", "cpu"]  # the checkpoints here were trained on a CPU
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(sample_cli.main, [*args, *device])
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.mark.parametrize("samples", [1, 3])
def test_cli_is_deterministic_and_streaming_prints_the_same_text(run_dir, samples):
    """The same seed gives the same text streamed or not, one sample or several (a command's text does not depend on
    whether its output goes to a terminal or a file), and greedy decoding repeats itself."""
    common = ("--out_dir", str(run_dir), "--prompt", "The", "--max_new_tokens", "40", "--seed", "3", "--num_samples",
              str(samples))
    plain = sample(*common, "--no-stream")
    streamed = sample(*common, "--stream")
    parts = plain.stdout.removesuffix("\n").split("\n---\n")
    assert plain.returncode == 0 and len(parts) == samples and all(len(p) == 3 + 40 and p[:3] == "The" for p in parts)
    assert len(set(parts)) == samples  # (several samples of one prompt differ)
    assert streamed.stdout == plain.stdout and sample(*common).stdout == plain.stdout
    greedy = [sample(*common, "--temperature", "0").stdout for _ in range(2)]
    assert greedy[0] == greedy[1]


@pytest.mark.slow
def test_one_sample_into_a_pipe_is_streamed_so_head_ends_it(run_dir):
    """`sample.py --max_new_tokens 100000000 | head -c 100` (hours of drawing): one sample unasked is streamed into a
    pipe too, so its first characters arrive at once and the command ends, quietly with 141, when the reader leaves;
    a batch would draw every character before printing one."""
    one = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "sample.py"), "--out_dir", str(run_dir), "--device",
                            "cpu", "--num_threads", "1", "--max_new_tokens", "100000000"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    try:
        got = b""
        while len(got) < 100:  # (a batch would print nothing for hours: waited for a minute at most)
            assert select.select([one.stdout], [], [], patient(15))[0], "nothing printed"
            got += os.read(one.stdout.fileno(), 100 - len(got))
        one.stdout.close()  # the reader leaves
        assert one.wait(timeout=patient(60)) == 141
        assert "Traceback" not in one.stderr.read().decode()
    finally:
        one.kill()
        one.wait()


@pytest.mark.parametrize("stream, samples", [(False, 2), (True, 1), (True, 2)])
def test_a_stopped_sampling_prints_the_characters_drawn_so_far(run_dir, monkeypatch, stream, samples):
    """Ctrl-C (or SIGTERM) while the samples are drawn prints every row as far as it was drawn, the same characters
    the whole run gives first, then one line saying so, exit 130: nothing drawn is lost, streamed (the first sample
    printed as it is drawn, the line ended where it stopped) or not (--no-stream, the default into a file). A stop
    before the first character prints each prompt alone."""
    common = ("--out_dir", str(run_dir), "--prompt", "The", "--num_samples", str(samples), "--max_new_tokens", "40",
              "--seed", "3", "--stream" if stream else "--no-stream")
    whole = sample(*common).stdout.removesuffix("\n").split("\n---\n")

    def stopped_after(chunks: int):
        def drawing(*args, on_tokens=None, **kwargs):  # the real drawing, stopped as by Ctrl-C after `chunks` chunks
            seen = []
            if on_tokens and not chunks:
                raise KeyboardInterrupt

            def hand_on(ids):
                on_tokens(ids)
                seen.append(ids)
                if len(seen) == chunks:
                    raise KeyboardInterrupt
            return generate(*args, on_tokens=on_tokens and hand_on, **kwargs)  # (the thread count's timing: as is)
        return drawing
    monkeypatch.setattr(sample_cli, "generate", stopped_after(7))  # (one character a chunk on a CPU)
    stopped = sample(*common)
    assert stopped.returncode == 130
    assert stopped.stdout.removesuffix("\n").split("\n---\n") == [row[:len("The") + 7] for row in whole]
    each = " of each sample" if samples > 1 else ""
    assert stopped.stderr.endswith(f"\nstopped after 7 of the 40 new characters{each}; those are printed\n")
    monkeypatch.setattr(sample_cli, "generate", stopped_after(0))
    assert sample(*common).stdout == "\n---\n".join(["The"] * samples) + "\n" and whole[0] != "The"


def test_cli_batches_prompts_per_line(run_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The\nCitizen:\nI\n")
    out = sample("--out_dir", str(run_dir), "--prompt_file", str(prompts), "--prompts_per_line",
                 "--max_new_tokens", "20", "--temperature", "0").stdout
    parts = out.removesuffix("\n").split("\n---\n")  # the samples, then print's newline
    assert [p[:len(q)] for p, q in zip(parts, ["The", "Citizen:", "I"])] == ["The", "Citizen:", "I"]
    alone = sample("--out_dir", str(run_dir), "--prompt", "Citizen:", "--max_new_tokens", "20", "--temperature", "0")
    assert alone.stdout.removesuffix("\n") == parts[1] and len(parts[1]) == len("Citizen:") + 20
    prompts.write_text("The\nCitizen:\nI\n", encoding="utf-8-sig")  # Notepad's UTF-8: a byte-order mark first
    assert sample("--out_dir", str(run_dir), "--prompt_file", str(prompts), "--prompts_per_line", "--max_new_tokens",
                  "20", "--temperature", "0").stdout == out


def test_unknown_prompt_characters(run_dir):
    refused = sample("--out_dir", str(run_dir), "--prompt", "The™ ✓")
    assert refused.returncode == 2 and "'™' '✓'" in refused.stderr and "--unknown skip" in refused.stderr
    skipped = sample("--out_dir", str(run_dir), "--prompt", "The™", "--unknown", "skip", "--max_new_tokens", "5")
    assert skipped.returncode == 0 and skipped.stdout.startswith("The") and "skipped 1" in skipped.stderr


@pytest.mark.slow
def test_the_cpu_compiled_step_gives_the_eager_text_and_compiles_once():
    """compiled_step("cpu") as shipped (inductor, the real compiler: weights frozen, C++ matrix products), on the
    presets' rotary model: greedy and seeded, batched with left padding and past the window's slide, the same tokens
    as eager; a second call does not recompile."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(**{**CFG.to_dict(), "position": "rope"})).eval()
    for p in model.parameters():  # sharp, as the module's model fixture makes them
        p.data.normal_(0, 0.3)
    torch.compiler.reset()
    said = []
    step = compiled_step("cpu", warn=said.append)
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8]]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for settings in ({"temperature": 0}, {"generator": torch.Generator().manual_seed(3)}):
            compiled = generate(model, prompts, 60, step=step, **settings)
            if "generator" in settings:
                settings["generator"].manual_seed(3)
            assert compiled == generate(model, prompts, 60, **settings)
    assert said == []  # compiled, not fallen back to eager


def weight_casts(n_embd: int):
    """with weight_casts(n) as casts: ... -> casts lists every float32 tensor of a weight matrix's size (n x n or
    more) converted to another dtype: autocast does it to every weight at every step, a cast model never again."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.to) and args[0].dtype == torch.float32 \
                    and out.dtype != torch.float32 and args[0].numel() >= n_embd * n_embd:
                self.seen.append(tuple(args[0].shape))
            return out
    return Casts()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sampling_in_half_precision_casts_each_weight_once_not_at_every_character(run_dir, dtype):
    """sample.py --dtype bfloat16|float16 holds the weights in that dtype (cast at load) and decodes without autocast,
    which would read and cast every float32 weight again for each new character (what the count checks)."""
    n_embd = load_model(run_dir / "ckpt_last.safetensors")[0].config.n_embd
    counts, texts = [], []
    for new_tokens in (10, 30):
        with weight_casts(n_embd) as casts:
            result = sample("--out_dir", str(run_dir), "--dtype", dtype, "--prompt", "The", "--temperature", "0",
                            "--max_new_tokens", str(new_tokens), "--no-stream")
        assert result.returncode == 0, result.stderr
        counts.append(len(casts.seen))
        texts.append(result.stdout)
    assert counts[0] == counts[1] > 0  # the load's casts, whatever the length of the text
    assert len(texts[1]) == 3 + 30 + 1 and texts[1].startswith(texts[0][:-1])  # greedy: the longer text goes on
    with weight_casts(n_embd) as casts, torch.autocast("cpu", dtype=torch.bfloat16):
        generate(load_model(run_dir / "ckpt_last.safetensors")[0], [[1, 2]], 10, temperature=0)
    assert len(casts.seen) > 10 * counts[0] // 2  # autocast, for comparison: weights cast again at each character


@pytest.mark.parametrize("has_units", [True, False])
def test_auto_samples_a_large_model_in_bfloat16_only_on_a_cpu_with_bfloat16_units(run_dir, monkeypatch, has_units):
    """--dtype auto on a CPU: for a model above the size limit (lowered below this toy's size) on a CPU with bfloat16
    units, the weights are cast to bfloat16 and the text is --dtype bfloat16's; elsewhere nothing is cast and the
    text is --dtype float32's. The line before the text says which."""
    from common import machine
    params = load_model(run_dir / "ckpt_last.safetensors")[0].num_params(non_embedding=False)
    monkeypatch.setattr(machine, "CPU_BFLOAT16_SAMPLING_PARAMS", params - 1)
    monkeypatch.setattr(machine, "cpu_has_bfloat16_units", lambda: has_units)
    common = ("--out_dir", str(run_dir), "--prompt", "The", "--max_new_tokens", "60", "--seed", "5", "--no-stream")
    with weight_casts(load_model(run_dir / "ckpt_last.safetensors")[0].config.n_embd) as casts:
        auto = sample(*common)
    dtype = "bfloat16" if has_units else "float32"
    assert auto.returncode == 0 and auto.stdout == sample(*common, "--dtype", dtype).stdout
    assert f"sampling on cpu in {dtype}\nthreads: " in auto.stderr and (len(casts.seen) > 0) == has_units
    monkeypatch.setattr(machine, "CPU_BFLOAT16_SAMPLING_PARAMS", params)  # a model of just the limit: float32
    assert "sampling on cpu in float32\nthreads: " in sample(*common).stderr


@pytest.mark.parametrize("args, message", [
    (["--top_p", "1.5"], "--top_p 1.5: must be in (0, 1]"),
    (["--top_p", "0"], "--top_p 0.0: must be in (0, 1]"),
    (["--temperature", "-1"], "--temperature -1.0: must be 0 (greedy) or a positive number, not infinite"),
    (["--temperature", "inf"], "--temperature inf: must be 0 (greedy) or a positive number, not infinite"),
    (["--temperature", "nan"], "--temperature nan: must be 0 (greedy) or a positive number, not infinite"),
    (["--top_k", "0"], "--top_k 0: must be at least 1"),
    (["--max_new_tokens", "0"], "--max_new_tokens 0: must be at least 1"),
    (["--num_samples", "0"], "--num_samples 0: must be at least 1"),
    (["--seed", "-1"], "--seed -1: must be a whole number from 0 to 2^64 - 1"),
    (["--prompt", ""], "--prompt is empty"),
])
def test_invalid_settings(run_dir, args, message):
    result = sample("--out_dir", str(run_dir), *args)
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1


def test_bad_checkpoints_are_one_line_errors(run_dir, tmp_path):
    good = (run_dir / "ckpt_last.safetensors").read_bytes()
    cases = {"missing.pt": None, "random.pt": bytes(range(256)) * 40, "truncated.pt": good[: len(good) // 2]}
    future = tmp_path / "future.pt"
    tensors, settings = checkpoint_parts(run_dir / "ckpt_last.safetensors")
    write_checkpoint(future, tensors, {**settings, "format": 99})
    inconsistent = tmp_path / "inconsistent.pt"
    write_checkpoint(inconsistent, tensors, {**settings, "vocab": settings["vocab"][:-1]})
    write_checkpoint(tmp_path / "no_vocab.pt", tensors, {k: v for k, v in settings.items() if k != "vocab"})
    write_checkpoint(tmp_path / "bad_config.pt", tensors,
                     {**settings, "model_config": {**settings["model_config"], "n_head": 5}})
    for name, content in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
    expected = {"missing.pt": "no checkpoint at", "random.pt": "not a readable checkpoint",
                "truncated.pt": "not a readable checkpoint", "future.pt": "format 99",
                "inconsistent.pt": "inconsistent", "no_vocab.pt": "missing vocab",
                "bad_config.pt": "inconsistent model config"}
    for name, message in expected.items():
        result = sample("--ckpt", str(tmp_path / name))
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, name
        assert result.stderr.count("\n") == 1


@pytest.mark.slow
def test_a_decoding_step_that_fails_to_compile_warns_once_and_gives_the_same_text(model):
    torch.compiler.reset()

    def broken(graph, inputs):  # as a machine without a C++ compiler would fail
        raise RuntimeError("no compiler")
    said = []
    text = generate(model, [[1, 2]], 40, temperature=0, step=compiled_step("cpu", broken, said.append))
    assert text == generate(model, [[1, 2]], 40, temperature=0)
    assert said == ["warning: compiling the decoding step failed (RuntimeError: no compiler); sampling without it "
                    "(leave out --compile)"]


def test_help_shows_the_value_each_option_takes_when_left_out():
    """sample.py --help (and every script's, through errors.HelpFormatter) names each option's default, read from
    the parser itself, so the help and the code cannot disagree."""
    parser = sample_cli.build_parser()
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False, "", "==SUPPRESS=="):
            assert f"(default: {action.default})" in text or "(default:" in (action.help or ""), action.dest
    assert "(default: 0.8)" in text and "(default: 500)" in text and "(default: 1337)" in text


def test_with_no_folder_named_the_scripts_read_the_newest_run_in_out(run_dir, tmp_path, monkeypatch, capsys):
    """After `python train.py`, `python scripts/sample.py` needs no --out_dir (whose name depends on the corpus the run
    could reach): it reads the run in out/ whose model was written last; with no run in out/, one line says so."""
    import os
    import shutil

    from common import run_folder

    monkeypatch.chdir(tmp_path)
    with pytest.raises(run_folder.UserError, match="out/ holds no run yet: train one first"):
        run_folder.find("", "")
    for name in ("older", "newer"):
        shutil.copytree(run_dir, tmp_path / "out" / name)
    os.utime(tmp_path / "out" / "older" / "ckpt_best.safetensors", (1, 1))
    os.utime(tmp_path / "out" / "older" / "ckpt_last.safetensors", (1, 1))
    assert run_folder.find("", "") == Path("out") / "newer" / "ckpt_best.safetensors"
    assert run_cli(sample_cli.main, ["--max_new_tokens", "5"]) == 0
    assert "newer" in capsys.readouterr().err


def test_nanogpts_sample_flags_are_understood(run_dir, tmp_path, script):
    """nanoGPT's sample.py habits: --start=FILE:path (and --prompt FILE:path) reads the prompt from the file, as
    --prompt_file does; --compile=False in any case is --no-compile; --init_from=resume is what this sampler does, and
    gpt2 is refused in one line."""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("ROMEO:\nWhat", encoding="utf-8")
    common = ("--out_dir", str(run_dir), "--max_new_tokens", "40", "--seed", "5", "--stream=false")
    reference = script("sample.py", *common, "--prompt_file", str(prompt), "--no-compile")
    assert reference.returncode == 0 and reference.stdout.startswith("ROMEO:\nWhat"), reference.stderr
    for habit in (["--start=FILE:" + str(prompt), "--compile=False", "--init_from=resume"],
                  ["--prompt", "FILE:" + str(prompt), "--compile", "FALSE"]):
        run = script("sample.py", *common, *habit)
        assert run.returncode == 0 and run.stdout == reference.stdout, (habit, run.stderr)
    refused = script("sample.py", *common, "--init_from=gpt2")
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1].startswith(
        "error: --init_from gpt2: only resume works here; give --out_dir RUN or --ckpt FILE")
    assert script("sample.py", *common, "--compile=perhaps").stderr.strip() == (
        "error: argument --compile: expected true or false, got 'perhaps'")
    missing = tmp_path / "no_such_prompt.txt"  # its message names the flag as given, not --prompt_file
    assert script("sample.py", *common, "--start=FILE:" + str(missing)).stderr.startswith(
        f"error: --prompt FILE:{missing}: no such file")


def test_a_prompt_file_is_read_only_as_a_small_regular_utf8_file_and_each_refusal_says_why(run_dir, tmp_path, capsys):
    """--prompt_file (and --prompt FILE:) is opened only as a regular file: a named pipe is refused at once (it used to
    wait for a writer for ever) and /dev/zero is refused unread (it used to fill the memory until the process was
    killed); a file beyond PROMPT_MAX_BYTES, a missing file and bytes that are not UTF-8 each get their own line, and
    --prompts_per_line without a prompt file is refused instead of ignored. Each is exit 2 before any model loads."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(sample_cli.PROMPT_MAX_BYTES + 1)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café au lait".encode("latin-1"))
    common = ["--out_dir", str(run_dir), "--max_new_tokens", "3"]
    for args, line in (
            (["--prompt_file", str(fifo)], f"the prompt file {fifo}: not a regular file (a device, pipe or socket)"),
            (["--prompt", f"FILE:{fifo}"], f"the prompt file {fifo}: not a regular file (a device, pipe or socket)"),
            (["--prompt_file", "/dev/zero", "--prompts_per_line"], "the prompt file /dev/zero: not a regular file"),
            (["--prompt_file", str(tmp_path)], f"the prompt file {tmp_path} is a folder, not a file; give a file"),
            (["--prompt_file", str(big)], f"the prompt file {big} is {sample_cli.PROMPT_MAX_BYTES + 1:,} bytes, "
                                          f"more than the {sample_cli.PROMPT_MAX_BYTES:,} such a file can hold; give "
                                          f"the start of the text"),
            (["--prompt_file", "/proc/self/status"], "the prompt file /proc/self/status is a /proc or /sys file (its "
                                                     "size reads 0); copy it to a file first"),
            (["--prompt_file", str(tmp_path / "none.txt")], f"--prompt_file {tmp_path / 'none.txt'}: no such file"),
            (["--prompt_file", str(latin)], f"--prompt_file {latin}: not UTF-8 text: byte 0xe9 at position 3 "
                                            f"cannot be decoded; save it as UTF-8"),
            (["--prompts_per_line"], "--prompts_per_line needs --prompt_file; give one")):
        assert run_cli(sample_cli.main, common + args) == 2, args
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"error: {line}") and len(err.splitlines()) == 1, (args, err)


def test_the_sampling_options_are_declared_once_for_the_command_line_and_the_python_api():
    """sample.py's --temperature, --top_k and --top_p are model/generate.py's Sampling fields, with their defaults;
    a value out of range is refused by the same check everywhere: sample.py's one line names the flag, the Python
    API's ValueError the option."""
    from dataclasses import fields
    from model.generate import Sampling
    defaults = vars(sample_cli.build_parser().parse_args([]))
    assert {f.name: f.default for f in fields(Sampling)} == {name: defaults[name] for name in ("temperature", "top_k",
                                                                                            "top_p")}
    for option, value in (("temperature", -1.0), ("top_k", 0), ("top_p", 1.5)):
        with pytest.raises(ValueError) as refused:
            Sampling(**{option: value})
        args = sample_cli.build_parser().parse_args([f"--{option}", str(value)])
        with pytest.raises(UserError) as said:
            sample_cli.check_settings(args)
        assert str(refused.value).startswith(f"{option} {value}: ") and str(said.value) == f"--{refused.value}"
