"""scripts/export.py: a trained model leaves the project. A program that imports neither this project nor torch reads
the weights with safetensors alone (each equal to the checkpoint's), the vocabulary and settings from JSON, and runs
the ONNX graph with onnxruntime: its logits equal PyTorch's for batches of other sizes and lengths than the export's
example. The ONNX part is skipped where the optional export packages are not installed."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, module_corpus, run_script, train_debug
from training.checkpoint import load_model

# The program outside: standard library, numpy, safetensors and onnxruntime only.
OUTSIDE = """import json, sys
import numpy as np
from safetensors.numpy import load_file

folder, text, out = sys.argv[1], sys.argv[2], sys.argv[3]
config = json.load(open(folder + "/config.json"))
chars = json.load(open(folder + "/vocab.json", encoding="utf-8"))["chars"]
ids = np.array([[chars.index(ch) for ch in text]], dtype=np.int64)
results = {"weights/" + name: array for name, array in load_file(folder + "/model.safetensors").items()}
if sys.argv[4] == "onnx":
    import onnxruntime
    session = onnxruntime.InferenceSession(folder + "/model.onnx", providers=["CPUExecutionProvider"])
    batch = np.concatenate([ids, ids[:, ::-1]])  # two rows, as long as the text
    results["logits"] = session.run(["logits"], {"idx": batch})[0]
    results["one"] = session.run(["logits"], {"idx": ids[:, :config["block_size"] // 2 + 1]})[0]
ours = ({"torch", "model", "common", "training", "configs", "errors", "hubconf"}
        & {name.split(".")[0] for name in sys.modules})
assert not ours, ours
np.savez(out, **results)
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    corpus = module_corpus(tmp_path_factory, "export")
    out = corpus.parent / "run"
    train_debug(corpus, out, "--max_iters", "10", "--position", "rope", "--logit_softcap", "15")
    return out


def outside(tmp_path, folder, text, onnx):
    program = tmp_path / "outside.py"
    program.write_text(OUTSIDE)
    out = tmp_path / "read.npz"
    done = subprocess.run([sys.executable, "-I", str(program), str(folder), text, str(out), onnx], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(out))


def test_the_exported_model_is_read_and_run_without_this_project(run_dir, tmp_path):
    onnx = all(__import__("importlib").util.find_spec(name) for name in ("onnx", "onnxscript", "onnxruntime"))
    done = run_script("export.py", "--out_dir", str(run_dir), "--to", str(tmp_path / "exported"))
    assert done.returncode == 0, done.stderr
    written = ["model.safetensors", "config.json", "vocab.json"] + ["model.onnx"] * onnx
    assert done.stdout.strip().endswith(f"wrote {', '.join(written)} into {tmp_path / 'exported'}")
    assert sorted(p.name for p in (tmp_path / "exported").iterdir()) == sorted(written)
    model, tokenizer, _ = load_model(run_dir / "ckpt_best.safetensors")
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert {k: config[k] for k in model.config.to_dict()} == model.config.to_dict()
    text = "ROMEO:\nWhat light through yonder"[:model.config.block_size]
    read = outside(tmp_path, tmp_path / "exported", text, "onnx" if onnx else "")
    weights = {name[len("weights/"):]: array for name, array in read.items() if name.startswith("weights/")}
    assert weights.keys() == model.state_dict().keys()
    assert all(np.array_equal(weights[name], tensor.numpy()) for name, tensor in model.state_dict().items())
    if not onnx:
        pytest.skip("onnx, onnxscript or onnxruntime is not installed (pip install -r requirements-export.txt)")
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.inference_mode():
        expected = model(torch.cat([ids, ids.flip(1)]))[0].numpy()
        half = model(ids[:, :model.config.block_size // 2 + 1])[0].numpy()
    np.testing.assert_allclose(read["logits"], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(read["one"], half, rtol=1e-4, atol=1e-4)


def test_asking_for_onnx_without_its_packages_is_one_line_before_anything_is_written(run_dir, tmp_path, monkeypatch):
    """--onnx where one of the packages it needs is missing: one line naming the missing one only (json stands for a
    package that is there, so the test holds whether or not the optional extras are installed), exit 2, no folder."""
    import export
    monkeypatch.setattr(export, "ONNX_NEEDS", ("json", "no_such_exporter_module"))
    done = run_script("export.py", "--out_dir", str(run_dir), "--to", str(tmp_path / "x"), "--onnx=True")
    assert done.returncode == 2 and done.stderr == (
        "error: --onnx needs no_such_exporter_module: pip install -r requirements-export.txt\n")
    assert not (tmp_path / "x").exists()


def test_an_export_removes_the_scratch_of_one_killed_outright(run_dir, tmp_path, capsys, monkeypatch):
    """Scratch folders left by exports killed with kill -9 are removed by the next export into that folder, whatever
    their process id (an export writing there would hold the folder's lock), and a folder holding only these counts as
    empty; a folder of the user's that only looks alike, beside an earlier export, is kept, and one named exactly as a
    scratch folder (but without an export's mark in it) is the user's: the export is refused, the file kept. Without
    the ONNX packages, a model.onnx there is refused with the reason it would not be replaced and the way to install
    them."""
    import export
    from errors import run_cli
    folder = tmp_path / "export"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = folder / f".export-{int(gone.stdout)}-abcd1234"  # (that process has ended)
    running = folder / f".export-{os.getpid()}-efgh5678"  # (a process alive, which holds no lock on the folder)
    users = folder / ".export-notes"
    for scratch in (abandoned, running):
        scratch.mkdir(parents=True)
        (scratch / export.SCRATCH_MARK).touch()
        (scratch / "model.safetensors").write_bytes(b"half a model")
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(folder), "--onnx=false"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]
    abandoned.mkdir()
    users.mkdir()
    (users / "model.safetensors").write_bytes(b"the user's")
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(folder), "--onnx=false"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted([users.name, "config.json", "model.safetensors",
                                                               "vocab.json"])
    thesis = tmp_path / "thesis" / f".export-{int(gone.stdout)}-chapters"
    thesis.mkdir(parents=True)
    (thesis / "chapter1.txt").write_text("the user's")
    capsys.readouterr()
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(thesis.parent), "--onnx=false"]) == 2
    assert capsys.readouterr().err == (f"error: --to {thesis.parent} holds {thesis.name}, not an earlier export's; "
                                       f"choose another --to, a new or empty folder\n")
    assert [p.name for p in thesis.parent.iterdir()] == [thesis.name] and list(thesis.iterdir()) == [
        thesis / "chapter1.txt"] and (thesis / "chapter1.txt").read_text() == "the user's"
    (folder / "model.onnx").write_bytes(b"an earlier export's graph")
    monkeypatch.setattr(export, "ONNX_NEEDS", ("json", "no_such_exporter_module"))  # (json: a package that is there)
    capsys.readouterr()
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"error: --to {folder} holds a model.onnx this export would not replace; move it away, or choose another "
        f"--to, or pip install -r requirements-export.txt (no_such_exporter_module)\n")


def test_config_json_holds_the_rotary_base_and_says_whether_the_head_is_tied(run_dir, tmp_path):
    """config.json of a rope model holds the rotary base, from which a reader rebuilds the model's rotary tables
    exactly (they are not among the weights); its weights note calls the head tied only where it is: a model with
    tie_weights false has a head of its own, and a model without rope has no rotary base."""
    import dataclasses

    import export
    from model.attention import rope_tables
    from model.gpt import GPT

    done = run_script("export.py", "--out_dir", str(run_dir), "--to", str(tmp_path / "exported"), "--onnx=false")
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    model, _, state = load_model(run_dir / "ckpt_best.safetensors")
    cos, sin = rope_tables(config["block_size"], config["n_embd"] // config["n_head"], config["rope_base"])
    assert torch.equal(cos, model.rope_cos) and torch.equal(sin, model.rope_sin)
    assert model.config.tie_weights and "the tied head stored too" in config["weights"]
    untied = GPT(dataclasses.replace(model.config, tie_weights=False, position="learned"))
    written = export.model_config(untied, state, run_dir / "ckpt_best.safetensors")
    assert "tied" not in written["weights"] and "the head its own (lm_head.weight)" in written["weights"]
    assert "rope_base" not in written


def test_export_into_the_folder_of_a_run_in_training_is_refused_in_one_line(run_dir, tmp_path):
    """--to a run folder that a training process holds (its lock) is refused with exit 2, naming the process, and
    nothing is written among that run's files."""
    import os

    from common.run_folder import RunDir

    busy = RunDir(tmp_path / "training").claim(say=lambda message: None)
    try:
        done = run_script("export.py", "--out_dir", str(run_dir), "--to", str(busy.path), "--onnx=false")
    finally:
        busy.release()
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: --to {busy.path} is the folder of a run that process {os.getpid()} (")
    assert done.stderr.endswith("is training; choose another --to\n")
    assert not busy.path.exists()  # it held only the lock, so its release removed it: the export wrote nothing there


def test_a_failed_export_removes_the_folders_it_made_and_keeps_one_that_was_there(run_dir, tmp_path, capsys,
                                                                                 monkeypatch):
    """A full disk while exporting is one line, exit 2, and leaves the place as it was: the --to folder the export
    made (with its missing parents) is removed again, where a folder that was there before stays, with its files (an
    earlier export, and a file of the user's beside it)."""
    import errno

    import export
    from common import run_folder
    from errors import run_cli

    there = tmp_path / "there"
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(there), "--onnx=false"]) == 0
    (there / "notes.txt").write_text("the user's")
    before = {p.name: p.read_bytes() for p in there.iterdir()}

    def no_space(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(run_folder.os, "fsync", no_space)
    new = tmp_path / "new" / "export"
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(new), "--onnx=false"]) == 2
    assert "No space left on device" in capsys.readouterr().err and not (tmp_path / "new").exists()
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(there), "--onnx=false"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in there.iterdir()} == before


def test_an_export_over_an_earlier_one_replaces_it_whole_or_not_at_all(run_dir, tmp_path, capsys, monkeypatch):
    """Exporting another model into a folder that holds an earlier export: a full disk midway leaves the earlier export
    byte for byte, none of its files replaced by the other model's; a model.onnx this export
    would not write (--onnx=false) is refused in one line before anything is written, not left beside the other
    model's weights; a write that succeeds replaces every file."""
    import errno

    import export
    from common import run_folder
    from errors import run_cli

    from conftest import play_text
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(play_text(20000), encoding="utf-8")
    other = tmp_path / "other"
    train_debug(corpus, other, "--max_iters", "4", "--n_embd", "48")
    folder = tmp_path / "export"
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(folder), "--onnx=false"]) == 0
    earlier = {p.name: p.read_bytes() for p in folder.iterdir()}
    fsyncs = []

    def full_at_the_second(fd):
        fsyncs.append(fd)
        if len(fsyncs) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(run_folder.os, "fsync", full_at_the_second)
    assert run_cli(export.main, ["--out_dir", str(other), "--to", str(folder), "--onnx=false"]) == 2
    err = capsys.readouterr().err  # (the file named as the user knows it, not by the export's scratch folder)
    assert "No space left on device" in err and f" {folder}/config.json (" in err and ".export-" not in err, err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == earlier
    monkeypatch.undo()
    monkeypatch.setattr(export, "ONNX_NEEDS", ())  # (as where the packages are installed: the message's plain form)
    (folder / "model.onnx").write_bytes(b"an earlier export's graph")
    assert run_cli(export.main, ["--out_dir", str(other), "--to", str(folder), "--onnx=false"]) == 2
    assert capsys.readouterr().err == (f"error: --to {folder} holds a model.onnx this export would not replace; move "
                                       f"it away, or choose another --to\n")
    (folder / "model.onnx").unlink()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == earlier
    assert run_cli(export.main, ["--out_dir", str(other), "--to", str(folder), "--onnx=false"]) == 0
    now = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert now.keys() == earlier.keys() and all(now[name] != earlier[name] for name in ("model.safetensors",
                                                                                         "config.json"))


def test_a_second_export_into_a_folder_an_export_is_writing_is_one_line_and_changes_nothing(run_dir, tmp_path,
                                                                                            monkeypatch):
    """Two exports into one folder at once: while the first is between its checks and its last move (held there), the
    second, in another process, is refused in one line (exit 2) and writes nothing; the first then finishes whole."""
    import threading

    import export

    folder = tmp_path / "export"
    inside, go_on = threading.Event(), threading.Event()
    real = export.write_all

    def held(*args, **kwargs):
        inside.set()
        assert go_on.wait(timeout=120)
        return real(*args, **kwargs)
    monkeypatch.setattr(export, "write_all", held)
    first: list[int] = []
    thread = threading.Thread(target=lambda: first.append(  # (main: run_cli sets signal handlers, in the main thread)
        export.main(["--out_dir", str(run_dir), "--to", str(folder), "--onnx=false"])))
    thread.start()
    try:
        assert inside.wait(timeout=120)
        second = subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"), "--out_dir", str(run_dir),
                                 "--to", str(folder), "--onnx=false"], capture_output=True, text=True, timeout=120)
        assert list(folder.iterdir()) == []
    finally:
        go_on.set()
        thread.join()
    assert second.returncode == 2 and second.stderr == (f"error: --to {folder}: another export is writing into it "
                                                        f"now; wait for it to finish, or choose another --to\n")
    assert first == [0] and sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors",
                                                                        "vocab.json"]


def test_a_folder_a_refused_export_made_stays_while_another_export_holds_it(tmp_path):
    """Two exports into a new folder at once, the one refused having made it: its folder stays, since the other holds
    it (its lock) and is about to write into it; a folder made by an export refused alone is removed."""
    import fcntl

    from errors import UserError, output_folder

    folder = tmp_path / "new" / "export"
    with pytest.raises(UserError):
        with output_folder(folder, "--to"):
            other = os.open(folder, os.O_RDONLY)  # the other export's lock, taken once this one made the folder
            fcntl.flock(other, fcntl.LOCK_EX)
            raise UserError("another export is writing into it now")
    assert folder.is_dir()
    os.close(other)
    with pytest.raises(UserError):
        with output_folder(tmp_path / "alone" / "export", "--to"):
            raise UserError("refused")
    assert not (tmp_path / "alone").exists()


def test_an_unwritable_or_missing_place_and_a_stop_are_each_one_line_naming_the_folder(run_dir, tmp_path, capsys,
                                                                                         monkeypatch):
    """--to a folder this process may not write into is one line naming that folder (not the export's scratch folder
    inside it); --to a link to a place that is not there says so; a stop (Ctrl-C, SIGTERM) while the files are written
    says nothing was written and leaves an earlier export byte for byte, exit 130."""
    import tempfile

    import export
    from errors import run_cli

    locked = tmp_path / "locked"
    locked.mkdir()

    def refused(*args, **kwargs):  # as mkdtemp in a folder without write permission (root may write anywhere)
        raise PermissionError(13, "Permission denied")
    with monkeypatch.context() as patch:
        patch.setattr(tempfile, "mkdtemp", refused)
        assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(locked), "--onnx=false"]) == 2
    assert capsys.readouterr().err == (f"error: --to {locked} cannot be written (Permission denied); nothing was "
                                       f"written; choose another --to\n")
    assert list(locked.iterdir()) == []
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(link), "--onnx=false"]) == 2
    assert capsys.readouterr().err == (f"error: --to {link} is a broken link to {tmp_path / 'nowhere'}; "
                                       f"choose another --to\n")
    assert not (tmp_path / "nowhere").exists()
    folder = tmp_path / "export"
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(folder), "--onnx=false"]) == 0
    earlier = {p.name: p.read_bytes() for p in folder.iterdir()}

    def stopped(model, target):
        raise KeyboardInterrupt
    monkeypatch.setattr(export, "write_safetensors", stopped)
    capsys.readouterr()
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(folder), "--onnx=false"]) == 130
    assert capsys.readouterr().err.endswith(f"interrupted before anything was written into {folder}; what was there "
                                            f"is as it was\n")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == earlier


def test_an_export_refuses_a_folder_of_the_users_files_and_keeps_them_byte_for_byte(run_dir, tmp_path, capsys):
    """--to a folder that holds a file of the user's with a name export writes (a config.json not written by export; a
    link named model.onnx beside an earlier export) is refused in one line naming it, as is a folder of the user's
    other files, which the export's would land among; nothing there changes. An earlier export (config.json and
    vocab.json as export writes them) is replaced, a file of the user's beside it kept as it was."""
    import export
    from errors import run_cli

    def export_to(folder):
        code = run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(folder), "--onnx=false"])
        return code, capsys.readouterr().err
    mine, texts, earlier = tmp_path / "mine", tmp_path / "texts", tmp_path / "earlier"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": 1}\n')
    texts.mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (texts / name).write_text(name)
    assert export_to(earlier) == (0, "")
    weights = (earlier / "model.safetensors").read_bytes()
    (earlier / "model.safetensors").write_bytes(b"an earlier model's weights")
    (earlier / "README.md").write_text("my notes on this model")
    (tmp_path / "graph").write_bytes(b"the user's graph")
    (earlier / "model.onnx").symlink_to(tmp_path / "graph")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    way = "choose another --to, a new or empty folder"
    assert export_to(mine) == (2, f"error: --to {mine} holds config.json, not an earlier export's; {way}\n")
    assert export_to(texts) == (2, f"error: --to {texts} holds a.txt, b.txt, c.txt, ..., not an earlier export's; "
                                   f"{way}\n")
    assert export_to(earlier) == (2, f"error: --to {earlier} holds model.onnx, not an earlier export's; {way}\n")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    (earlier / "model.onnx").unlink()
    assert export_to(earlier) == (0, "")
    assert (earlier / "model.safetensors").read_bytes() == weights
    assert (earlier / "README.md").read_text() == "my notes on this model"


def test_an_onnx_exporter_that_fails_is_one_line_and_leaves_an_earlier_export_whole(run_dir, tmp_path, capsys,
                                                                                     monkeypatch):
    """ONNX packages that are there but fail (an onnxscript that does not match torch fails to import inside
    torch.onnx.export) make one line naming the failure and both fixes, exit 2; an earlier export stays byte for byte
    and a new folder is not left behind. Memory running out while exporting says so, without the packages' advice."""
    import export
    from errors import run_cli

    folder = tmp_path / "export"
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(folder), "--onnx=false"]) == 0
    earlier = {p.name: p.read_bytes() for p in folder.iterdir()}

    def mismatched(*args, **kwargs):
        raise ImportError("cannot import name 'ir' from 'onnxscript'\n(most likely a circular import)")
    monkeypatch.setattr(export, "ONNX_NEEDS", ())  # (as where the packages are installed)
    monkeypatch.setattr(torch.onnx, "export", mismatched)
    capsys.readouterr()
    for to in (folder, tmp_path / "new"):
        assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(to), "--onnx=true"]) == 2
        assert capsys.readouterr().err == (
            "error: the ONNX graph could not be exported (ImportError: cannot import name 'ir' from 'onnxscript'), so "
            "nothing was written; pip install --upgrade -r requirements-export.txt, or pass --onnx=false\n")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == earlier and not (tmp_path / "new").exists()
    monkeypatch.setattr(torch.onnx, "export", lambda *args, **kwargs: (_ for _ in ()).throw(
        RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")))
    assert run_cli(export.main, ["--out_dir", str(run_dir), "--to", str(folder), "--onnx=true"]) == 2
    assert capsys.readouterr().err == ("error: out of memory while exporting the ONNX graph, so nothing was written; "
                                       "free some memory, or pass --onnx=false\n")  # (no package advice)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == earlier


def test_exporting_a_run_still_training_says_which_step_it_exports(run_dir, tmp_path, capsys):
    """A run that a process holds (still training) is exported into its export/ folder (the default --to, the
    export's own), with a note naming the process and the step of the checkpoint exported; a run not held has none."""
    import shutil

    import export
    from common.run_folder import RunDir
    from errors import run_cli

    training = tmp_path / "training"
    training.mkdir()
    shutil.copy(run_dir / "ckpt_best.safetensors", training / "ckpt_best.safetensors")
    step = load_model(training / "ckpt_best.safetensors")[2]["iter"]
    busy = RunDir(training).claim(say=lambda message: None)
    try:
        assert run_cli(export.main, ["--out_dir", str(training), "--onnx=false"]) == 0
    finally:
        busy.release()
    err = capsys.readouterr().err
    assert err.startswith(f"note: process {os.getpid()} (") and err.count("\n") == 1, err
    assert err.endswith(f") is still training {training}; this export is of its ckpt_best.safetensors at step {step}\n")
    assert sorted(p.name for p in (training / "export").iterdir()) == ["config.json", "model.safetensors",
                                                                       "vocab.json"]
    assert run_cli(export.main, ["--out_dir", str(training), "--onnx=false"]) == 0 and capsys.readouterr().err == ""
