"""Run folders and checkpoints from someone else: a planted link anywhere in a run folder changes nothing outside it
(discovered from a real run's own listing, for a new run, --resume and --overwrite), a temporary name cannot be
guessed, and a checkpoint whose config asks for more than its weights hold is refused in one line by every reader
before anything is built."""
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import train
from conftest import ROOT, checkpoint_parts, module_corpus, patient, write_checkpoint
from common.run_folder import find, write_text_atomic
from errors import UserError, run_cli, shown
from training import checkpoint
from training.checkpoint import Progress

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what no line may print but newlines and tabs


def argv(corpus, out_dir, *extra):
    return ["--config", "debug", "--data", str(corpus), "--cache_dir", str(corpus.parent / "cache"),
            "--out_dir", str(out_dir), "--max_iters", "4", "--eval_interval", "2", *extra]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return module_corpus(tmp_path_factory, "hostile")


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory):
    """A finished run, and the names it wrote (with .replaced, where an --overwrite keeps the run it replaces)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run_cli(train.main, argv(corpus, out)) == 0
    return out


def copy_of(folder, where):
    """A copy of a run folder (cp -a: the files as they are) as where/run, where made if need be."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(folder), str(where / "run")], check=True)
    return where / "run"


def outside(tmp_path):
    """A file and a folder outside the run folder that a planted link points to; their bytes, to compare after."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "notes.txt").write_bytes(b"the user's own notes")
    return victim, docs


def state_of(*paths):
    return {p: (sorted(os.listdir(p)) if p.is_dir() else p.read_bytes()) for p in paths}


def test_a_planted_link_at_any_name_a_run_writes_is_refused_and_touches_nothing_outside(corpus, finished, tmp_path,
                                                                                       capsys):
    names = sorted(p.name for p in finished.iterdir()) + [".replaced"]  # the run's own listing
    assert {".lock", "ckpt_best.safetensors", "ckpt_last.safetensors", "summary.json"} <= set(names)
    assert any(name.startswith("events.out.tfevents.") for name in names)
    victim, docs = outside(tmp_path)
    before = state_of(victim, docs)
    for name in names:
        for target in (victim, docs):
            for how in (["--resume"], ["--overwrite"], []):
                where = tmp_path / f"case-{name}-{target.name}-{len(how) and how[0]}"
                where.mkdir()
                out = copy_of(finished, where) if how else where / "run"
                out.mkdir(exist_ok=True)
                (out / name).unlink(missing_ok=True)
                (out / name).symlink_to(target)
                code = run_cli(train.main, argv(corpus, out, *how))
                err = capsys.readouterr().err
                assert code == 2, (name, target, how, err)
                assert f"error: {out / name} is a link" in err and err.count("\n") == 1, err
                assert state_of(victim, docs) == before, (name, target, how)
                assert (out / name).is_symlink()  # the user's folder is left as it was, link included


def test_a_folder_of_the_users_with_a_link_is_refused_as_it_was_without_advice_to_remove_it(corpus, tmp_path, capsys):
    """--out_dir a folder that holds no run but a link and the user's files (as / or a home folder does): refused in
    one line that asks for a new or empty folder, not to remove the user's link, and the folder is left exactly as it
    was (no lock file of the run's)."""
    victim, _ = outside(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's notes")
    (mine / "sbin").symlink_to(victim)
    before = state_of(mine, victim)
    for how in ([], ["--overwrite"], ["--resume"]):
        assert run_cli(train.main, argv(corpus, mine, *how)) == 2
        assert capsys.readouterr().err == (f"error: {mine / 'sbin'} is a link, which a run never makes there; "
                                           f"choose a new or empty --out_dir\n"), how
        assert state_of(mine, victim) == before and sorted(os.listdir(mine)) == ["notes.txt", "sbin"]


def test_a_hard_linked_lock_or_a_pipe_is_refused(corpus, finished, tmp_path, capsys):
    victim, _ = outside(tmp_path)
    out = copy_of(finished, tmp_path)
    (out / ".lock").unlink()
    os.link(victim, out / ".lock")  # a second name of a file outside: writing the lock would change it
    assert run_cli(train.main, argv(corpus, out, "--resume")) == 2
    assert "is a hard link to another file" in capsys.readouterr().err
    assert victim.read_bytes() == b"the user's own file"
    (out / ".lock").unlink()
    os.mkfifo(out / "ckpt_best.safetensors.tmp-1")  # a pipe would block whoever opened it
    assert run_cli(train.main, argv(corpus, out, "--resume")) == 2
    assert f"{out / 'ckpt_best.safetensors.tmp-1'} is not a plain file or folder" in capsys.readouterr().err


def test_an_atomic_write_never_follows_a_planted_temporary_name(tmp_path):
    victim, _ = outside(tmp_path)
    target = tmp_path / "figures.json"
    planted = tmp_path / f"figures.json.tmp-{os.getpid()}"  # a name anyone can guess: the file's, then the pid
    planted.symlink_to(victim)
    write_text_atomic(target, "{}\n", "the figures file", "--json")
    assert victim.read_bytes() == b"the user's own file"
    assert target.read_text() == "{}\n" and not target.is_symlink() and planted.is_symlink()
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())  # not mkstemp's private 0600


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_readers_message_during_a_running_overwrite_says_what_is_true(corpus, finished, tmp_path):
    """While an --overwrite trains towards its first evaluation after step 0, the old run waits in .replaced/: a reader
    says so and names the process, instead of suggesting a --resume the lock would refuse."""
    out = copy_of(finished, tmp_path)
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"),
                             *argv(corpus, out, "--overwrite", "--max_iters", "100000", "--eval_interval", "50000")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time
        deadline = time.time() + patient(60)
        while not ((out / ".replaced").is_dir() and (out / "ckpt_last.safetensors").is_file()):
            assert time.time() < deadline
            time.sleep(0.05)
        with pytest.raises(UserError, match=rf"is being replaced by an --overwrite run \(process {proc.pid} "):
            find(str(out), "")
    finally:
        proc.kill()
        proc.wait()


# ---- a planted .replaced/ (the keep-aside of --overwrite) ------------------------------------------------------
def files_of(folder):
    """Every file under folder (hidden ones included) with its bytes, and every folder, to compare after; the run
    folder's lock by name only (each owner writes its pid there)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and p.name != ".lock" else None)
            for p in sorted(folder.rglob("*"))}


def plant(out, files, record=None):
    aside = out / ".replaced"
    aside.mkdir()
    for name, data in files.items():
        (aside / name).write_bytes(data)
    if record is not None:
        (aside / "set_aside.json").write_text(json.dumps({"set_aside": record}))
    return aside


@pytest.mark.parametrize("planted", ["empty", "lock", "forged record over a finished run", "record naming .lock"])
def test_a_planted_replaced_folder_moves_and_deletes_nothing(corpus, finished, tmp_path, capsys, planted, script):
    """A .replaced/ that no interrupted --overwrite left (empty; holding a .lock that put back would have moved over
    the owner's lock; a record that matches its files, beside a finished run; a record naming .lock) is refused in
    one line by a new run, --resume and --overwrite, every file of the folder kept byte for byte; sample.py reads the
    finished run as if the folder were not there."""
    out = copy_of(finished, tmp_path)
    last = (out / "ckpt_last.safetensors").read_bytes()
    if planted == "empty":
        plant(out, {})
    elif planted == "lock":
        plant(out, {".lock": b"0\n"})
    elif planted == "forged record over a finished run":
        plant(out, {"ckpt_last.safetensors": last}, {"ckpt_last.safetensors": len(last)})
    else:
        plant(out, {".lock": b"0\n"}, {".lock": 2})
    lock_inode = os.stat(out / ".lock").st_ino
    before = files_of(out)
    for how in ([], ["--resume"], ["--overwrite"]):
        assert run_cli(train.main, argv(corpus, out, *how)) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {out}") and err.count("\n") == 1, (how, err)
        assert "nothing was moved or deleted" in err or "neither is deleted" in err, err
        assert files_of(out) == before, how
        assert os.stat(out / ".lock").st_ino == lock_inode  # the lock a second process would meet is the same file
    if planted != "forged record over a finished run":  # (a record that matches: a reader says what it sees)
        result = script("sample.py", "--out_dir", str(out), "--max_new_tokens", "5")
        assert result.returncode == 0, result.stderr
    assert files_of(out) == before


def test_a_record_that_proves_an_interrupted_overwrite_puts_the_old_run_back(corpus, finished, tmp_path, capsys):
    """The run folder's own record (names and sizes, written before the old run moved, with the identities of the
    folder and of .replaced/) and a replacement that has only an untrained step-0 run: the next owner restores the old
    run exactly and moves the replacement's files into a folder named with the time, deleting nothing; a record whose
    sizes do not match, or the same folder copied elsewhere (cp -a: the identities differ), is refused, nothing
    moved."""
    out = copy_of(finished, tmp_path)
    before = files_of(out)
    (tmp_path / "new").mkdir()
    replacement = tmp_path / "new" / "run"
    assert run_cli(train.main, argv(corpus, replacement, "--max_iters", "0")) == 0  # step 0 only
    from common.run_folder import RunDir
    with_lock = RunDir(out).claim(lambda m: None)
    assert with_lock.set_aside()
    with_lock.release()
    for name in ("ckpt_last.safetensors", "ckpt_best.safetensors"):
        (out / name).write_bytes((replacement / name).read_bytes())
    written = (out / ".replaced" / "set_aside.json").read_text()
    record = json.loads(written)["set_aside"]
    assert set(record) == {n for n in before if n != ".lock"} and (out / ".replaced" / "summary.json").is_file()

    (tmp_path / "copied").mkdir()
    copied = copy_of(out, tmp_path / "copied")
    kept = files_of(copied)
    assert run_cli(train.main, argv(corpus, copied, "--resume")) == 2
    err = capsys.readouterr().err
    assert "was not written for this folder" in err and "nothing was moved or deleted" in err, err
    assert files_of(copied) == kept
    wrong = {**json.loads(written), "set_aside": {**record, "ckpt_last.safetensors": record["ckpt_last.safetensors"] + 1}}
    (out / ".replaced" / "set_aside.json").write_text(json.dumps(wrong))  # one size wrong, in the folder itself
    kept = files_of(out)
    assert run_cli(train.main, argv(corpus, out, "--resume")) == 2
    err = capsys.readouterr().err
    assert "ckpt_last.safetensors is not the file its record lists" in err and "nothing was moved or deleted" in err, err
    assert files_of(out) == kept
    (out / ".replaced" / "set_aside.json").write_text(written)

    assert run_cli(train.main, argv(corpus, out, "--resume")) == 0  # restored, then found finished
    out_text = capsys.readouterr()
    assert "restored the old run in" in out_text.out + out_text.err
    [apart] = out.glob("undone_overwrite_*")  # the replacement's untrained checkpoints, moved aside, not deleted
    after = files_of(out)
    assert {name: after.pop(f"{apart.name}/{name}") for name in ("ckpt_last.safetensors", "ckpt_best.safetensors")} == {
        name: (replacement / name).read_bytes() for name in ("ckpt_last.safetensors", "ckpt_best.safetensors")}
    assert after == {**before, apart.name: None}


def test_only_a_runs_own_temporary_names_are_cleared_from_its_folder(corpus, finished, tmp_path):
    """The folder's next owner removes what an interrupted atomic write left (NAME.tmp-XXXXXXXX for the files a run
    writes) and nothing else whose name holds .tmp-."""
    out = copy_of(finished, tmp_path)
    mine = {"notes.tmp-1": b"mine", "data.tmp-old.txt": b"also mine", "ckpt_last.safetensors.tmp-mine": b"a name of mine"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    (out / "ckpt_last.safetensors.tmp-ab12cd34").write_bytes(b"half a checkpoint")
    assert run_cli(train.main, argv(corpus, out, "--resume")) == 0
    assert {name: (out / name).read_bytes() for name in mine} == mine
    assert not (out / "ckpt_last.safetensors.tmp-ab12cd34").exists()


def test_a_foreign_checkpoint_cannot_make_a_resume_copy_a_file_or_write_outside_the_run(corpus, finished, tmp_path,
                                                                                         capsys, monkeypatch):
    """A checkpoint whose run config names another text (a private file) and another cache: --resume refuses in one
    line before any token file is written, and creates no file anywhere: not in the cache it names, not in the
    user's cache, not beside the private file."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "secret.txt").write_text("the user's private words, not the run's text\n" * 50)
    evil_cache = tmp_path / "elsewhere"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    out = copy_of(finished, tmp_path)
    forged(out / "ckpt_last.safetensors", out / "ckpt_last.safetensors",
           run_config={"data": str(private / "secret.txt"), "cache_dir": str(evil_cache), "max_iters": 8})
    before = files_of(tmp_path)
    assert run_cli(train.main, ["--out_dir", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "is not the text it was trained on" in err and err.count("\n") == 1, err
    assert files_of(tmp_path) == before
    # the text it trained on, given again, resumes into the user's own cache (the command line's), not the named one
    assert run_cli(train.main, ["--out_dir", str(out), "--resume", "--data", str(corpus),
                                "--cache_dir", str(tmp_path / "my-cache")]) == 0
    assert not evil_cache.exists() and (tmp_path / "my-cache" / "prepared").is_dir()


# ---- checkpoints from strangers ---------------------------------------------------------------------------------
def forged(source, where, model=None, drop=(), **changes):
    """A copy of a real checkpoint with settings changed (a dict value merged into the one it replaces), weights
    replaced (model: name -> tensor) and tensors dropped."""
    tensors, settings = checkpoint_parts(source)
    for key, value in changes.items():
        old = settings.get(key)
        settings[key] = {**old, **value} if isinstance(value, dict) and isinstance(old, dict) else value
    tensors.update({f"model.{name}": t for name, t in (model or {}).items()})
    return write_checkpoint(where, {k: t for k, t in tensors.items() if k not in drop}, settings)


def with_header(where, header: bytes, length: int | None = None):
    """A file that begins as a safetensors file does: its header's length (by default the header's), then header."""
    where.write_bytes((len(header) if length is None else length).to_bytes(8, "little") + header)
    return where


@pytest.fixture(scope="module")
def rotary(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("rotary") / "run"
    assert run_cli(train.main, argv(corpus, out, "--position", "rope", "--max_iters", "2")) == 0
    return out / "ckpt_last.safetensors"


def old_checkpoint(source, where):
    """The checkpoint of the format before: the same state as one torch.save file, as that version wrote it."""
    state = checkpoint.load(source, resume=True)
    torch.save({**state, "format": 1}, where)
    return where


def hostile_checkpoints(finished, rotary, tmp_path):
    """(file, what the one line says) for files that are not what they claim, settings that ask for more than the
    file holds, tensors that do not fit the settings, and fields of a wrong type."""
    last = finished / "ckpt_last.safetensors"
    tensors, settings = checkpoint_parts(last)
    vocab, text = settings["vocab"], json.dumps(settings)
    deep = "[" * 100_000 + "]" * 100_000
    return [
        (old_checkpoint(last, tmp_path / "old.pt"), "convert it once: python scripts/convert_checkpoint.py"),
        (with_header(tmp_path / "huge_header", b"{}", 2**60), f"its header says {2**60:,} bytes"),
        (with_header(tmp_path / "big_header", b" " * (17 << 20)), "a checkpoint's takes at most 16,777,216"),
        (with_header(tmp_path / "garbage", b"{not json"), "not a readable checkpoint (SafetensorError"),
        (with_header(tmp_path / "nested", json.dumps({"__metadata__": {"chargpt": deep}}).encode()),
         "nested 100,000 deep"),
        (with_header(tmp_path / "objects", json.dumps({"__metadata__": {"chargpt": "[" + "{}," * 2_000_000 + "{}]"}})
                     .encode()), "in 2,000,002 lists and objects (at most 2,000,000)"),
        (with_header(tmp_path / "digits", json.dumps({"__metadata__": {"chargpt": text.replace(
            '"iter": ', '"iter": ' + "9" * 10_000 + ', "x": ', 1)}}).encode()), "its settings are not JSON"),
        (forged(last, tmp_path / "deep.pt", model_config={"n_layer": 200, "n_embd": 8192}),
         "its tensors do not fit its settings (model.blocks.10."),
        (forged(last, tmp_path / "wide.pt", model_config={"n_embd": 8192, "n_head": 2}),
         f"(model.wte.weight: the settings give ({len(vocab)}, 8192) of F32/F16/BF16/F64, the file holds "
         f"({len(vocab)}, 32) of F32)"),
        (forged(rotary, tmp_path / "long.pt", model_config={"block_size": 10**9}),  # rotary tables are not saved
         "its model would need about"),
        (forged(last, tmp_path / "extra.pt", model={"extra.weight": torch.zeros(3)}),
         "(model.extra.weight: the settings give no such tensor, the file holds a tensor (3,))"),
        (forged(last, tmp_path / "missing.pt", drop=("model.ln_f.weight",)),
         "(model.ln_f.weight: the settings give (32,), the file holds no such tensor)"),
        (forged(last, tmp_path / "half.pt", model={"ln_f.weight": torch.ones(32, dtype=torch.int32)}),
         "the file holds (32,) of I32"),
        (forged(last, tmp_path / "word.pt", model_config={"bias": "yes"}),
         "is damaged: in its model config: bias = 'yes' should be of type bool"),
        (forged(last, tmp_path / "string.pt", run_config={"batch_size": "16"}),
         "is damaged: batch_size = '16' should be of type int"),
        (forged(last, tmp_path / "list.pt", data=["shakespeare"]), "is damaged: data is a list"),
        (forged(last, tmp_path / "losses.pt", losses={"train": [("5", 1.0)]}),
         "is damaged: its record of the losses so far is malformed"),
        (forged(last, tmp_path / "later.pt", losses={"eval": [(10**6, 1.0, 1.0)]}),  # a step past the checkpoint's
         "is damaged: its record of the losses so far is malformed"),
        (forged(last, tmp_path / "twice.pt", vocab=vocab[:-1] + vocab[0]),
         "(ValueError: the vocabulary must not repeat a character)"),
        (forged(last, tmp_path / "short.pt", vocab=vocab[:-1]),
         f"is inconsistent: {len(vocab) - 1} characters for a model of {len(vocab)}"),
        (forged(last, tmp_path / "huge.pt", model_config={"n_embd": 2**70}),
         "(ValueError: n_embd must be at most 2,147,483,647, got 1,180,591,620,717,411,303,424)"),
        (forged(last, tmp_path / "title.pt", data={"source": "\x1b]2;OWNED\x07\x1b[2J"}, iter="\x1b[2J"),
         "iter is '\\x1b[2J'"),
    ]


def test_every_reader_refuses_a_hostile_checkpoint_in_one_line_quickly_before_building_it(corpus, finished, rotary,
                                                                                         tmp_path, capsys,
                                                                                         monkeypatch):
    """Each hostile file, handed to every reader (the scripts, --init_from, --resume, the Python API): one line, exit
    2, within seconds, no control character printed, and no model built beyond the meta device."""
    import attention_html
    import attention_map
    import evaluate
    import export
    import hubconf
    import sample
    from model import gpt
    built = []
    original = gpt.GPT.__init__

    def recording(self, config):  # every model built for real (not on the meta device) is counted
        original(self, config)
        if next(self.parameters()).device.type != "meta":
            built.append(config)
    monkeypatch.setattr(gpt.GPT, "__init__", recording)
    for path, said in hostile_checkpoints(finished, rotary, tmp_path):
        resumed = copy_of(finished, tmp_path / f"resume-{path.name}")
        (resumed / "ckpt_last.safetensors").write_bytes(path.read_bytes())
        readers = {
            "sample.py": lambda: run_cli(sample.main, ["--ckpt", str(path), "--max_new_tokens", "3"]),
            "evaluate.py": lambda: run_cli(evaluate.main, ["--ckpt", str(path), "--data", str(corpus)]),
            "export.py": lambda: run_cli(export.main, ["--ckpt", str(path), "--to", str(tmp_path / "export")]),
            "attention_map.py": lambda: run_cli(attention_map.main, ["--ckpt", str(path), "--text", "ab", "--png",
                                                                     str(tmp_path / "a.png")]),
            "attention_html.py": lambda: run_cli(attention_html.main, ["--ckpt", str(path), "--html",
                                                                       str(tmp_path / "a.html")]),
            "--init_from": lambda: run_cli(train.main, argv(corpus, tmp_path / f"init-{path.stem}", "--init_from",
                                                            str(path))),
            "--resume": lambda: run_cli(train.main, ["--out_dir", str(resumed), "--resume", "--max_iters", "8"]),
        }
        for reader, call in readers.items():
            started = time.monotonic()
            assert call() == 2, (reader, path)
            err = capsys.readouterr().err
            assert said in err and err.count("\n") == 1 and err.startswith("error: "), (reader, path, err)
            assert not CONTROL.search(err[:-1]) and time.monotonic() - started < 30, (reader, path, err)
        with pytest.raises(ValueError) as refused:
            hubconf.chargpt(str(path))
        assert said in shown(str(refused.value)), (path, refused.value)
        assert built == [], (path, built)
    assert not list(tmp_path.glob("a.*")) and not (tmp_path / "export").exists()


def test_an_old_checkpoint_converts_once_and_samples_the_same_text(finished, tmp_path, script):
    """A checkpoint of the old format (torch.save of the state dict that version saved) is refused by sample.py in
    one line naming the converter; converted, the old file is kept and the new one samples the very text the run's
    own checkpoint samples, and resumes; a second conversion, or a file that is no checkpoint, is one line, exit 2."""
    old = old_checkpoint(finished / "ckpt_last.safetensors", tmp_path / "ckpt_last.pt")
    before = old.read_bytes()
    refused = script("sample.py", "--ckpt", str(old))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"convert it once: python scripts/convert_checkpoint.py {old}" in refused.stderr
    folder = tmp_path / "old_run"  # a run folder of the old format: --resume and --out_dir name the converter too
    folder.mkdir()
    (folder / "ckpt_last.pt").write_bytes(before)
    for refused in (script("sample.py", "--out_dir", str(folder)),
                    subprocess.run([sys.executable, str(ROOT / "train.py"), "--out_dir", str(folder), "--resume"],
                                   capture_output=True, text=True, timeout=300)):
        assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == (
            f"error: {folder} holds checkpoints of the old format (.pt); "
            f"convert them once: python scripts/convert_checkpoint.py {folder}"), refused.stderr
    converted = script("convert_checkpoint.py", str(folder))  # the command the line names converts the run
    assert converted.returncode == 0 and (folder / "ckpt_last.safetensors").is_file(), converted.stderr
    again = script("convert_checkpoint.py", str(folder))  # a folder again: what was converted is passed over
    assert again.returncode == 0 and "was converted before" in again.stderr, again.stderr
    new = script("convert_checkpoint.py", str(folder / "ckpt_last.safetensors"))  # never "remove it first"
    assert new.returncode == 2 and new.stderr == (f"error: {folder / 'ckpt_last.safetensors'} is already of the new "
                                                  f"format; nothing to convert\n"), new.stderr
    done = script("convert_checkpoint.py", str(old))
    assert done.returncode == 0 and f"wrote {tmp_path / 'ckpt_last.safetensors'}" in done.stdout, done.stderr
    assert old.read_bytes() == before
    samples = [script("sample.py", "--ckpt", str(path), "--max_new_tokens", "60", "--seed", "7").stdout
               for path in (finished / "ckpt_last.safetensors", tmp_path / "ckpt_last.safetensors")]
    assert samples[0] == samples[1] and len(samples[0]) > 60
    new, ours = checkpoint.load(tmp_path / "ckpt_last.safetensors", resume=True), checkpoint.load(
        finished / "ckpt_last.safetensors", resume=True)
    torch.testing.assert_close(new["optimizer"]["state"], ours["optimizer"]["state"], rtol=0, atol=0)
    assert new["rng"]["torch"].equal(ours["rng"]["torch"]) and new["losses"] == ours["losses"]
    again = script("convert_checkpoint.py", str(old))
    assert again.returncode == 2 and "already exists" in again.stderr and again.stderr.count("\n") == 1
    (tmp_path / "not.pt").write_bytes(b"PK\x03\x04 no zip")
    bad = script("convert_checkpoint.py", str(tmp_path / "not.pt"))
    assert bad.returncode == 2 and "nothing was written" in bad.stderr and not (tmp_path / "not.safetensors").exists()


def test_resume_refuses_a_run_config_that_asks_for_another_model(corpus, finished, tmp_path, capsys):
    (tmp_path / "runcfg").mkdir()
    out = copy_of(finished, tmp_path / "runcfg")
    forged(out / "ckpt_last.safetensors", out / "ckpt_last.safetensors", run_config={"n_layer": 200, "n_embd": 8192})
    before = (out / "ckpt_last.safetensors").read_bytes()
    assert run_cli(train.main, ["--out_dir", str(out), "--resume", "--max_iters", "8"]) == 2
    err = capsys.readouterr().err
    assert "is damaged: its run config and its model config disagree on n_layer (200 and 2)" in err, err
    assert err.count("\n") == 1 and (out / "ckpt_last.safetensors").read_bytes() == before


def test_control_characters_in_a_checkpoint_reach_no_terminal(finished, tmp_path):
    """A data.source that sets the terminal's title and clears its screen: sample.py prints it escaped."""
    path = forged(finished / "ckpt_best.safetensors", tmp_path / "title.safetensors",
                  data={"source": "\x1b]2;OWNED\x07\x1b[2J"})
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sample.py"), "--ckpt", str(path),
                           "--max_new_tokens", "20"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not CONTROL.search(done.stdout + done.stderr.replace("\n", "")) and "\\x1b]2;OWNED" in done.stderr + done.stdout


# ---- one signal is enough; the smaller ones --------------------------------------------------------------------
def test_one_sigterm_during_a_long_evaluation_sample_stops_the_run_with_its_evaluation_saved(corpus, tmp_path):
    """A sample of 100,000 characters at each evaluation takes minutes on a CPU: a SIGTERM (timeout, docker stop)
    inside it ends the sample there (not minutes later, once the sample is done), saves the step-0 checkpoints and
    exits."""
    import signal
    import time
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *argv(corpus, out, "--sample_chars", "100000")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + patient(60)
        while not any(out.glob("events.*")):  # the sample follows the step-0 evaluation at once
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=patient(30))
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert "stopped at step 0" in stdout and checkpoint.load(out / "ckpt_last.safetensors")["iter"] == 0


def test_settings_that_make_one_sample_or_the_threads_unbounded_are_refused(corpus, tmp_path, capsys):
    for flag, value, said in (("--sample_chars", "100001", "--sample_chars 100001: must be at most 100,000"),
                              ("--num_threads", "100000", "--num_threads 100000: must be at most 1,024")):
        assert run_cli(train.main, argv(corpus, tmp_path / "run", flag, value)) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_under_torchrun_the_stop_note_names_the_step_where_the_processes_stop(capfd):
    import signal
    import time
    with train.StopRequest() as stop:
        stop.training(Progress(it=56), agree_every=10)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
    assert ("stopping: training on to step 60, where the processes stop together, then saving ckpt_last.safetensors"
            in capfd.readouterr().err)


def test_a_checkpoint_on_a_full_disk_names_the_full_disk(finished, tmp_path, monkeypatch):
    """A disk that fills during the write: the line says what the disk said, and nothing is left behind."""
    import errno
    import io
    from common import run_folder

    class Full(io.BytesIO):
        def write(self, data):
            if self.tell() + len(data) > 50_000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)

    def full_disk(fd, mode):
        os.close(fd)
        return Full()
    state = checkpoint.load(finished / "ckpt_last.safetensors", resume=True)
    monkeypatch.setattr(run_folder.os, "fdopen", full_disk)
    with pytest.raises(UserError, match=r"could not write checkpoint .*ckpt\.safetensors \(No space left on device\); "
                                        r"nothing was written; free some disk space"):
        checkpoint.save(state, tmp_path / "ckpt.safetensors")
    assert not list(tmp_path.iterdir())


def test_a_full_disk_at_the_last_checkpoint_says_the_best_one_was_written(corpus, tmp_path, capsys, monkeypatch):
    """The disk fills between the best checkpoint and the last one of the first evaluation: the line says that only
    the best one was written (not that nothing was), and that file reads well."""
    import errno
    from common import run_folder
    real = checkpoint.save

    def full_at_last(state, path):
        if path.name == run_folder.LAST:
            def full(f):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            run_folder.write_atomic(path, full, "checkpoint")
        real(state, path)
    monkeypatch.setattr(checkpoint, "save", full_at_last)
    out = tmp_path / "run"
    assert run_cli(train.main, argv(corpus, out)) == 2
    err = capsys.readouterr().err
    assert f"(No space left on device); only {out / run_folder.BEST} was written; free some disk space" in err, err
    assert "nothing was written" not in err and checkpoint.load(out / run_folder.BEST)["iter"] == 0


def test_an_out_dir_that_cannot_be_made_says_so(corpus, capsys):
    assert run_cli(train.main, argv(corpus, "/proc/chargpt-run")) == 2
    assert capsys.readouterr().err == ("error: --out_dir /proc/chargpt-run cannot be written (No such file or "
                                       "directory); choose another --out_dir\n")


def test_a_text_of_one_character_says_there_is_nothing_to_learn_and_its_plot_is_drawn(tmp_path, capsys, script):
    one = tmp_path / "one.txt"
    one.write_text("a" * 3000)
    out = tmp_path / "$a$ run"  # a folder name matplotlib would take for mathematics
    assert run_cli(train.main, ["--config", "debug", "--data", str(one), "--cache_dir", str(tmp_path / "cache"),
                                "--out_dir", str(out), "--max_iters", "4", "--eval_interval", "2"]) == 0
    said = capsys.readouterr().out
    assert f"note: {one} holds one distinct character, 'a': there is nothing to learn" in said
    done = script("plot_run.py", "--out_dir", str(out), "--png", str(tmp_path / "loss.png"))
    assert done.returncode == 0 and "Traceback" not in done.stderr and "warn" not in done.stderr.lower(), done.stderr
    assert (tmp_path / "loss.png").stat().st_size > 0


def test_the_attention_map_of_a_model_without_layers_is_one_line(corpus, tmp_path, script):
    out = tmp_path / "bigram"
    assert run_cli(train.main, argv(corpus, out, "--n_layer", "0", "--max_iters", "2")) == 0
    done = script("attention_map.py", "--out_dir", str(out), "--text", "ab", "--png", str(tmp_path / "a.png"))
    assert done.returncode == 2 and done.stderr == (
        f"error: {out / 'ckpt_best.safetensors'} has no attention layers (n_layer 0); choose a model with blocks\n")


def test_bench_prepare_says_why_its_child_failed(monkeypatch, script):
    import bench_prepare
    monkeypatch.setattr(bench_prepare, "CHILD", "import sys; print('error: no space left for the cache', "
                                                "file=sys.stderr); sys.exit(2)  # {root} {corpus} {cache}")
    done = script("bench_prepare.py", "--mb", "1")
    assert done.returncode == 2 and done.stderr == (
        "error: preparing the 1 MB corpus failed: no space left for the cache\n")


@pytest.mark.distributed
def test_a_torchrun_worker_killed_leaves_one_line_from_the_other(corpus, tmp_path):
    import signal
    import time
    out = tmp_path / "ddp"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(ROOT / "train.py"), *argv(corpus, out, "--max_iters", "100000", "--eval_interval",
                                                          "100000", "--log_interval", "1")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + patient(90)
        while not (out / "ckpt_last.safetensors").exists():
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(1.0)
        workers = subprocess.run(["pgrep", "-f", f"train.py .*--out_dir {out}"], capture_output=True, text=True)
        os.kill(max(int(pid) for pid in workers.stdout.split()), signal.SIGKILL)  # the later-started worker
        _, stderr = proc.communicate(timeout=patient(60))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "[rank0]: Traceback" not in stderr, stderr[-3000:]
    line = next((line for line in stderr.splitlines() if line.startswith("error: ")), stderr[-3000:])
    assert line.startswith("error: another process of this run ended unexpectedly (") and "peer" in line, line
    assert line.endswith("(step 0), is intact. Run the same torchrun command with --resume"), line


def test_attention_of_a_model_whose_numbers_overflow_is_one_line_not_a_blank_picture(finished, tmp_path, script):
    state = checkpoint.load(finished / "ckpt_best.safetensors")
    for name in [n for n in state["model"] if n.endswith("attn.c_attn.weight")]:  # finite weights, scores past float32
        state["model"][name] = state["model"][name] * 1e30
    checkpoint.save(state, tmp_path / "loud.pt")
    for command in (["attention_map.py", "--png", str(tmp_path / "a.png")],
                    ["attention_html.py", "--html", str(tmp_path / "a.html")]):
        done = script(command[0], "--ckpt", str(tmp_path / "loud.pt"), "--text", "ab", *command[1:])
        assert done.returncode == 2 and done.stderr == (
            f"error: {tmp_path / 'loud.pt'}: the model's attention weights are not numbers (NaN or inf): its weights are "
            f"too large\n"), done.stderr
    assert not list(tmp_path.glob("a.*"))


def test_weights_that_diverged_are_not_written_and_the_line_names_the_cause_and_the_fix(tmp_path):
    """A learning rate that makes the weights infinite (1e308, say) ends at the next checkpoint with one line naming
    the divergence and the fix, the previous checkpoint kept byte for byte."""
    path = tmp_path / "ckpt_last.safetensors"
    checkpoint.save({"model": {"w": torch.ones(2)}}, path)
    before = path.read_bytes()
    with pytest.raises(UserError, match=r"w holds NaN or inf \(training diverged\), so the last one is kept; try a "
                                        r"lower --learning_rate or --dtype float32, then --resume"):
        checkpoint.save({"model": {"w": torch.tensor([1.0, float("inf")])}}, path)
    assert path.read_bytes() == before
