"""Data: tokenizer round-trips, preparation and its cache, batches, named corpora, and bad input."""
import contextlib
import io
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import data.corpus as corpus_module
from conftest import SHARED_TEXT, num_val_windows
from data import Batches, CharTokenizer, prepare, resolve
from data.tokenizer import token_dtype
from errors import UserError, run_cli


def prepared_from(text: str, tmp_path: Path, name="corpus.txt", **kwargs):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return prepare(resolve(str(path), tmp_path / "cache"), tmp_path / "cache", **kwargs)


# --- tokenizer -------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["First Citizen:\nBefore we proceed any further, hear me speak.",
                                  "ROMEO 说：你好，世界！Hello, 世界 — ça va? 🙂"])
def test_tokenizer_round_trip(text):
    tok = CharTokenizer("".join(sorted(set(text))))
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode_array(text).tolist() == ids


def test_token_dtype_is_the_smallest_that_fits():
    assert token_dtype(65) == np.uint8 and token_dtype(256) == np.uint8
    assert token_dtype(257) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


def test_large_unicode_vocabulary_is_stored_as_uint16(tmp_path):
    text = "".join(chr(0x4E00 + i) for i in range(600)) * 3 + "abc\n"
    prepared = prepared_from(text, tmp_path)
    assert prepared.meta["vocab_size"] == 604 and prepared.meta["dtype"] == "uint16"
    tokens = np.concatenate([np.fromfile(prepared.path(s), dtype=np.uint16) for s in ("train", "val")])
    assert prepared.tokenizer.decode(tokens) == text


# --- preparation ------------------------------------------------------------------------------
def test_prepare_splits_and_round_trips_real_text(tmp_path, small_text):
    if SHARED_TEXT.exists():  # the well-known figures of Tiny Shakespeare
        prepared = prepare(resolve(str(SHARED_TEXT), tmp_path), tmp_path)
        text = SHARED_TEXT.read_text(encoding="utf-8")
        assert (prepared.meta["vocab_size"], prepared.meta["n_train"], prepared.meta["n_val"]) == (65, 1003854, 111540)
    else:
        text = small_text
        prepared = prepared_from(text, tmp_path)
        assert prepared.meta["n_train"] == int(len(text) * 0.9)
    train = np.fromfile(prepared.path("train"), dtype=np.uint8)
    val = np.fromfile(prepared.path("val"), dtype=np.uint8)
    assert prepared.tokenizer.decode(train) + prepared.tokenizer.decode(val) == text
    assert len(val) == len(text) - int(len(text) * 0.9)


def test_cache_is_reused_and_invalidated(tmp_path):
    first = prepared_from("hello world\n" * 50, tmp_path)
    again = prepared_from("hello world\n" * 50, tmp_path)
    assert not first.reused and again.reused and again.dir == first.dir
    changed = prepared_from("hello there\n" * 50, tmp_path)
    assert not changed.reused and changed.dir != first.dir
    other_split = prepared_from("hello world\n" * 50, tmp_path, val_fraction=0.2)
    assert not other_split.reused and other_split.meta["n_val"] == 120


def test_a_cached_text_under_another_name_is_reported_by_that_name(tmp_path):
    first = prepared_from("hello world\n" * 50, tmp_path, name="first.txt")
    copy = prepared_from("hello world\n" * 50, tmp_path, name="copy.txt")
    assert copy.reused and copy.dir == first.dir
    assert (first.meta["source"], copy.meta["source"]) == (str(tmp_path / "first.txt"), str(tmp_path / "copy.txt"))


def test_interrupted_prepare_leaves_no_cache_that_is_trusted(tmp_path, monkeypatch):
    def crash(self, text):
        raise KeyboardInterrupt
    monkeypatch.setattr(CharTokenizer, "encode_array", crash)
    with pytest.raises(KeyboardInterrupt):
        prepared_from("some text\n" * 30, tmp_path)
    assert list((tmp_path / "cache" / "prepared").iterdir()) == []  # the temp folder was cleaned up
    monkeypatch.undo()
    prepared = prepared_from("some text\n" * 30, tmp_path)
    assert not prepared.reused and prepared.meta["n_chars"] == 300


def test_folder_of_files_is_joined_in_sorted_order(tmp_path):
    folder = tmp_path / "texts"
    (folder / "b").mkdir(parents=True)
    (folder / "b" / "2.txt").write_text("second")
    (folder / "a.txt").write_text("first")
    (folder / "c.bin").write_bytes(b"\x00\x01binary")
    (folder / ".hidden.txt").write_text("hidden")
    corpus = resolve(str(folder), tmp_path / "cache", say=lambda msg: None)
    assert [p.name for p in corpus.files] == ["a.txt", "2.txt"]
    prepared = prepare(corpus, tmp_path / "cache", val_fraction=0.5)
    tokens = np.concatenate([np.fromfile(prepared.path(s), dtype=np.uint8) for s in ("train", "val")])
    assert prepared.tokenizer.decode(tokens) == "first\nsecond"


# --- batches -------------------------------------------------------------------------------------
def test_batches_shapes_targets_and_determinism(tmp_path, small_text):
    prepared = prepared_from(small_text, tmp_path)
    batches = Batches(prepared, block_size=32, batch_size=5, device="cpu", seed=7)
    x, y = batches.get_batch("train")
    assert x.shape == y.shape == (5, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y):  # each window is real text followed by its next character
        window = prepared.tokenizer.decode(row_x) + prepared.tokenizer.decode(row_y[-1:])
        assert window in small_text
    same = Batches(prepared, block_size=32, batch_size=5, device="cpu", seed=7).get_batch("train")
    other = Batches(prepared, block_size=32, batch_size=5, device="cpu", seed=8).get_batch("train")
    assert torch.equal(same[0], x) and not torch.equal(other[0], x)


def test_batch_stream_resumes_from_its_state(tmp_path, small_text):
    batches = Batches(prepared_from(small_text, tmp_path), 16, 4, "cpu", seed=3)
    batches.get_batch("train")
    state = batches.state_dict()
    expected = [batches.get_batch(s)[0] for s in ("train", "val", "train")]
    fresh = Batches(prepared_from(small_text, tmp_path), 16, 4, "cpu", seed=99)
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.get_batch(s)[0], e) for s, e in zip(("train", "val", "train"), expected))


def test_fixed_batches_are_the_same_at_every_call_and_leave_the_training_stream_alone(tmp_path, small_text):
    prepared = prepared_from(small_text, tmp_path)
    batches = Batches(prepared, 16, 4, "cpu", seed=3)
    untouched = Batches(prepared, 16, 4, "cpu", seed=3)
    first = {split: list(batches.fixed_batches(split, 3)) for split in ("train", "val")}
    assert all(torch.equal(batches.get_batch("train")[0], untouched.get_batch("train")[0]) for _ in range(3))
    for split, drawn in first.items():
        again = list(batches.fixed_batches(split, 3))
        assert len(again) == 3 and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                       for a, b in zip(drawn, again))
        assert not torch.equal(drawn[0][0], drawn[1][0])  # three different batches, not one three times
    window = prepared.tokenizer.decode(first["val"][0][0][0])
    assert window in prepared.tokenizer.decode(torch.from_numpy(batches.data["val"].astype("int64")))
    other_seed = Batches(prepared, 16, 4, "cpu", seed=4)
    assert not torch.equal(next(other_seed.fixed_batches("val", 1))[0], first["val"][0][0])
    # Written here: the windows start where batch_size draws a batch from a generator seeded by the seed and the split
    # begin (so every evaluation of checkpoints saved by earlier versions measures the same windows).
    for index, split in enumerate(("train", "val")):
        generator = torch.Generator().manual_seed(3 + 1 + index)
        data = torch.from_numpy(batches.data[split].astype("int64"))
        for x, y in first[split]:
            starts = torch.randint(len(data) - 16, (4,), generator=generator)
            assert torch.equal(x, torch.stack([data[i:i + 16] for i in starts]))
            assert torch.equal(y, torch.stack([data[i + 1:i + 17] for i in starts]))


@pytest.mark.parametrize("world_size", [2, 3])
def test_fixed_batches_are_the_same_windows_whatever_the_number_of_processes(tmp_path, small_text, world_size):
    """An evaluation's windows are shared out among the ranks: together they read exactly the windows one process
    reads (no more, no fewer, as many batches on every rank, the rest padding), so a run resumed with fewer processes
    measures its estimates on the same windows."""
    prepared = prepared_from(small_text, tmp_path)
    one = Batches(prepared, 16, 4, "cpu", seed=3)
    ranks = [Batches(prepared, 16, 4, "cpu", seed=3, rank=r, world_size=world_size) for r in range(world_size)]
    for split in ("train", "val"):
        alone = torch.cat([x for x, _ in one.fixed_batches(split, 5)])
        assert len(alone) == 20 and one.num_fixed_batches(5) == 5
        shared = []
        for b in ranks:
            read = list(b.fixed_batches(split, 5))
            assert len(read) == b.num_fixed_batches(5) == -(-(-(-20 // world_size)) // 4)
            x, y = torch.cat([x for x, _ in read]), torch.cat([y for _, y in read])
            real = (y >= 0).all(dim=1)
            assert (y[~real] == -1).all()  # a row is a window or padding
            shared += [tuple(row.tolist()) for row in x[real]]
        assert sorted(shared) == sorted(tuple(row.tolist()) for row in alone)


@pytest.mark.parametrize("rank", [0, 1])
def test_batches_gathered_from_a_resident_copy_equal_those_read_from_disk(tmp_path, small_text, rank):
    """The GPU path (the corpus copied to the device once, windows gathered there) gives the same stream."""
    prepared = prepared_from(small_text, tmp_path)
    from_disk = Batches(prepared, 16, 4, "cpu", seed=5, rank=rank, world_size=2, resident=False)
    resident = Batches(prepared, 16, 4, "cpu", seed=5, rank=rank, world_size=2, resident=True)
    assert from_disk.resident is None and resident.resident is not None
    for split in ("train", "val", "train"):
        for a, b in zip(from_disk.get_batch(split), resident.get_batch(split)):
            assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b)


def test_val_windows_cover_the_split_once_in_batches_of_one_size(tmp_path, small_text):
    prepared = prepared_from(small_text, tmp_path)
    batches = Batches(prepared, block_size=50, batch_size=4, device="cpu")
    xs, ys = zip(*batches.val_windows(batch_size=7))
    val = np.fromfile(prepared.path("val"), dtype=np.uint8)
    n = (len(val) - 1) // 50
    assert n % 7 and n == num_val_windows(batches)  # the last batch is padded
    assert {tuple(x.shape) for x in xs} == {tuple(y.shape) for y in ys} == {(7, 50)}
    x, y = torch.cat(xs), torch.cat(ys)
    assert len(x) == 7 * batches.num_val_batches(7) == 7 * -(-n // 7)
    assert torch.equal(x[:n].flatten(), torch.from_numpy(val[: n * 50].astype(np.int64)))
    assert torch.equal(y[:n].flatten(), torch.from_numpy(val[1: n * 50 + 1].astype(np.int64)))
    assert (y[n:] == -1).all() and (x[n:] >= 0).all()  # padding: targets the loss ignores, inputs it can read


def test_every_rank_reads_as_many_validation_batches(tmp_path, small_text):
    """Under DDP the ranks meet in a collective batch by batch: with one batch more than the others, a rank would wait
    for them forever. A batch size where the ranks' shares of the windows need different numbers of batches."""
    prepared = prepared_from(small_text, tmp_path)
    ranks = [Batches(prepared, block_size=50, batch_size=4, device="cpu", rank=r, world_size=2) for r in range(2)]
    shares = [num_val_windows(b) for b in ranks]
    size = next(k for k in range(1, shares[0] + 1) if -(-shares[0] // k) != -(-shares[1] // k))
    read = [list(b.val_windows(batch_size=size)) for b in ranks]
    assert len(read[0]) == len(read[1]) == ranks[0].num_val_batches(size) == ranks[1].num_val_batches(size)
    starts = set()  # the windows' inputs
    for share, rank in zip(shares, read):  # together, every window once
        x, y = torch.cat([x for x, _ in rank]), torch.cat([y for _, y in rank])
        real = x[(y >= 0).all(dim=1)]
        assert (y[(y < 0).any(dim=1)] == -1).all() and len(real) == share  # a row is a window or padding, not a mix
        starts |= {tuple(row.tolist()) for row in real}
    everything = Batches(prepared, block_size=50, batch_size=4, device="cpu")
    assert starts == {tuple(row.tolist()) for x, y in everything.val_windows() for row in x[(y >= 0).all(dim=1)]}


# --- named corpora -----------------------------------------------------------------------------
def test_shakespeare_download_is_checked_and_falls_back_offline(tmp_path, monkeypatch):
    """A download that is not Tiny Shakespeare is never kept or used; asked for by name it is an error, as the default
    it falls back to pystdlib, said."""
    notes = []
    bad = tmp_path / "bad.txt"
    bad.write_text("not shakespeare")
    monkeypatch.setattr(corpus_module, "SHAKESPEARE_URL", bad.as_uri())
    with pytest.raises(UserError, match=r"--data shakespeare: could not download Tiny Shakespeare \(the download's "
                       r"checksum does not match\), and .*tinyshakespeare.txt holds no copy; connect to the network, "
                       r"put a copy there, or give --data FILE$"):
        resolve("shakespeare", tmp_path / "cache", say=notes.append)  # asked for by name: never another text
    assert not notes and not (tmp_path / "cache" / "tinyshakespeare.txt").exists()
    corpus = resolve("shakespeare", tmp_path / "cache", say=notes.append, fallback=True)  # a default: pystdlib
    target = tmp_path / "cache" / "tinyshakespeare.txt"
    assert corpus.name == "pystdlib" and notes == [
        f"note: could not download Tiny Shakespeare (the download's checksum does not match), and {target} holds no "
        f"copy; using the offline corpus 'pystdlib' instead; to change that, connect to the network, put a copy there, "
        f"or give --data FILE"]
    assert not (tmp_path / "cache" / "tinyshakespeare.txt").exists()  # a bad download is never kept
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [corpus.files[0].name]
    if SHARED_TEXT.exists():
        monkeypatch.setattr(corpus_module, "SHAKESPEARE_URL", SHARED_TEXT.as_uri())
        corpus = resolve("shakespeare", tmp_path / "cache", say=notes.append, fallback=True)
        assert corpus.name == "shakespeare" and corpus.files[0].read_bytes() == SHARED_TEXT.read_bytes()


@pytest.mark.parametrize("copy, differs", [
    (b"First Citizen:\r\n" * 100, "1,600 bytes, where the original has 1,115,394"),
    (b"x" * 1_115_394, "1,115,394 bytes as the original, but another checksum")])
def test_a_cached_copy_of_tiny_shakespeare_that_differs_is_named_and_never_downloaded_over(tmp_path, monkeypatch, copy,
                                                                                            differs):
    """A tinyshakespeare.txt in the cache that is not the original (Windows line endings, another size; or the size
    with other bytes), online or not, is named as such: --data shakespeare is refused saying how it differs and what
    to do, and the default's fallback to pystdlib says it too. Nothing is downloaded over it: the copy stays as it was
    (two processes downloading at once would otherwise move it aside in turn)."""
    fetched = tmp_path / "original.txt"  # online, in effect: a source that would be fetched, and fails the test if read
    monkeypatch.setattr(corpus_module, "SHAKESPEARE_URL", fetched.as_uri())
    monkeypatch.setattr(corpus_module, "download_shakespeare", lambda *args, **kwargs: pytest.fail("downloaded"))
    target = tmp_path / "cache" / "tinyshakespeare.txt"
    target.parent.mkdir()
    target.write_bytes(copy)
    found = f"{target} is not the expected Tiny Shakespeare ({differs})"
    with pytest.raises(UserError) as refused:
        resolve("shakespeare", tmp_path / "cache")
    fix = f"move it away or put char-rnn's input.txt there, or train on it as it is: --data {target}"
    assert str(refused.value) == f"--data shakespeare: {found}; {fix}"
    notes = []
    assert resolve("shakespeare", tmp_path / "cache", say=notes.append, fallback=True).name == "pystdlib"
    assert notes == [f"note: {found}; using the offline corpus 'pystdlib' instead; to change that, {fix}"]
    names = sorted(p.name for p in target.parent.iterdir())  # the copy, as it was, and the pystdlib text
    assert target.read_bytes() == copy and len(names) == 2 and names[0].startswith("pystdlib-") and \
        names[1] == "tinyshakespeare.txt"


def test_the_cache_follows_xdg_cache_home_when_it_is_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert corpus_module.default_cache_dir() == tmp_path / "chargpt"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # would follow the working folder: ignored
    assert corpus_module.default_cache_dir() == Path.home() / ".cache" / "chargpt"


def test_pystdlib_corpus_is_deterministic(tmp_path):
    first = resolve("pystdlib", tmp_path / "one").files[0]
    second = resolve("pystdlib", tmp_path / "two").files[0]
    assert first.read_bytes() == second.read_bytes()
    # as long as Tiny Shakespeare, give or take the last whole file: an offline first run is as quick as an online one
    assert 1_115_394 <= len(first.read_text(encoding="utf-8")) < 1_115_394 + 300_000


# --- bad input: one line, exit code 2, nothing prepared is damaged --------------------------------
def run_prepare(*args, cache):
    """scripts/prepare.py run in this process: exit code and output."""
    import prepare as prepare_cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(prepare_cli.main, ["--cache_dir", str(cache), *args])
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def bad_inputs(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf".encode() + "é au lait".encode("latin-1"))
    (tmp_path / "nul.txt").write_bytes(b"text\x00more")
    (tmp_path / "random.dat").write_bytes(b"\x00\x8f\xff\x01" * 8)  # binary: a NUL and undecodable bytes, not an encoding
    (tmp_path / "notepad.txt").write_bytes("a Windows 'Unicode' text\n".encode("utf-16"))  # NULs, and text
    (tmp_path / "binaries").mkdir()
    (tmp_path / "binaries" / "x.bin").write_bytes(b"\x00" * 10)
    os.mkfifo(tmp_path / "pipe")  # what --data <(zcat corpus.gz) hands over
    return {
        "missing.txt": "no such file or folder",
        "empty.txt": "empty",
        "latin1.txt": "byte 3 cannot be decoded",
        "nul.txt": "NUL",
        "random.dat": "is binary (it contains NUL bytes); --data needs text",
        "notepad.txt": "is UTF-16 text (it has a byte-order mark), not utf-8; pass --encoding utf-16",
        "binaries": "no text files",
        "pipe": "not a regular file or folder",
    }


def test_bad_inputs_give_one_line_and_exit_2(tmp_path):
    cache = tmp_path / "cache"
    good = tmp_path / "good.txt"
    good.write_text("a perfectly good corpus\n" * 20)
    assert run_prepare("--data", str(good), cache=cache).returncode == 0
    before = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    for name, words in bad_inputs(tmp_path).items():
        result = run_prepare("--data", str(tmp_path / name), cache=cache)
        assert result.returncode == 2, (name, result.stderr)
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert words in result.stderr and result.stderr.startswith("error: ")
    after = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    assert after == before
    # a file of /proc shows text but reports 0 bytes: the gate refuses it, saying so, not calling it an empty corpus
    result = run_prepare("--data", "/proc/self/status", cache=cache)
    assert result.returncode == 2 and result.stderr == (
        "error: --data: /proc/self/status is a /proc or /sys file (its size reads 0); copy it to a file first\n")


def test_undecodable_text_can_be_read_with_another_encoding_or_replaced(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café au lait, ".encode("latin-1") * 10)
    as_latin1 = prepare(resolve(str(path), tmp_path), tmp_path, encoding="latin-1")
    assert "é" in as_latin1.tokenizer.chars
    replaced = prepare(resolve(str(path), tmp_path), tmp_path, errors="replace")
    assert "\ufffd" in replaced.tokenizer.chars


def test_a_split_shorter_than_a_block_is_refused_with_a_block_size_that_fits_both_splits(tmp_path):
    """The refusal names the largest block_size that fits both splits, and that one works (one more does not)."""
    prepared = prepared_from("x" * 200, tmp_path)  # 180 train / 20 val characters
    with pytest.raises(UserError, match="^the val split has 20 characters, fewer than block_size \\+ 1 = 33; give "
                       "--block_size 19 or less, a longer corpus or another --val_fraction$"):
        Batches(prepared, block_size=32, batch_size=2, device="cpu")
    assert Batches(prepared, block_size=19, batch_size=2, device="cpu").get_batch("val")[0].shape == (2, 19)
    with pytest.raises(UserError, match="val split has 20 characters, fewer than block_size \\+ 1 = 21"):
        Batches(prepared, block_size=20, batch_size=2, device="cpu")


@pytest.mark.parametrize("n_chars", ["100", 101])
def test_a_cache_entry_whose_character_count_is_not_its_splits_is_prepared_again(tmp_path, n_chars):
    """A cached meta.json whose n_chars is not n_train + n_val (a string, or one more) is a damaged entry, prepared
    again with a note: not a TypeError traceback, nor a 'too short' refusal of a text that is long enough."""
    first = prepared_from("x" * 100, tmp_path)
    meta = json.loads((first.dir / "meta.json").read_text(encoding="utf-8"))
    (first.dir / "meta.json").write_text(json.dumps({**meta, "n_chars": n_chars}), encoding="utf-8")
    notes = []
    again = prepare(resolve(str(tmp_path / "corpus.txt"), tmp_path / "cache"), tmp_path / "cache", say=notes.append)
    assert not again.reused and (again.meta["n_train"], again.meta["n_val"]) == (90, 10)
    assert notes == [f"note: the cached token files in {first.dir} cannot be used (n_chars is not n_train + n_val); "
                     f"preparing them again"]


@pytest.mark.parametrize("base_vocab", ["", "zyx"])
def test_a_cache_entry_whose_vocabulary_was_altered_is_prepared_again(tmp_path, base_vocab):
    """A cached meta.json whose vocabulary was rotated by one character, or had one character replaced in its
    code-point order or in a fine-tuned run's base vocabulary (which is not sorted, and is accepted as it was), is
    refused by its order or its checksum and prepared again with a note: the same token files and vocabulary."""
    first = prepared_from("the quick brown fox\n" * 10, tmp_path, base_vocab=base_vocab)
    files = {name: (first.dir / name).read_bytes() for name in ("meta.json", "train.bin", "val.bin")}
    meta, vocab = json.loads(files["meta.json"]), first.tokenizer.chars
    assert prepared_from("the quick brown fox\n" * 10, tmp_path, base_vocab=base_vocab).reused
    order = "its vocabulary repeats a character or is out of order"
    checksum = "its vocabulary does not match its checksum"
    # (a fine-tuned vocabulary rotated may leave its part beyond the base in order: its checksum tells)
    altered = {"rotated": (vocab[1:] + vocab[:1], checksum if base_vocab else order),
               "replaced in order": (vocab.replace("c", "d"), checksum)}
    if base_vocab:
        altered["replaced in the base"] = (vocab.replace("y", "a"), checksum)
    for what, (garbled, why) in altered.items():
        (first.dir / "meta.json").write_text(json.dumps({**meta, "vocab": garbled}), encoding="utf-8")
        notes = []
        again = prepare(resolve(str(tmp_path / "corpus.txt"), tmp_path / "cache"), tmp_path / "cache",
                        say=notes.append, base_vocab=base_vocab)
        assert notes == [f"note: the cached token files in {first.dir} cannot be used ({why}); preparing them again"], what
        assert not again.reused and again.tokenizer.chars == vocab, what
        assert {name: (first.dir / name).read_bytes() for name in files} == files, what


@pytest.mark.parametrize("damage, why", [
    (lambda d: (d / "meta.json").unlink(), "meta.json is missing"),
    (lambda d: ((d / "meta.json").unlink(), (d / "meta.json").mkdir()), "meta.json is not a file"),
    (lambda d: (d / "meta.json").write_text("[]"), "meta.json is not a JSON object"),
    (lambda d: (d / "meta.json").write_text("[" * 100_000), "meta.json is not UTF-8 JSON"),  # too deep
    (lambda d: (d / "val.bin").unlink(), "val.bin is missing"),
    (lambda d: (d / "meta.json").write_text(json.dumps({**json.loads((d / "meta.json").read_text()), "format": 1})),
     "cache format 1, not this version's 2")])
def test_a_cache_entry_that_cannot_be_used_is_named_in_a_few_words(tmp_path, damage, why):
    """The note on a cache entry prepared again says what is wrong in a few words (no exception's name, no cut path);
    an entry of the earlier cache format, which recorded no checksum of its vocabulary, is prepared again once."""
    first = prepared_from("x" * 100, tmp_path)
    damage(first.dir)
    notes = []
    again = prepare(resolve(str(tmp_path / "corpus.txt"), tmp_path / "cache"), tmp_path / "cache", say=notes.append)
    assert notes == [f"note: the cached token files in {first.dir} cannot be used ({why}); preparing them again"]
    assert not again.reused and prepare(resolve(str(tmp_path / "corpus.txt"), tmp_path / "cache"),
                                        tmp_path / "cache").reused


def test_a_text_too_short_for_any_model_is_refused_when_prepared_and_nothing_is_written(tmp_path, monkeypatch):
    """A text that leaves either split under 2 characters (no model of any block_size trains on it) is refused by
    prepare in one line, exit 2, with no token files written; the line names --val_fraction, the way to change, where
    one can help (from 4 characters). A cache entry of such a text made without the check is refused as well."""
    cache = tmp_path / "cache"
    one = tmp_path / "one.txt"
    one.write_text("a")
    result = run_prepare("--data", str(one), cache=cache)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"error: --data {one}: too short: --val_fraction 0.1 splits its 1 character into 0 for "
                             f"training and 1 for validation, and each needs 2 or more; give a longer text\n")
    assert not [p for p in cache.rglob("*") if p.is_file()]
    for text, fraction, said in (("abcdefghi", 0.1, "its 9 characters into 8 for training and 1 for validation, and "
                                  "each needs 2 or more; give a longer text or a larger --val_fraction"),
                                 ("x" * 200, 1e-17, "its 200 characters into 200 for training and 0 for validation"),
                                 ("abcd", 0.9, "its 4 characters into 0 for training and 4 for validation, and "
                                  "each needs 2 or more; give a longer text or a smaller --val_fraction")):
        with pytest.raises(UserError) as refused:
            prepared_from(text, tmp_path, name="short.txt", val_fraction=fraction)
        assert f"--data {tmp_path / 'short.txt'}: too short: --val_fraction {fraction:g} splits {said}" in str(
            refused.value)
    assert prepared_from("abcd", tmp_path, name="short.txt", val_fraction=0.5).meta["n_val"] == 2  # what it named
    with monkeypatch.context() as patch:  # an entry prepared without the check
        patch.setattr(sys.modules["data.prepare"], "check_splits", lambda *args: None)  # (data.prepare: prepare())
        entry = prepared_from("abc", tmp_path, name="short.txt").dir
    before = {p: p.read_bytes() for p in entry.iterdir()}
    with pytest.raises(UserError, match="splits its 3 characters into 2 for training and 1 for validation, and each "
                       "needs 2 or more; give a longer text$"):
        prepared_from("abc", tmp_path, name="short.txt")
    assert {p: p.read_bytes() for p in entry.iterdir()} == before


def test_data_prepare_run_as_a_file_names_the_command_in_one_line():
    """`python data/prepare.py`, as nanoGPT's data/*/prepare.py are run, is one line naming scripts/prepare.py and exit
    2, not a ModuleNotFoundError traceback (the file is a module of the data package)."""
    import subprocess
    from conftest import ROOT
    done = subprocess.run([sys.executable, "data/prepare.py"], cwd=ROOT, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1 and "python scripts/prepare.py --data FILE" in done.stderr
