"""Faults and bad input are one line and exit 2, with nothing lost: a full disk, unwritable places, damaged caches
and checkpoints, out of memory, and command-line values that Python or torch would answer with a traceback."""
import contextlib
import errno
import io
import json
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import train
from conftest import ROOT, checkpoint_parts, module_corpus, patient, play_text, write_checkpoint
from common.machine import Runtime
from configs import load_config
from data import prepare, resolve
from errors import UserError, run_cli
from training import checkpoint

import attention_map
import bench
import bench_prepare
import plot_run
import sample as sample_cli


def one_line_error(capsys, main, *args, words=""):
    code = run_cli(main, list(args))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert words in err, err
    return err


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished debug run on a small corpus, its corpus and cache beside it (copy before changing)."""
    tmp = module_corpus(tmp_path_factory, "faults").parent
    cfg, _, explicit = load_config(["--config", "debug", "--data", str(tmp / "corpus.txt"), "--cache_dir",
                                    str(tmp / "cache"), "--out_dir", str(tmp / "run"), "--max_iters", "10"], False)
    train.train(cfg, explicit, say=lambda m: None)
    return tmp / "run"


def train_args(run, out_dir, *extra):
    return ["--config", "debug", "--data", str(run.parent / "corpus.txt"), "--cache_dir", str(run.parent / "cache"),
            "--out_dir", str(out_dir), *extra]


def limited_file_size(limit):
    def apply():  # in the child: writes past `limit` bytes fail with EFBIG, as a full disk fails them with ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_or_preparing_is_one_line_and_loses_nothing(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    before = (out / "ckpt_last.safetensors").read_bytes()
    limit = len(before) // 2  # an event file fits, a checkpoint does not
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *train_args(run, out, "--resume", "--max_iters",
                             "30")], capture_output=True, text=True, timeout=patient(120), preexec_fn=limited_file_size(limit))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "could not write checkpoint" in result.stderr and "previous checkpoint is untouched" in result.stderr
    assert (out / "ckpt_last.safetensors").read_bytes() == before and not list(out.glob("*.tmp-*"))

    big = tmp_path / "big.txt"
    big.write_text("some text to prepare\n" * 20000)
    cache = tmp_path / "cache"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "prepare.py"), "--data", str(big), "--cache_dir",
                             str(cache)], capture_output=True, text=True, timeout=patient(60),
                            preexec_fn=limited_file_size(100_000))
    assert result.returncode == 2 and result.stderr.startswith("error: could not write the token cache")
    assert result.stderr.count("\n") == 1 and not [p for p in (cache / "prepared").iterdir()]


def test_failed_writes_of_events_or_summary_keep_the_checkpoints(run, tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter
    from common import run_folder
    out = tmp_path / "run"
    shutil.copytree(run, out)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    cfg, _, explicit = load_config(train_args(run, out, "--resume", "--max_iters", "20"), False)
    with monkeypatch.context() as patch:
        patch.setattr(SummaryWriter, "add_scalar", no_space)
        with pytest.raises(train.UserError, match="could not write TensorBoard events .*No space left on device"):
            train.train(cfg, explicit, say=lambda m: None)
    assert checkpoint.load(out / "ckpt_last.safetensors")["iter"] == 10
    summary = (out / "summary.json").read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(run_folder.os, "fsync", no_space)  # every atomic write fails: checkpoints and summary alike
        cfg, _, explicit = load_config(train_args(run, out, "--resume", "--max_iters", "20"), False)
        with pytest.raises(train.UserError, match="No space left on device.*previous checkpoint is untouched"):
            train.train(cfg, explicit, say=lambda m: None)
    assert (out / "summary.json").read_bytes() == summary and not list(out.glob("*.tmp-*"))



def test_unwritable_or_wrong_places_are_refused_before_anything_runs(run, tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    one_line_error(capsys, train.main, *train_args(run, a_file), words="is a file, not a folder")
    one_line_error(capsys, train.main, *train_args(run, tmp_path / "r", "--cache_dir", str(a_file)),
                   words="--cache_dir")
    corpus_dir = tmp_path / "texts"
    corpus_dir.mkdir()
    shutil.copy(run.parent / "corpus.txt", corpus_dir)
    one_line_error(capsys, train.main, "--config", "debug", "--data", str(corpus_dir), "--out_dir",
                   str(corpus_dir / "run"), words="inside the --data folder")
    assert not (corpus_dir / "run").exists()
    real_open = train.RunDir.claim.__globals__["os"].open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(train.RunDir.claim.__globals__["os"], "open", read_only)
        one_line_error(capsys, train.main, *train_args(run, tmp_path / "ro"), words="Read-only file system")
    unreadable = tmp_path / "secret.txt"
    unreadable.write_text("text")

    def denied(path, *args, **kwargs):  # (the suite may run as root, whom no file's permissions stop)
        if str(path) == str(unreadable):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(train.RunDir.claim.__globals__["os"], "open", denied)
    one_line_error(capsys, train.main, "--config", "debug", "--data", str(unreadable), "--out_dir",
                   str(tmp_path / "r2"), "--cache_dir", str(tmp_path / "c2"), words="Permission denied")


def test_damaged_cache_entries_are_rebuilt_identically(run, tmp_path):
    corpus = resolve(str(run.parent / "corpus.txt"), tmp_path)
    fresh = prepare(corpus, tmp_path / "cache")
    files = {name: (fresh.dir / name).read_bytes() for name in ("meta.json", "train.bin", "val.bin")}
    meta = json.loads(files["meta.json"])
    damages = {
        "empty meta": lambda d: (d / "meta.json").write_text(""),
        "garbage meta": lambda d: (d / "meta.json").write_text("{not json"),
        "meta without vocab": lambda d: (d / "meta.json").write_text(json.dumps({k: v for k, v in meta.items()
                                                                                 if k != "vocab"})),
        "truncated train.bin": lambda d: (d / "train.bin").write_bytes(files["train.bin"][:100]),
        "missing val.bin": lambda d: (d / "val.bin").unlink(),
        "ids beyond the vocabulary": lambda d: (d / "train.bin").write_bytes(b"\xff" + files["train.bin"][1:]),
    }
    for what, damage in damages.items():
        damage(fresh.dir)
        notes = []
        again = prepare(corpus, tmp_path / "cache", say=notes.append)
        assert not again.reused and len(notes) == 1 and "damaged" in notes[0], what
        assert {name: (again.dir / name).read_bytes() for name in files} == files, what
        assert prepare(corpus, tmp_path / "cache").reused  # and it stays repaired


def test_damaged_checkpoints_are_refused_by_name(run, tmp_path, capsys):
    tensors, state = checkpoint_parts(run / "ckpt_last.safetensors")
    nan = {**tensors, "model.wte.weight": torch.full_like(tensors["model.wte.weight"], float("nan"))}

    def without(prefix: str) -> dict:
        return {name: t for name, t in tensors.items() if not name.startswith(prefix)}
    cases = {  # what --resume needs; what both need
        "no_optimizer": (without("optimizer."), {k: v for k, v in state.items() if k != "optimizer"},
                         "missing optimizer", True),
        "no_rng": (without("rng."), {k: v for k, v in state.items() if k != "rng"}, "missing rng", True),
        "no_best": (tensors, {k: v for k, v in state.items() if k != "best_val_loss"}, "missing best_val_loss", True),
        "bad_rng": (without("rng.torch"), state, "rng.torch: the settings give (5056,)", False),
        "config_type": (tensors, {**state, "run_config": {**state["run_config"], "learning_rate": "fast"}},
                        "learning_rate = 'fast' should be of type float", False),  # every reader checks types
        "config_value": (tensors, {**state, "run_config": {**state["run_config"], "batch_size": -1}},
                         "--batch_size -1", True),
        "iter_float": (tensors, {**state, "iter": 3.5}, "iter is 3.5", False),
        "later_type": (tensors, {**state, "evals_since_best": "three"}, "evals_since_best is 'three'", False),
        "nan": (nan, state, "not finite (NaN or inf in wte.weight)", False),
    }
    for name, (held, settings, words, resume_only) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        write_checkpoint(folder / "ckpt_last.safetensors", held, settings)
        one_line_error(capsys, train.main, "--out_dir", str(folder), "--resume", "--max_iters", "20", words=words)
        if resume_only:
            assert run_cli(sample_cli.main, ["--out_dir", str(folder), "--max_new_tokens", "5"]) == 0
        else:
            one_line_error(capsys, sample_cli.main, "--out_dir", str(folder), words=words)
        capsys.readouterr()


@contextlib.contextmanager
def address_space_of(extra_bytes: int):
    """This process may map only extra_bytes more memory: an allocation past that fails at once, as on a machine that
    has no more, whatever this machine has (where memory is overcommitted, a huge one would otherwise succeed and the
    process be killed later, when it touches the pages)."""
    # A GPU's driver reserves a large address space when it starts: start it first (train.main asks whether CUDA is
    # there), so that the limit counts it as already mapped instead of failing the driver's start.
    torch.cuda.is_available()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_out_of_memory_names_the_sizes_and_the_flag(run, tmp_path, capsys, monkeypatch):
    from common import machine
    monkeypatch.setattr(machine, "free_memory", lambda: None)  # the allocator's own failure, not the check before it
    with address_space_of(4 * 2**30):  # each of the model's 2**17-wide matrices needs over 64 GiB
        one_line_error(capsys, train.main, *train_args(run, tmp_path / "r", "--n_embd", str(2**17), "--n_head", "2"),
                       words="out of memory for a model of n_layer 2 x n_embd 131072 with batch_size 8")


def test_a_step_too_big_for_the_free_memory_is_refused_before_it_is_tried(run, tmp_path, capsys, monkeypatch):
    """On a CPU the system ends a process that runs out of memory (no error reaches Python): a step whose estimate is
    over what the machine has free is refused first, in one line that names the sizes and the fix, before the run
    writes anything (the folder it made is removed), so the same folder serves the corrected command."""
    from training import opening
    out = tmp_path / "r"
    # the debug preset: batch 8, block 32, n_embd 32, n_layer 2, eval_iters 4, float32
    need = (opening.ACTIVATION_BYTES[torch.float32] * 8 * 32 * 32 * 2 + opening.PARAMETER_BYTES * 12 * 2 * 32 ** 2
            + 8 * 4 * 8)  # (an evaluation's window starts: 8 bytes each)
    from common import machine
    monkeypatch.setattr(machine, "free_memory", lambda: need - 1)
    err = one_line_error(capsys, train.main, *train_args(run, out),
                         words="out of memory: a model of n_layer 2 x n_embd 32 with batch_size 8 x block_size 32 "
                               "would need about 0.0 GiB, and this machine has 0.0 GiB free; lower --batch_size")
    assert "no checkpoint of this run was written" in err and not out.exists()  # (the folder it made, removed)
    one_line_error(capsys, train.main, *train_args(run, out, "--eval_iters", "1000000"),
                   words="would need about 0.1 GiB, and this machine has 0.0 GiB free; lower --eval_iters: most of "
                         "it is each evaluation's windows")
    monkeypatch.setattr(machine, "free_memory", lambda: need)  # just enough
    assert run_cli(train.main, train_args(run, out, "--max_iters", "2")) == 0 and (out / "ckpt_best.safetensors").is_file()
    cfg = load_config(train_args(run, out), False)[0]
    explicit = load_config(train_args(run, out, "--attention", "explicit"), False)[0]
    cpu = Runtime(torch.device("cpu"), torch.float32)
    with pytest.raises(UserError, match="would need about"):  # the explicit path also keeps every layer's weights
        opening.refuse_if_too_big(explicit, cpu, "")
    monkeypatch.setattr(machine, "free_memory", lambda: 1)
    # a GPU's allocator raises an error of its own, which the run answers: no estimate there
    opening.refuse_if_too_big(cfg, Runtime(torch.device("cuda"), torch.bfloat16), "")


@pytest.mark.parametrize("args, words", [
    (["--device", "cpu:abc"], "--device 'cpu:abc': must be auto, cpu"),
    (["--seed", str(2**70)], "--seed"),
    (["--encoding", "rot13"], "--encoding rot13: not a text encoding"),
    (["--encoding", "base64"], "not a text encoding"),
    (["--encoding", "utf-16"], "is not valid utf-16"),
    (["--learning_rate", "inf"], "--learning_rate inf: must be a finite number"),
])
def test_bad_training_values_are_one_line(run, tmp_path, capsys, args, words):
    one_line_error(capsys, train.main, *train_args(run, tmp_path / "r", *args), words=words)


def test_toml_values_of_the_wrong_type_and_compile_as_a_boolean(run, tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("learning_rate = true\n")
    one_line_error(capsys, train.main, "--config", str(bad), words="learning_rate = True should be of type float")
    good = tmp_path / "good.toml"
    good.write_text("compile = false\nblock_size = 16\nn_layer = 1\nn_head = 1\nn_embd = 16\nmax_iters = 2\n"
                    "eval_iters = 1\ndevice = \"cpu\"\n")
    cfg, _, _ = load_config(["--config", str(good)], False)
    assert cfg.compile == "false"


@pytest.mark.parametrize("args, words", [
    (["--device", "foo"], "--device foo: must be auto"),
    (["--dtype", "foo"], "--dtype foo: must be auto"),
    (["--temperature", "nan"], "--temperature nan"),
    (["--seed", str(2**70)], "--seed"),
])
def test_bad_sampling_values_are_one_line(run, capsys, args, words):
    one_line_error(capsys, sample_cli.main, "--out_dir", str(run), *args, words=words)


def test_a_full_disk_keeps_the_old_picture_page_or_figures_and_names_the_flag(run, tmp_path, capsys, monkeypatch):
    import attention_html
    import evaluate
    from common import run_folder

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(run_folder.os, "fsync", no_space)  # the file is written, then the disk is found full
    corpus = str(run.parent / "corpus.txt")
    for main, args, flag, name, what in (
            (plot_run.main, ["--out_dir", str(run)], "--png", "curves.png", "picture"),
            (attention_map.main, ["--out_dir", str(run), "--text", "ab"], "--png", "map.svg", "picture"),
            (attention_html.main, ["--out_dir", str(run), "--text", "ab"], "--html", "page.html", "page"),
            (evaluate.main, ["--out_dir", str(run), "--data", corpus, "--cache_dir", str(run.parent / "cache")],
             "--json", "figures.json", "figures file")):
        target = tmp_path / name
        target.write_bytes(b"the user's own file")
        code, err = run_cli(main, [*args, flag, str(target)]), capsys.readouterr().err.splitlines()[-1]
        assert code == 2 and err.startswith("error: could not write the "), err  # evaluate.py says what it scores first
        assert err.endswith(f"{target} (No space left on device); the previous {what} is untouched; "
                            f"free some disk space or choose another {flag}"), err
        assert target.read_bytes() == b"the user's own file" and not list(tmp_path.glob("*.tmp-*"))


def test_paths_that_are_not_utf8_train_and_are_named(run, tmp_path, capsys, monkeypatch):
    """A corpus whose file name is not UTF-8 (byte 0xff, held by Python as a surrogate) trains, and its name reaches
    the owner's .lock and the attention page as bytes or escapes; an --out_dir so named, which TensorBoard cannot
    write to, is one line before anything is made."""
    import attention_html
    corpus = tmp_path / "bad\udcffname.txt"
    shutil.copy(run.parent / "corpus.txt", corpus)
    out = tmp_path / "run"
    argv = ["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"), "--out_dir", str(out),
            "--max_iters", "4"]  # a cache of its own: the preparation writes the name into meta.json
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])  # the command line the .lock records
    assert run_cli(train.main, argv) == 0
    capsys.readouterr()
    assert b"bad\xffname.txt" in (out / ".lock").read_bytes()
    page = tmp_path / "page.html"
    assert run_cli(attention_html.main, ["--out_dir", str(out), "--text", "ab", "--html", str(page)]) == 0
    assert "bad\\udcffname.txt" in page.read_text(encoding="utf-8")
    capsys.readouterr()
    wrong = tmp_path / "out\udcffdir"
    one_line_error(capsys, train.main, *train_args(run, wrong), words="out\\udcffdir: the name is not valid UTF-8")
    assert not wrong.exists()


def test_output_to_a_file_on_a_full_disk_names_the_file(tmp_path, monkeypatch, capsys):
    """`sample.py > FILE` on a full disk (a write that names no file fails with ENOSPC, and the disk FILE is on has no
    free block, as os.fstatvfs says: here a stand-in for a full disk): one line naming FILE as the output and the fix;
    the same failure where the output's disk has room is the general line, naming no file."""
    import types

    import errors
    target = tmp_path / "samples.txt"

    def writes_on_a_full_disk(argv):
        print("some text")
        raise OSError(errno.ENOSPC, "No space left on device")
    for free, words in ((0, f"error: could not write the output to {target} (No space left on device); free some "
                             f"disk space there, or send the output elsewhere"),
                        (100, "error: could not read or write (No space left on device); check the path, its "
                              "permissions and the free disk space")):
        with open(target, "w", encoding="utf-8") as output:
            monkeypatch.setattr(sys, "stdout", output)
            monkeypatch.setattr(errors.os, "fstatvfs", lambda fd: types.SimpleNamespace(f_bavail=free))
            assert run_cli(writes_on_a_full_disk) == 2
        monkeypatch.undo()
        assert capsys.readouterr().err.strip() == words


def test_a_terminal_that_cannot_show_a_character_shows_its_code(monkeypatch):
    """A latin-1 or ASCII terminal and a Chinese sample: the character's code, as stderr shows it, not a traceback."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
    assert run_cli(lambda argv: print("ROMEO \u8bf4: caf\u00e9")) == 0
    sys.stdout.flush()
    assert raw.getvalue() == b"ROMEO \\u8bf4: caf\\xe9\n"


def test_samples_that_cannot_fit_in_memory_are_one_line(run, capsys, monkeypatch):
    """Samples too big for the free memory are refused before drawing (with the figures), and an allocation that fails
    where the free memory is unknown is the same one line."""
    from common import machine
    real = machine.free_memory
    for args, words, free in (
            (["--max_new_tokens", str(10**12)], "1 sample(s) of 1,000,000,000,000 new", real),
            (["--max_new_tokens", str(10**12)], "1 sample(s) of 1,000,000,000,000 new", lambda: None),  # allocating
            (["--num_samples", str(10**9), "--max_new_tokens", "3"], "1,000,000,000 sample(s) of 3 new",
             real),  # checked before a billion rows fill the memory with Python lists
            (["--num_samples", str(10**9), "--max_new_tokens", "3", "--stream"], "1,000,000,000 sample(s) of 3 new",
             real)):  # a row at a time, but the rows themselves do not fit
        monkeypatch.setattr(machine, "free_memory", free)
        assert run_cli(sample_cli.main, ["--out_dir", str(run), *args]) == 2
        err = capsys.readouterr().err.splitlines()[-1]  # after the line that says which model samples
        said = "do not fit on cpu" if free() is None else "would need about "
        assert err.startswith(f"error: out of memory: {words} characters {said}"), err
        assert err.endswith("; lower --max_new_tokens or --num_samples"), err


def test_scripts_check_their_output_paths_first(run, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    err = one_line_error(capsys, sample_cli.main, "--out_dir", str(run), "--prompt_file", str(empty),
                         "--prompts_per_line", words="is empty")
    for main, args in ((attention_map.main, ["--out_dir", str(run), "--text", "ab"]),
                       (plot_run.main, ["--out_dir", str(run)])):
        one_line_error(capsys, main, *args, "--png", str(tmp_path / "x.xyz"), words="must end in one of")
        # (.pgf, which matplotlib writes only through a LaTeX installation, is not offered)
        one_line_error(capsys, main, *args, "--png", str(tmp_path / "x.pgf"), words="must end in one of")
        one_line_error(capsys, main, *args, "--png", str(tmp_path / "missing" / "x.png"), words="does not exist")
        for under in (empty / "x.png", empty / "sub" / "x.png"):
            one_line_error(capsys, main, *args, "--png", str(under),
                           words=f"--png {under}: {empty} is a file, not a folder; give a file in a folder")
    one_line_error(capsys, plot_run.main, "--out_dir", str(tmp_path / "nowhere"), "--png", str(tmp_path / "a.png"),
                   words="no such folder")
    from torch.utils.tensorboard import SummaryWriter
    with SummaryWriter(str(tmp_path / "no_scalars")) as writer:
        writer.add_text("config", "x", 0)
    one_line_error(capsys, plot_run.main, "--out_dir", str(tmp_path / "no_scalars"), "--png", str(tmp_path / "b.png"),
                   words="holds no losses yet")
    assert not (tmp_path / "b.png").exists()
    (tmp_path / "garbled").mkdir()  # event files of random bytes: not called a run that stopped before its first log
    (tmp_path / "garbled" / "events.out.tfevents.1.host").write_bytes(np.random.default_rng(0).bytes(5000))
    one_line_error(capsys, plot_run.main, "--out_dir", str(tmp_path / "garbled"), "--png", str(tmp_path / "c.png"),
                   words=f"{tmp_path / 'garbled'}: its TensorBoard event files hold nothing readable; nothing to plot")
    odd = tmp_path / "no_scalars" / "events.out.tfevents.2.host"
    odd.mkdir()  # a folder under an event file's name
    one_line_error(capsys, plot_run.main, "--out_dir", str(tmp_path / "no_scalars"), "--png", str(tmp_path / "c.png"),
                   words=f"{odd} is not a plain file. Move it out of {tmp_path / 'no_scalars'}, or leave that run out")
    killed = tmp_path / "killed"  # a run killed at once: its writer's queue never written, but the file's first event
    subprocess.run([sys.executable, "-c", "import os, sys; from torch.utils.tensorboard import SummaryWriter; "
                    "w = SummaryWriter(sys.argv[1]); w.add_text('config', 'x', 0); w.add_scalar('loss/train', 1.0, 1); "
                    "os._exit(0)", str(killed)], check=True)
    one_line_error(capsys, plot_run.main, "--out_dir", str(killed), "--png", str(tmp_path / "d.png"),
                   words="holds no losses yet")
    damaged = shutil.copytree(run, tmp_path / "damaged")  # a finished run's events written over after their start
    events = next(damaged.glob("events.out.tfevents.*"))
    first = 8 + 4 + int.from_bytes(events.read_bytes()[:8], "little") + 4  # its first record: length, data, checks
    events.write_bytes(events.read_bytes()[:first] + np.random.default_rng(1).bytes(events.stat().st_size - first))
    one_line_error(capsys, plot_run.main, "--out_dir", str(damaged), "--png", str(tmp_path / "e.png"),
                   words="its TensorBoard event files are damaged: they hold no losses, though the run saved a "
                         "checkpoint")
    one_line_error(capsys, plot_run.main, "--out_dir", str(events), "--png", str(tmp_path / "f.png"),
                   words=f"--out_dir {events}: a file, not a run folder")
    one_line_error(capsys, bench.main, "--config", "debug", "--json", str(tmp_path / "missing_dir" / "x.json"),
                   words="missing_dir does not exist")
    one_line_error(capsys, bench_prepare.main, "--mb", "0", words="argument --mb: 0 is not a whole number of at least 1")
    assert "Traceback" not in err


def test_the_default_sample_works_on_a_corpus_without_newlines(tmp_path, capsys):
    corpus = tmp_path / "one_line.txt"
    corpus.write_text("春眠不觉晓处处闻啼鸟夜来风雨声花落知多少" * 80, encoding="utf-8")
    code = run_cli(train.main, ["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "c"),
                                "--out_dir", str(tmp_path / "run"), "--max_iters", "4", "--block_size", "16"])
    assert code == 0
    capsys.readouterr()
    assert run_cli(sample_cli.main, ["--out_dir", str(tmp_path / "run"), "--max_new_tokens", "10"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("春") and len(out.strip()) == 11  # the prompt (the text's first character) and 10 more
    assert "step 4" in err and "one_line.txt" in err  # what was loaded, on stderr


@pytest.mark.slow
def test_ctrl_c_in_sample_py_is_one_line_and_exit_130(run):
    """A real Ctrl-C (SIGINT) while a sample streams: no traceback, exit 130, and the last line says how far it got."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "sample.py"), "--out_dir", str(run), "--stream",
                             "--max_new_tokens", "1000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.read(20)  # it is generating
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=patient(30))
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert re.fullmatch(r"stopped after [\d,]+ of the 1,000,000 new characters; those are printed",
                        stderr.strip().splitlines()[-1]), stderr


def test_a_run_refused_before_it_writes_anything_leaves_no_folder_and_a_users_empty_folder_stays(tmp_path, capsys):
    """A new run refused after it claimed its folder (an empty text, an unknown encoding, float16 on a CPU) removes
    the folder it made, which held only its lock; an empty folder the user made is left where it was, and a later run
    in the same place trains."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(play_text(20_000), encoding="utf-8")
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    mine = tmp_path / "mine"
    mine.mkdir()
    common = ["--config", "debug", "--cache_dir", str(tmp_path / "cache"), "--max_iters", "2"]
    for out, args, words in ((tmp_path / "out" / "a", ["--data", str(tmp_path / "empty.txt")], "empty"),
                             (tmp_path / "b", ["--data", str(corpus), "--encoding", "nosuchenc"], "nosuchenc"),
                             (tmp_path / "c", ["--data", str(corpus), "--dtype", "float16"], "float16"),
                             (mine, ["--data", str(tmp_path / "empty.txt")], "empty")):
        one_line_error(capsys, train.main, *common, *args, "--out_dir", str(out), words=words)
        assert out.exists() == (out == mine), out
    assert list(mine.iterdir()) == [] and (tmp_path / "out").is_dir()  # (only the folder of the run itself goes)
    assert run_cli(train.main, [*common, "--data", str(corpus), "--out_dir", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "ckpt_last.safetensors").is_file()
