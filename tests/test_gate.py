"""The gate (data/gate.py): a checkpoint, a run folder, a token cache or a corpus from someone else costs at most a few
hundred MB and a few seconds before a one-line refusal, never hangs, and never moves or deletes a file on a record's
word; a corpus that changes while it is prepared leaves no cache entry. The attacks that could take the machine down
run in a child process under an address-space limit."""
import importlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import train
from conftest import ROOT, checkpoint_parts, write_checkpoint
from data import prepare, resolve
from errors import run_cli
from training import checkpoint
from test_hostile import argv, copy_of, corpus, files_of, finished, forged  # noqa: F401 (corpus, finished: fixtures)


def one_line(capsys, code, words):
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert words in err, err
    return err


LIMITED = """import resource, sys
sys.path[:0] = [{root!r}, {scripts!r}]
import train, sample, torch  # (imported before the limit: what is mapped then is not the attack's)
from errors import run_cli
from training import checkpoint
torch.cuda.is_available()
mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + {extra}, resource.getrlimit(resource.RLIMIT_AS)[1]))
sys.exit(run_cli({{"train": train.main, "sample": sample.main}}[{main!r}], {args!r}))
"""


def limited(main: str, args: list[str], extra_bytes: int, timeout: float = 120) -> subprocess.CompletedProcess:
    """A command's main() in a child process that may map only extra_bytes more memory once its modules are loaded:
    an allocation past that fails at once, as on a machine that has no more, and the machine stays safe."""
    code = LIMITED.format(root=str(ROOT), scripts=str(ROOT / "scripts"), extra=extra_bytes, main=main, args=args)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


# ---- 1. the optimizer's state ------------------------------------------------------------------------------------
def test_an_optimizer_moment_of_the_wrong_shape_is_refused_before_the_fused_step(finished, tmp_path):
    """A 7-element exp_avg for the token embedding (55 x 32): the fused AdamW step would write past its end and grow
    the process by GBs; --resume refuses it in one line naming the tensor and both shapes, the checkpoint kept byte
    for byte. (Under a 1 GiB limit, so that a step that did write past the end could not take the machine down.)"""
    out = copy_of(finished, tmp_path)
    tensors, settings = checkpoint_parts(out / "ckpt_last.safetensors")
    write_checkpoint(out / "ckpt_last.safetensors", {**tensors, "optimizer.state.0.exp_avg": torch.zeros(7)}, settings)
    before = files_of(out)
    done = limited("train", ["--out_dir", str(out), "--resume", "--max_iters", "8"], 1 << 30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
    vocab = len(settings["vocab"])
    assert done.stderr == (f"error: {out / 'ckpt_last.safetensors'}: its tensors do not fit its settings "
                           f"(optimizer.state.0.exp_avg: the settings give ({vocab}, 32) of F32, the file holds (7,) "
                           f"of F32)\n")
    assert files_of(out) == before


def test_an_optimizer_setting_the_trainer_fixes_is_rebuilt_not_read(finished, tmp_path):
    """Group settings configure_optimizer sets (differentiable, which the fused step breaks on; eps; the weights a
    group holds; a key it does not know) come from the rebuilt optimizer, not the file: a file with them changed loads
    to the same optimizer state, value for value, as the file it was made from."""
    path = copy_of(finished, tmp_path) / "ckpt_last.safetensors"
    want = checkpoint.load(path, resume=True)["optimizer"]
    tensors, settings = checkpoint_parts(path)
    settings["optimizer"]["param_groups"][0].update(differentiable=True, eps=1.0, params=[0, 1], extra={"a": [1]})
    write_checkpoint(tmp_path / "changed.safetensors", tensors, settings)
    got = checkpoint.load(tmp_path / "changed.safetensors", resume=True)["optimizer"]
    assert got["param_groups"] == want["param_groups"] and want["param_groups"][0]["differentiable"] is False
    assert got["state"].keys() == want["state"].keys()
    assert all(torch.equal(got["state"][i][k], t) for i, one in want["state"].items() for k, t in one.items())


@pytest.mark.parametrize("where, value, words", [
    ("betas", "xy", "optimizer.param_groups.0.betas is 'xy', where it must be two numbers in [0, 1)"),
    ("step", torch.tensor(-1.0), "optimizer.state.0.step is -1.0, where it must be a whole number from 0"),
    ("exp_avg_sq", None, "optimizer.state.0.exp_avg_sq is a Tensor, where it must be finite and not negative"),
])
def test_an_optimizer_state_a_step_cannot_use_is_refused_naming_the_field(finished, tmp_path, capsys, where, value,
                                                                         words):
    """A group setting read from the file that is out of range (a betas that is no pair of numbers), a negative step
    count (a division by zero in the bias correction), a negative second moment (the square root of it): one line
    naming the field, before anything is built."""
    out = copy_of(finished, tmp_path)
    tensors, settings = checkpoint_parts(out / "ckpt_last.safetensors")
    name = f"optimizer.state.0.{where}"
    if where in ("step", "exp_avg_sq"):
        tensors[name] = value if value is not None else -tensors[name] - 1
    else:
        settings["optimizer"]["param_groups"][0][where] = value
    write_checkpoint(out / "ckpt_last.safetensors", tensors, settings)
    before = files_of(out)
    one_line(capsys, run_cli(train.main, ["--out_dir", str(out), "--resume", "--max_iters", "8"]), words)
    assert files_of(out) == before


# ---- 3. a path a checkpoint names --------------------------------------------------------------------------------
def test_a_text_a_checkpoint_names_is_read_only_as_a_regular_file_of_its_recorded_size(finished, tmp_path, capsys):
    """run_config.data naming /proc/self/pagemap (it reports 0 bytes and reads forever), a pipe (a read would wait
    for a writer) or a folder: --resume refuses in one line within seconds, without reading it; the text it trained
    on, whatever its name, resumes."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "folder").mkdir()
    for named, words in (("/proc/self/pagemap", "is not the text it was trained on (0 bytes, where the record says "),
                         (str(fifo), "it is not a regular file"),
                         (str(tmp_path / "folder"), "it is a folder, whose files a checkpoint does not list")):
        out = copy_of(finished, tmp_path / f"case-{Path(named).name}")
        forged(out / "ckpt_last.safetensors", out / "ckpt_last.safetensors", run_config={"data": named})
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(ROOT / "train.py"), "--out_dir", str(out), "--resume",
                               "--max_iters", "6"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr[-2000:]
        assert "so it was not read" in done.stderr and time.monotonic() - started < 60
    out = copy_of(finished, tmp_path / "moved")
    moved = tmp_path / "moved.txt"
    moved.write_bytes(Path(checkpoint_parts(out / "ckpt_last.safetensors")[1]["data"]["source"]).read_bytes())
    forged(out / "ckpt_last.safetensors", out / "ckpt_last.safetensors", run_config={"data": str(moved)})
    assert run_cli(train.main, ["--out_dir", str(out), "--resume", "--max_iters", "6"]) == 0


def test_the_page_takes_no_cache_from_a_checkpoint_and_reads_no_special_file(finished, corpus, tmp_path,
                                                                            monkeypatch):
    """attention_html.py opens on the run's own validation text, never on a planted cache entry that a checkpoint's
    cache_dir points at (its checksum forged to match), and a data.source of /proc/self/pagemap is not read (the page
    is written within seconds, on a line of Romeo)."""
    import attention_html
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    state = checkpoint_parts(finished / "ckpt_best.safetensors")[1]
    sha256, vocab = state["data"]["sha256"], state["vocab"]
    planted = tmp_path / "planted" / "prepared" / f"{sha256[:20]}-planted"
    planted.mkdir(parents=True)
    line = "All:\nplanted words, planted words, not the run\n"
    ids = np.array([vocab.index(ch) for ch in line], dtype=np.uint8)
    ids.tofile(planted / "val.bin")
    ids.tofile(planted / "train.bin")
    (planted / "meta.json").write_text(json.dumps({
        "format": 1, "sha256": sha256, "vocab": vocab, "vocab_size": len(vocab), "dtype": "uint8",
        "n_train": len(ids), "n_val": len(ids), "encoding": "utf-8", "encoding_errors": "strict",
        "val_fraction": state["run_config"]["val_fraction"]}))
    forged(finished / "ckpt_best.safetensors", tmp_path / "planted.pt", run_config={"cache_dir": str(tmp_path / "planted")})
    html = tmp_path / "a.html"
    assert run_cli(attention_html.main, ["--ckpt", str(tmp_path / "planted.pt"), "--html", str(html)]) == 0
    text = opening_text(html)
    assert "planted" not in text and text in corpus.read_text(encoding="utf-8")
    forged(finished / "ckpt_best.safetensors", tmp_path / "pagemap.pt", data={"source": "/proc/self/pagemap"},
           run_config={"cache_dir": str(tmp_path / "empty")})
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "attention_html.py"), "--ckpt",
                           str(tmp_path / "pagemap.pt"), "--html", str(html)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "home-cache")})
    assert done.returncode == 0 and time.monotonic() - started < 60, done.stderr[-2000:]
    known = set(state["vocab"])
    assert opening_text(html) == "".join(ch for ch in attention_html.DEFAULT_TEXT if ch in known)[:32]


def opening_text(html: Path) -> str:
    """The text a page opens with, from the data it carries."""
    blob = html.read_text(encoding="utf-8").split('<script type="application/json" id="data">', 1)[1]
    return json.loads(blob.split("</script>", 1)[0])["text"]


# ---- 4. a corpus that changes while it is prepared --------------------------------------------------------------
def changing_during(monkeypatch, corpus_file: Path, on_pass: int, change) -> None:
    """change(corpus_file) is called just before prepare's on_pass-th reading of the text (1: counting its
    characters, 2: writing its tokens), as an editor saving the file at that moment would."""
    calls = []
    prepare_module = importlib.import_module("data.prepare")  # (data.prepare, the attribute, is its function)
    real = prepare_module.read_text

    def reading(*args, **kwargs):
        calls.append(1)
        if len(calls) == on_pass:
            change(corpus_file)
        return real(*args, **kwargs)
    monkeypatch.setattr(prepare_module, "read_text", reading)


def swap_case(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b"e", b"\0").replace(b"E", b"e").replace(b"\0", b"E"))


def unseen(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b"king", b"kin\xc3\xa9", 1))  # same length: a character never seen


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


@pytest.mark.parametrize("on_pass, change", [(1, swap_case), (2, swap_case), (2, unseen), (2, truncated)])
def test_a_corpus_that_changes_while_it_is_prepared_leaves_no_cache_entry(tmp_path, monkeypatch, capsys, on_pass,
                                                                         change):
    """The text edited (e and E swapped: the same size and characters), given a character the first pass did not see
    (which became id 0), or cut in half, between prepare's passes: one line, exit 2, no cache entry; the original
    text then prepares to exactly its own ids."""
    from conftest import play_text
    text = play_text(20000)
    source = tmp_path / "corpus.txt"
    source.write_text(text, encoding="utf-8")
    original = source.read_bytes()
    changing_during(monkeypatch, source, on_pass, change)
    args = ["--config", "debug", "--data", str(source), "--cache_dir", str(tmp_path / "cache"),
            "--out_dir", str(tmp_path / "run"), "--max_iters", "2"]
    one_line(capsys, run_cli(train.main, args), f"--data {source} changed while it was prepared")
    assert not list((tmp_path / "cache").rglob("prepared/*"))
    monkeypatch.undo()
    source.write_bytes(original)
    prepared = prepare(resolve(str(source), tmp_path), tmp_path / "cache")
    chars = sorted(set(text))
    ids = np.fromfile(prepared.path("train"), dtype=np.uint8).tolist() + \
        np.fromfile(prepared.path("val"), dtype=np.uint8).tolist()
    assert ids == [chars.index(ch) for ch in text]


def test_an_unseen_character_is_never_encoded_as_id_0():
    from data.tokenizer import CharTokenizer
    with pytest.raises(ValueError, match="characters not in the vocabulary: 'z'"):
        CharTokenizer("ab").encode_array("abz")


# ---- 5. a record never deletes -----------------------------------------------------------------------------------
def planted_record(out: Path, folder: str, files: dict[str, bytes], record: dict) -> Path:
    aside = out / folder
    aside.mkdir()
    for name, data in files.items():
        (aside / name).write_bytes(data)
    (aside / "set_aside.json").write_text(json.dumps(record))
    return aside


@pytest.mark.parametrize("folder", [".replaced", ".replaced.discarded", ".replaced.tmp-x1y2z3"])
def test_a_forged_record_moves_and_deletes_nothing(corpus, finished, tmp_path, capsys, folder):
    """A finished run with a planted keep-aside: in .replaced/ a record listing its checkpoints and summary as not yet
    moved (trusted, it would have the run's events and loss.png deleted as a replacement's and the run called
    restored); in .replaced.discarded/ a record naming the files beside it; in .replaced.tmp-* a lone record. Each is
    refused in one line by a new run, --resume and --overwrite, every file of the folder kept byte for byte."""
    out = copy_of(finished, tmp_path)
    sizes = {name: (out / name).stat().st_size for name in ("ckpt_last.safetensors", "ckpt_best.safetensors", "summary.json")}
    if folder == ".replaced":
        planted_record(out, folder, {}, {"set_aside": sizes})
    elif folder == ".replaced.discarded":
        planted_record(out, folder, {"ckpt_last.safetensors": b"old run", "summary.json": b"{}"},
                       {"set_aside": {"ckpt_last.safetensors": 7, "summary.json": 2}})
    else:
        planted_record(out, folder, {}, {"set_aside": sizes})
    before = files_of(out)
    for how in ([], ["--resume"], ["--overwrite"]):
        err = one_line(capsys, run_cli(train.main, argv(corpus, out, *how)), "so nothing was moved or deleted")
        assert "was not written for this folder" in err, err
        assert files_of(out) == before, how


def test_an_overwrite_on_a_full_disk_puts_the_old_run_back_and_says_so(corpus, finished, tmp_path, capsys,
                                                                      monkeypatch):
    """--overwrite whose first checkpoint cannot be written (the disk is full): the line says the run it was replacing
    is back, not that nothing was written while it waited in .replaced/; the old run is there byte for byte."""
    import errno
    from common import run_folder
    out = copy_of(finished, tmp_path)
    before = files_of(out)
    real = run_folder.os.fdopen

    def full(fd, mode):
        if "ckpt_" in os.readlink(f"/proc/self/fd/{fd}"):
            os.close(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, mode)
    monkeypatch.setattr(run_folder.os, "fdopen", full)
    err = one_line(capsys, run_cli(train.main, argv(corpus, out, "--overwrite")),
                   f"(No space left on device); the run --overwrite was replacing is back in {out}, as it was")
    assert "nothing was written" not in err and not (out / ".replaced").exists()
    after = {name: data for name, data in files_of(out).items() if not name.startswith("undone_overwrite_")}
    assert after == before


# ---- 6, 7. fields a reader uses, and the lines that name them ----------------------------------------------------
@pytest.mark.parametrize("changes, words", [
    ({"tokens_per_iter": 0}, "tokens_per_iter is 0, where it must be 1 or more"),
    ({"tokens_per_iter": -256}, "tokens_per_iter is -256, where it must be 1 or more"),
    ({"last_eval": {"train": "low"}}, "last_eval is a dict, where it must be losses (train, val)"),
    ({"data": {"sha256": 5}}, "data.sha256 is 5, where it must be a sha256 checksum"),
    ({"scaler": {"scale": float("nan")}}, "scaler.scale is nan, where it must be a finite positive number"),
])
def test_a_resume_refuses_a_field_it_cannot_use_naming_the_checkpoint_and_the_field(finished, tmp_path, capsys,
                                                                                   changes, words):
    out = copy_of(finished, tmp_path)
    forged(out / "ckpt_last.safetensors", out / "ckpt_last.safetensors", **changes)
    before = files_of(out)
    err = one_line(capsys, run_cli(train.main, ["--out_dir", str(out), "--resume", "--max_iters", "8"]), words)
    assert err.startswith(f"error: {out / 'ckpt_last.safetensors'} is damaged: ") and "--grad_accum_steps" not in err
    assert files_of(out) == before


def test_sample_and_hubconf_refuse_a_first_char_that_is_not_a_character(finished, tmp_path, capsys):
    """A vocabulary without a newline (so that the default prompt is the text's first character) and a first_char
    that is a list: one line from sample.py, a ValueError from hubconf, both naming data.first_char."""
    import hubconf
    import sample
    vocab = checkpoint_parts(finished / "ckpt_best.safetensors")[1]["vocab"].replace("\n", "\u00b6")
    forged(finished / "ckpt_best.safetensors", tmp_path / "list.pt", vocab=vocab, data={"first_char": ["J"]})
    one_line(capsys, run_cli(sample.main, ["--ckpt", str(tmp_path / "list.pt")]),
             "data.first_char is a list, where it must be one character")
    with pytest.raises(ValueError, match="data.first_char is a list"):
        hubconf.chargpt(str(tmp_path / "list.pt"))


def test_evaluate_names_the_checkpoint_for_a_value_it_took_from_it(finished, corpus, tmp_path, capsys):
    """batch_size 0, an encoding no codec has, float16 on a CPU, all from the checkpoint's run config: the line names
    the checkpoint (never a flag the user did not give), and --dtype still chooses."""
    import evaluate
    for name, run_config, words in (
            ("batch", {"batch_size": 0}, "its saved config is invalid (--batch_size 0: must be at least 1)"),
            ("codec", {"encoding": "no-such-codec"}, "is damaged: its run config's encoding no-such-codec"),
            ("half", {"dtype": "float16"}, "the run's saved dtype, float16, cannot be used here (not supported on "
                                           "CPU; use float32 or bfloat16)")):
        path = forged(finished / "ckpt_best.safetensors", tmp_path / f"{name}.pt", run_config=run_config)
        err = one_line(capsys, run_cli(evaluate.main, ["--ckpt", str(path), "--data", str(corpus)]), words)
        assert err.startswith(f"error: {path}") and "error: --" not in err, err
    assert run_cli(evaluate.main, ["--ckpt", str(tmp_path / "half.pt"), "--data", str(corpus), "--dtype",
                                   "float32"]) == 0


def test_sample_refuses_weights_whose_scores_overflow_instead_of_printing_newlines(finished, tmp_path, capsys):
    """Weights multiplied by 1e30 (finite, but the scores of the next character overflow within a few characters): one
    line, as evaluate.py and the page say it; a batch prints nothing, and a stream (one sample, the default) only the
    characters drawn before the scores overflowed, its line ended; hubconf raises a ValueError."""
    import hubconf
    import sample
    state = checkpoint.load(finished / "ckpt_best.safetensors")
    for name in [n for n in state["model"] if n.endswith("attn.c_attn.weight")]:
        state["model"][name] = state["model"][name] * 1e30
    checkpoint.save(state, tmp_path / "loud.pt")
    for stream in ("false", "true"):
        code = run_cli(sample.main, ["--ckpt", str(tmp_path / "loud.pt"), "--max_new_tokens", "30", "--stream", stream])
        said = capsys.readouterr()
        assert code == 2 and said.err.splitlines()[-1] == (
            f"error: {tmp_path / 'loud.pt'}: the model's scores are not numbers (NaN or inf); its weights are "
            f"damaged or too large"), said
        if stream == "false":
            assert said.out == ""
        else:  # the prompt and fewer than the 30 characters asked, then the end of the line
            assert said.out.startswith("\n") and said.out.endswith("\n") and len(said.out) < 1 + 30 + 1, said.out
    with pytest.raises(ValueError, match="not finite"):
        hubconf.chargpt(str(tmp_path / "loud.pt")).generate(max_new_tokens=30)


def test_config_without_a_value_is_one_line(capsys):
    one_line(capsys, run_cli(train.main, ["--config"]), "argument --config: expected one argument")


def test_a_folder_where_a_file_belongs_is_called_a_folder(finished, tmp_path, capsys):
    """A folder named ckpt_best.safetensors is refused as a folder (it was called a device, pipe or socket), and a folder named
    summary.json in a run folder is refused without the advice to look at where a link points."""
    import sample
    out = copy_of(finished, tmp_path / "folders")
    (out / "ckpt_best.safetensors").unlink()
    (out / "ckpt_best.safetensors").mkdir()
    one_line(capsys, run_cli(sample.main, ["--ckpt", str(out / "ckpt_best.safetensors")]),
             f"the checkpoint {out / 'ckpt_best.safetensors'} is a folder, not a file; give a file")
    (out / "ckpt_best.safetensors").rmdir()
    (out / "summary.json").unlink()
    (out / "summary.json").mkdir()
    err = one_line(capsys, run_cli(train.main, ["--out_dir", str(out), "--resume", "--max_iters", "6"]),
                   f"{out / 'summary.json'} is a folder where the run keeps a file")
    assert "points to" not in err


def test_a_script_refused_a_runs_best_checkpoint_names_its_last_one_when_that_reads_well(finished, tmp_path, capsys):
    """sample.py --out_dir reads ckpt_best.safetensors; where that is damaged and ckpt_last.safetensors reads well, the one line says so
    with the flag that reads it (which then samples); where both are damaged it does not."""
    import sample
    out = copy_of(finished, tmp_path / "best_damaged")
    (out / "ckpt_best.safetensors").write_bytes(b"")
    last = out / "ckpt_last.safetensors"
    err = one_line(capsys, run_cli(sample.main, ["--out_dir", str(out), "--max_new_tokens", "5"]), "it is empty")
    assert err.rstrip().endswith(f"; the run's last checkpoint reads well: --ckpt {last}"), err
    assert run_cli(sample.main, ["--ckpt", str(last), "--max_new_tokens", "5"]) == 0
    capsys.readouterr()
    last.write_bytes(last.read_bytes()[:1000])
    err = one_line(capsys, run_cli(sample.main, ["--out_dir", str(out), "--max_new_tokens", "5"]), "it is empty")
    assert "last checkpoint" not in err
