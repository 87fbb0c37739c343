"""The Python API (hubconf.py, through torch.hub): the docs' example runs as written from a program outside the
checkout that has a module of its own named `model`, gives sample.py's text for the same settings, and leaves the
program's own module in place; a damaged checkpoint is a ValueError naming the problem."""
import re
import subprocess
import sys

import pytest

from conftest import ROOT, module_corpus, patient, run_script, train_debug


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    corpus = module_corpus(tmp_path_factory, "hubconf")
    out = corpus.parent / "run"
    train_debug(corpus, out, "--max_iters", "20")
    return out


@pytest.mark.slow
def test_the_docs_example_runs_from_a_program_elsewhere_and_matches_sample_py(run_dir, tmp_path):
    example = re.search(r"## From your own Python code.*?```python\n(.*?)```",
                        (ROOT / "docs" / "sampling.md").read_text(encoding="utf-8"), flags=re.S).group(1)
    assert len(example.strip().splitlines()) <= 5
    program = example.replace("path/to/chargpt/out/shakespeare_char_cpu-shakespeare", str(run_dir)).replace(
        "path/to/chargpt", str(ROOT)).replace("max_new_tokens=200", "max_new_tokens=60")
    program = "import model\n" + program + "print(model.MINE)\n"  # the program's own module named model
    (tmp_path / "model.py").write_text("MINE = 'the program keeps its own model module'\n")
    (tmp_path / "program.py").write_text(program)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "program.py"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=patient(120))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"TrainedRun('{run_dir / 'ckpt_best.safetensors'}', step ")
    assert lines[-1] == "the program keeps its own model module"
    text = "\n".join(lines[1:-1])
    sample = run_script("sample.py", "--out_dir", str(run_dir), "--prompt", "ROMEO:", "--max_new_tokens", "60",
                        "--seed", "1337", "--temperature", "0.8", "--stream")
    assert sample.returncode == 0 and sample.stdout.rstrip("\n") == "ROMEO:" + text


def test_a_damaged_checkpoint_is_a_value_error_with_the_scripts_reason(tmp_path):
    import torch

    (tmp_path / "ckpt_last.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="is not a readable checkpoint"):
        torch.hub.load(str(ROOT), "chargpt", str(tmp_path), source="local")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without CUDA")
def test_a_device_this_machine_lacks_is_said_as_such_not_as_damage(run_dir):
    import torch

    with pytest.raises(ValueError) as refused:
        torch.hub.load(str(ROOT), "chargpt", str(run_dir), source="local", device="cuda")
    assert str(refused.value) == (f"cannot load {run_dir / 'ckpt_best.safetensors'} onto cuda: CUDA is not available on this "
                                  f"machine (or this PyTorch is a CPU build); load it onto cpu")


def test_a_device_that_cannot_hold_the_weights_is_told_apart_from_a_damaged_file(run_dir, tmp_path, monkeypatch):
    """A copy onto a device failing (as bfloat16 weights onto an MPS without bfloat16) once the file has passed every
    check on the CPU: said to be the device's, naming its error; a truncated file is still called damaged."""
    import torch
    from common import machine
    from errors import UserError
    from training import checkpoint

    real_to = torch.Tensor.to

    def to_without_bfloat16_on_mps(self, *args, **kwargs):
        if args and str(args[0]) == "mps":
            raise TypeError("BFloat16 is not supported on MPS")
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to_without_bfloat16_on_mps)
    monkeypatch.setattr(machine, "unavailable", lambda place: None)  # as if this machine had MPS
    sound = run_dir / "ckpt_best.safetensors"
    with pytest.raises(UserError) as refused:
        checkpoint.load(sound, "mps")
    assert str(refused.value) == (f"{sound} is readable, but mps cannot hold its weights (TypeError: BFloat16 is not "
                                  f"supported on MPS); load it onto cpu")
    truncated = tmp_path / "ckpt.pt"
    truncated.write_bytes(sound.read_bytes()[:5000])
    with pytest.raises(UserError, match="is not a readable checkpoint .*it may be truncated"):
        checkpoint.load(truncated, "mps")


def test_batched_prompts_logits_score_and_to_agree_with_the_scripts_and_the_model(run_dir, tmp_path, script):
    """generate([prompts]) gives sample.py's batched texts; logits(text) is the model's forward pass; score(text) is
    evaluate.py's bits per character on a file holding text (its --json, to the last digit); to(dtype=bfloat16) casts
    the weights, as sample.py --dtype does."""
    import json
    import torch

    lm = torch.hub.load(str(ROOT), "chargpt", str(run_dir), source="local")
    prompts = ["ROMEO:", "What light", "O"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n", encoding="utf-8")
    batched = script("sample.py", "--out_dir", str(run_dir), "--prompt_file", str(tmp_path / "prompts.txt"),
                     "--prompts_per_line", "--no-stream", "--max_new_tokens", "30", "--seed", "7")
    texts = lm.generate(prompts, max_new_tokens=30, seed=7)
    assert isinstance(texts, list) and batched.stdout.rstrip("\n") == "\n---\n".join(
        prompt + text for prompt, text in zip(prompts, texts))
    assert lm.generate(prompts[:1], max_new_tokens=30, seed=7) == [lm.generate("ROMEO:", max_new_tokens=30, seed=7)]

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = "".join(ch for ch in text if ch in lm.tokenizer.stoi)[:2000]
    logits = lm.logits(text[:lm.model.config.block_size])
    with torch.inference_mode():
        expected = lm.model(torch.tensor([lm.tokenizer.encode(text[:lm.model.config.block_size])]))[0][0]
    assert logits.shape == (lm.model.config.block_size, len(lm.tokenizer.chars)) and torch.equal(logits, expected)
    with pytest.raises(ValueError, match="more than the model's block_size"):
        lm.logits(text)

    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    for stride in (None, 8):
        figures = tmp_path / f"figures-{stride}.json"
        done = script("evaluate.py", "--out_dir", str(run_dir), "--data", str(tmp_path / "text.txt"), "--split",
                      "all", "--json", str(figures), *(["--stride", str(stride)] if stride else []))
        assert done.returncode == 0, done.stderr
        assert lm.score(text, stride=stride) == json.loads(figures.read_text())["bits_per_char"]

    assert lm.to(dtype=torch.bfloat16) is lm and lm.model.wte.weight.dtype == torch.bfloat16
    assert lm.logits("ROMEO:").dtype == torch.float32 and len(lm.generate("ROMEO:", max_new_tokens=5)) == 5


@pytest.fixture(scope="module")
def lm(run_dir):
    import torch

    return torch.hub.load(str(ROOT), "chargpt", str(run_dir), source="local")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without CUDA")
def test_to_a_device_this_machine_lacks_is_one_line_and_leaves_the_model_where_it_was(lm):
    """to("cuda") without CUDA is the ValueError a load onto cuda gives (common.machine.usable_device), in to()'s
    words, not torch's AssertionError; a name that is no device says so; the model stays on the CPU."""
    with pytest.raises(ValueError) as refused:
        lm.to("cuda")
    assert str(refused.value) == ("cannot move the model to cuda: CUDA is not available on this machine (or this "
                                  "PyTorch is a CPU build); keep it on cpu")
    with pytest.raises(ValueError, match=r"^cannot move the model to 'gpu': not a device; give cpu, cuda"):
        lm.to("gpu")
    assert lm.model.wte.weight.device.type == "cpu" and lm.to("cpu") is lm


@pytest.mark.parametrize("keywords, error, words", [
    ({"max_new_tokens": -1}, ValueError, "max_new_tokens -1: must be at least 1"),
    ({"max_new_tokens": 0}, ValueError, "max_new_tokens 0: must be at least 1"),
    ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens 2.5: must be a whole number, not float"),
    ({"max_new_tokens": "5"}, TypeError, "max_new_tokens '5': must be a whole number, not str"),
    ({"max_new_tokens": True}, TypeError, "max_new_tokens True: must be a whole number, not bool"),
    ({"max_new_tokens": 2**63}, ValueError, f"max_new_tokens {2**63}: must be at most 2^40 (and fit in memory)"),
    ({"seed": None}, TypeError, "seed None: must be a whole number, not NoneType"),
    ({"seed": 1.5}, TypeError, "seed 1.5: must be a whole number, not float"),
    ({"seed": -1}, ValueError, "seed -1: must be a whole number from 0 to 2^64 - 1"),
    ({"seed": 2**64}, ValueError, f"seed {2**64}: must be a whole number from 0 to 2^64 - 1"),
    ({"temperature": "0.8"}, TypeError, "temperature '0.8': must be a number, not str"),
    ({"temperature": True}, TypeError, "temperature True: must be a number, not bool"),
    ({"top_k": 2.0}, TypeError, "top_k 2.0: must be a whole number, not float"),
    ({"top_k": True}, TypeError, "top_k True: must be a whole number, not bool"),
    ({"top_p": "0.9"}, TypeError, "top_p '0.9': must be a number, not str"),
    ({"temperature": float("inf")}, ValueError, "temperature inf: must be 0 (greedy) or a positive number, not "
                                                "infinite"),
    ({"bogus": 1}, TypeError, "generate() got an unexpected keyword argument 'bogus'; it takes the prompt, "
                              "max_new_tokens, seed, temperature, top_k, top_p"),
])
def test_generate_refuses_what_sample_py_refuses_in_one_line_naming_the_type_or_range(lm, keywords, error, words):
    """generate()'s length, seed and sampling options go through sample.py's checks (model.generate's
    check_length_and_seed and Sampling): a wrong type is a TypeError saying which type is wanted, a value out of
    range a ValueError, each the whole message, never an error from inside the generate loop or torch."""
    with pytest.raises(error) as refused:
        lm.generate("ROMEO:", **{"max_new_tokens": 5, **keywords})
    assert str(refused.value) == words


def test_generate_past_the_memory_is_a_memory_error_in_one_line(lm, monkeypatch):
    """A generate() that cannot fit in memory is a MemoryError naming the sizes and the way out: on a CPU checked
    before anything is drawn (100,000 prompts, or 10**12 new characters), where the memory would first fill with
    Python lists and the machine end the process; where the free memory is not known, when the allocator refuses
    (torch's 'can't allocate memory', here a stand-in). Other RuntimeErrors pass as they are."""
    import importlib
    with type(lm).generate.__globals__["_project"]():  # the hub's own copy of the project's modules
        generate = importlib.import_module("model.generate")
        machine = importlib.import_module("common.machine")
    real, machines = generate.generate, machine.free_memory

    def refused(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")
    for prompts, new, words in ((["ROMEO:", "O"], 10**12, "2 prompt(s) and 1,000,000,000,000"),
                                (["O"] * 10**5, 10**6, "100,000 prompt(s) and 1,000,000")):
        for free, drawing in ((machines, lambda *args, **kwargs: pytest.fail("drawn before the check")),
                              (lambda: None, refused)):  # checked first; where the free memory is unknown, allocated
            monkeypatch.setattr(machine, "free_memory", free)
            monkeypatch.setattr(generate, "generate", drawing)
            with pytest.raises(MemoryError) as refused_error:
                lm.generate(prompts, max_new_tokens=new)
            said = "do not fit on cpu" if free() is None else "would need about "
            assert str(refused_error.value).startswith(f"out of memory: {words} new characters {said}")
            assert str(refused_error.value).endswith("; ask for fewer max_new_tokens or fewer prompts")
    monkeypatch.setattr(generate, "generate", lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):
        lm.generate("ROMEO:", max_new_tokens=5)
    monkeypatch.setattr(generate, "generate", real)
    monkeypatch.setattr(machine, "free_memory", lambda: 10**5)  # a machine with 100 kB free: checked, not drawn
    with pytest.raises(MemoryError):
        lm.generate(["O"] * 1000, max_new_tokens=10)


def test_a_tuple_of_prompts_is_a_batch_like_a_list_and_other_types_are_named(lm):
    """A tuple of prompts is continued as the same list would be (a list back); a prompt that is no str, alone or in
    the batch, is a TypeError naming what is accepted."""
    prompts = ("ROMEO:", "O")
    assert lm.generate(prompts, max_new_tokens=8, seed=3) == lm.generate(list(prompts), max_new_tokens=8, seed=3)
    with pytest.raises(TypeError, match=r"^the prompt must be a str, or a list or tuple of them, not int$"):
        lm.generate(5)
    with pytest.raises(TypeError, match=r"^the prompt must be a str, not int$"):
        lm.generate(["ROMEO:", 5])


def test_score_checks_the_stride_as_evaluate_py_does(lm):
    """stride=0 (and one past block_size) is refused, as evaluate.py --stride 0 is (data.loader's check_stride), where
    it was taken for the default; a stride of another type is a TypeError."""
    text = "ROMEO: O " * 10
    block_size = lm.model.config.block_size
    for stride in (0, block_size + 1):
        with pytest.raises(ValueError) as refused:
            lm.score(text, stride=stride)
        assert str(refused.value) == f"stride {stride}: must be between 1 and the model's block_size, {block_size}"
    with pytest.raises(TypeError, match=r"^stride 2.5: must be a whole number, not float$"):
        lm.score(text, stride=2.5)
    assert lm.score(text, stride=block_size) == lm.score(text)


def test_a_missing_run_names_the_run_argument_and_a_pipe_is_not_called_an_empty_folder(run_dir, tmp_path):
    """The API's messages about the run name its own argument (run_folder.find's option), not the scripts' --out_dir
    flag; a FIFO given as the run is said to be no folder, for the API and the scripts alike."""
    import os
    import torch
    from common.run_folder import find
    from errors import UserError

    with pytest.raises(ValueError) as refused:
        torch.hub.load(str(ROOT), "chargpt", str(run_dir.parent / "nosuch"), source="local")
    assert f"runs with a model beside it: {run_dir}; give one as the run argument, or train: " in str(refused.value)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError) as refused:
        torch.hub.load(str(ROOT), "chargpt", str(fifo), source="local")
    assert str(refused.value) == (f"{fifo} is a pipe, socket or device, not a run folder; give a run folder as the "
                                  f"run argument")
    with pytest.raises(UserError, match=r"is a pipe, socket or device, not a run folder; give a run folder as "
                                        r"--out_dir$"):
        find(str(fifo), "")
    with pytest.raises(UserError) as refused:  # a script given a checkpoint file as its folder: the flag for a file
        find(str(run_dir / "ckpt_best.safetensors"), "")
    assert str(refused.value) == (f"{run_dir / 'ckpt_best.safetensors'} is a file, not a run folder; give a run folder as "
                                  f"--out_dir, or a checkpoint file as --ckpt {run_dir / 'ckpt_best.safetensors'}")
    with pytest.raises(UserError, match=r"^give --out_dir or --ckpt, not both$"):  # either could be meant: neither
        find(str(run_dir), str(run_dir / "ckpt_last.safetensors"))
