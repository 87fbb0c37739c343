"""scripts/evaluate.py: every character scored once, the run's own full validation reproduced, more context never
worse, unknown characters counted exactly, bad inputs one line."""
import contextlib
import json
from pathlib import Path

import pytest
import torch

from conftest import SHARED_TEXT, play_text, train_debug
from training import checkpoint
from data.loader import Windows



def one_by_one(n_ids, block_size, stride):
    """The windows as a loop writes them, one at a time: the reference for the arithmetic ones."""
    found, begin, scored_to = [], 0, 0
    while scored_to < n_ids - 1:
        end = min(begin + block_size, n_ids - 1)
        found.append((begin, end, scored_to + 1))
        scored_to, begin = end, begin + stride
    return found


@pytest.mark.parametrize("n_ids, block_size, stride", [(1, 4, 4), (2, 4, 4), (10, 4, 4), (11, 4, 2), (50, 8, 3),
                                                       (9, 8, 1), (100, 7, 7), (101, 16, 5)])
def test_windows_score_every_character_but_the_first_exactly_once(n_ids, block_size, stride):
    todo = Windows(n_ids, block_size, stride)
    for batch_size in (1, 3, 1000):  # read a batch at a time, windows are the same whatever the batch
        got = [w for first in range(0, len(todo), batch_size)
               for w in zip(*(t.tolist() for t in todo.batch(first, batch_size)))]
        assert got == one_by_one(n_ids, block_size, stride)
    scored = []
    for begin, end, first_scored in got:
        assert 0 < end - begin <= block_size and end <= n_ids - 1
        targets = range(max(first_scored, begin + 1), end + 1)
        scored += targets
        if begin > 0:  # after the first window, each scored character sees at least block_size - stride before it
            assert all(t - begin >= block_size - stride for t in targets)
    assert scored == list(range(1, n_ids))


def test_the_windows_of_a_long_text_at_stride_1_take_no_memory_of_their_own():
    todo = Windows(10**11, 256, 1)  # a hundred billion windows: described, not listed
    assert len(todo) == 10**11 - 256 and [t.tolist() for t in todo.batch(len(todo) - 1, 5)] == [
        [10**11 - 257], [10**11 - 1], [10**11 - 1]]


@pytest.mark.parametrize("n_ids, stride", [(203, 8), (200, 3), (6, 8)])
def test_scoring_a_text_reads_the_device_once_whatever_its_number_of_batches(host_reads, n_ids, stride):
    """On a GPU each value read from a tensor waits for the device, and a read per batch would make a long text
    wait thousands of times: the scorer reads once per text (the sum at the end), and gives the same figures as a
    loop over the windows one at a time, the text's shorter last window included."""
    from model import GPT, ModelConfig
    from training.evaluation import score
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    ids = torch.randint(0, 11, (n_ids,), dtype=torch.int32)
    todo = Windows(n_ids, 8, stride)
    by_hand, count = 0.0, 0
    with torch.no_grad():
        for begin, end, first_scored in one_by_one(n_ids, 8, stride):
            x, y = ids[begin:end].long()[None], ids[begin + 1:end + 1].long()
            losses = torch.nn.functional.cross_entropy(model(x)[0][0], y, reduction="none")
            by_hand += losses[first_scored - begin - 1:].double().sum().item()
            count += len(losses[first_scored - begin - 1:])
    assert count == n_ids - 1
    for batch_size in (1, 4, 1000):
        with host_reads() as reads:
            nats, scored = score(model, ids, todo, batch_size, contextlib.nullcontext)
        assert len(reads) == 1  # the sum, once
        assert scored == count and nats == pytest.approx(by_hand, rel=1e-9)


def corpus_with_a_whole_number_of_windows(folder, block_size=32):
    """Text whose validation split is k * block_size + 1 characters, so full validation leaves no tail unscored."""
    text = play_text(40000)
    n = 30000
    while (n - int(n * 0.9)) % block_size != 1:
        n += 1
    path = folder / "corpus.txt"
    path.write_text(text[:n], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluate")
    corpus = corpus_with_a_whole_number_of_windows(tmp)
    summary = train_debug(corpus, tmp / "run", "--max_iters", "60")
    return tmp, corpus, summary


@pytest.fixture
def evaluate(script):
    """scripts/evaluate.py in this process (its main() through run_cli, as the command runs it)."""
    return lambda *args: script("evaluate.py", *args)


@pytest.fixture
def figures(evaluate):
    def call(tmp, *args):
        out = tmp / "figures.json"
        done = evaluate("--out_dir", str(tmp / "run"), "--json", str(out), "--device", "cpu", *args)  # as trained
        assert done.returncode == 0, done.stderr
        return json.loads(out.read_text(encoding="utf-8"))
    return call


def test_the_validation_split_side_by_side_is_the_runs_full_validation(run, figures):
    tmp, corpus, summary = run
    val = figures(tmp, "--data", str(corpus), "--split", "val")
    assert val["stride"] == 32 and val["unknown"] == 0
    # The same windows, summed in another order (per character here, per batch mean there): float32 rounding only.
    # The rounding differs by machine (1.3e-6 on a 16-core machine beside an H100: 3.1575176 against 3.1575216), so
    # the tolerance is 1e-5, still far below what a wrong window or split would move.
    assert val["loss"] == pytest.approx(summary["full_val_loss"], rel=1e-5)
    closer = figures(tmp, "--data", str(corpus), "--split", "val", "--stride", "8")  # more context per character
    # more context per character: the same characters, and no worse beyond a hair (this toy, 60 steps on the made-up
    # play, is no better at a window's late positions than at its early ones: stride 8 measured 0.0002-0.02 higher)
    assert closer["characters"] == val["characters"] and closer["loss"] <= val["loss"] + 0.03
    whole = figures(tmp, "--data", str(corpus), "--split", "all")
    assert whole["characters"] == len(corpus.read_text(encoding="utf-8")) - 1
    assert figures(tmp, "--data", str(corpus)) == val  # --split val by default: the part training held out


def test_without_data_the_run_is_scored_on_its_own_text_and_only_as_it_was(run, figures, evaluate, tmp_path):
    """No --data: the text the run trained on, the same figures as --data naming it; a copy of that text changed by one
    character (its recorded checksum no longer holds) is never scored in its place: one line asking for --data."""
    tmp, corpus, summary = run
    own = figures(tmp)
    named = figures(tmp, "--data", str(corpus))
    assert {key: own[key] for key in own if key != "data"} == {key: named[key] for key in named if key != "data"}
    assert own["loss"] == pytest.approx(summary["full_val_loss"], rel=1e-5)
    original = corpus.read_bytes()
    try:
        corpus.write_bytes(original[:-2] + (b"a" if original[-2:-1] != b"a" else b"b") + original[-1:])
        done = evaluate("--out_dir", str(tmp / "run"), "--device", "cpu")
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "is not here as it was" in done.stderr and "--data FILE" in done.stderr
    finally:
        corpus.write_bytes(original)


def test_without_data_a_text_that_cannot_be_read_is_said_to_be_unreadable_not_changed(run, evaluate, monkeypatch):
    """No --data, and the run's text is there but cannot be read (a permission, a failing disk): the one line gives
    the system's reason, where it said the text was missing or changed."""
    import evaluate as script

    def unreadable(path, record, max_bytes):  # as open() meets a file this user may not read (root may read any)
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(script, "recorded_text", unreadable)
    done = evaluate("--out_dir", str(run[0] / "run"), "--device", "cpu")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.rstrip().endswith(f", {run[1]}, is not here as it was: it cannot be read (Permission denied); "
                                         f"give it with --data FILE"), done.stderr


def test_a_relative_data_path_is_recorded_whole_so_the_run_is_scored_from_anywhere(tmp_path, monkeypatch, evaluate):
    """--data given relative to the folder train.py runs in is recorded as an absolute path: evaluate.py without --data,
    run from another folder, scores that text (a resume finds it the same way)."""
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "play.txt").write_text(play_text(20000), encoding="utf-8")
    monkeypatch.chdir(tmp_path / "texts")
    summary = train_debug(Path("play.txt"), tmp_path / "run", "--max_iters", "10")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "figures.json"
    done = evaluate("--out_dir", str(tmp_path / "run"), "--device", "cpu", "--json", str(out), "--split", "all")
    assert done.returncode == 0, done.stderr
    assert "note: --split all on the run's own text scores its training part too" in done.stderr
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert figures["data"] == str(tmp_path / "texts" / "play.txt") and figures["characters"] == 20000 - 1
    assert summary["corpus"] == str(tmp_path / "texts" / "play.txt")


def test_without_data_a_run_on_a_folder_or_an_unreachable_named_corpus_is_one_line(tmp_path, evaluate, monkeypatch):
    """A folder of texts is read only when named (--data FOLDER, said with its path); a named corpus that cannot be had
    says that no --data was given and which corpus the run trained on; an empty --data is refused, never the folder
    the command runs in."""
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text(play_text(20000), encoding="utf-8")
    train_debug(folder, tmp_path / "run", "--max_iters", "4")
    done = evaluate("--out_dir", str(tmp_path / "run"), "--device", "cpu")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"was trained on the folder {folder}; give --data {folder}" in done.stderr
    done = evaluate("--out_dir", str(tmp_path / "run"), "--data", "")
    assert done.returncode == 2 and "error: --data is empty; give a text file" in done.stderr
    import data.corpus as corpus_module
    monkeypatch.setattr(corpus_module, "SHAKESPEARE_URL", "http://127.0.0.1:9/unreachable")
    ckpt = checkpoint.load(tmp_path / "run" / "ckpt_best.safetensors")
    ckpt["run_config"]["data"] = "shakespeare"
    checkpoint.save({k: v for k, v in ckpt.items() if k != "format"}, tmp_path / "named.safetensors")
    done = evaluate("--ckpt", str(tmp_path / "named.safetensors"), "--cache_dir", str(tmp_path / "empty_cache"))
    assert done.returncode == 2 and done.stderr.startswith(
        "error: no --data given; the run trained on shakespeare, and could not download Tiny Shakespeare ("), \
        done.stderr


@pytest.mark.skipif(not SHARED_TEXT.exists(), reason="needs the shared copy of Tiny Shakespeare")
def test_without_data_a_named_corpus_that_is_not_the_runs_text_is_scored_with_a_note(run, evaluate, tmp_path):
    """No --data, a run on a named corpus: the corpus is read by its name from this user's cache, and where its
    checksum is not the one the checkpoint records (pystdlib differs between Python versions) one note says that the
    figures are this text's; where it is the same, nothing more is said. The checksum is worked out here as the
    cache's is: the first file's mark, then its bytes."""
    import hashlib
    import shutil
    tmp, _, _ = run
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(SHARED_TEXT, cache / "tinyshakespeare.txt")  # found by its checksum: no download
    ckpt = checkpoint.load(tmp / "run" / "ckpt_best.safetensors")  # trained on the made-up play
    ckpt["run_config"]["data"] = "shakespeare"
    checks = {"other": ckpt["data"]["sha256"],
              "same": hashlib.sha256(b"\0file0\0" + SHARED_TEXT.read_bytes()).hexdigest()}
    for name, sha256 in checks.items():
        ckpt["data"]["sha256"] = sha256
        checkpoint.save({k: v for k, v in ckpt.items() if k != "format"}, tmp_path / f"{name}.safetensors")
        done = evaluate("--ckpt", str(tmp_path / f"{name}.safetensors"), "--cache_dir", str(cache), "--device", "cpu",
                        "--unknown", "skip")
        assert done.returncode == 0, done.stderr
        note = (f"note: shakespeare here is not the text {tmp_path / 'other.safetensors'} was trained on (its checksum "
                f"differs)\n")
        assert (note in done.stderr) == (name == "other"), done.stderr


def test_unknown_characters_are_counted_exactly(run, evaluate, figures):
    tmp, corpus, _ = run
    text = corpus.read_text(encoding="utf-8")[:3000]
    mixed = tmp / "mixed.txt"
    mixed.write_text("§" + text[:1000] + "ЖЖ§" + text[1000:] + "§Ж§§", encoding="utf-8")  # 5 x §, 3 x Ж
    refused = evaluate("--out_dir", str(tmp / "run"), "--data", str(mixed), "--split", "all")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "8 characters the model never saw (2 different: '§' 'Ж')" in refused.stderr
    skipped = figures(tmp, "--data", str(mixed), "--unknown", "skip", "--split", "all")
    assert (skipped["unknown"], skipped["unknown_distinct"], skipped["characters"]) == (8, 2, len(text) - 1)


def test_a_text_in_another_encoding_is_scored_with_encoding_as_its_utf8_copy_is(run, evaluate, figures):
    """A latin-1 text scored by a run trained on UTF-8: refused in one line naming --encoding, which evaluate.py
    takes; with --encoding latin-1 its figures are those of the same characters written in UTF-8 (--encoding_errors
    replace reads it too, its undecodable bytes as U+FFFD, which the model never saw). The run's own text is read as
    it was trained on: --encoding without --data is refused."""
    tmp, corpus, _ = run
    text = corpus.read_text(encoding="utf-8")[:3000] + "caf\u00e9"  # é: not in the run's vocabulary
    (tmp / "latin.txt").write_bytes(text.encode("latin-1"))
    (tmp / "utf8.txt").write_bytes(text.encode("utf-8"))
    refused = evaluate("--out_dir", str(tmp / "run"), "--data", str(tmp / "latin.txt"))
    assert refused.returncode == 2 and refused.stderr.endswith("cannot be decoded; pass --encoding (e.g. latin-1) or "
                                                               "--encoding_errors replace\n"), refused.stderr
    common = ("--split", "all", "--unknown", "skip")
    latin = figures(tmp, "--data", str(tmp / "latin.txt"), "--encoding", "latin-1", *common)
    utf8 = figures(tmp, "--data", str(tmp / "utf8.txt"), *common)
    assert {**latin, "data": ""} == {**utf8, "data": ""} and latin["unknown"] == 1
    replaced = figures(tmp, "--data", str(tmp / "latin.txt"), "--encoding_errors", "replace", *common)
    assert replaced["characters"] == latin["characters"] and replaced["unknown"] == 1
    own = evaluate("--out_dir", str(tmp / "run"), "--encoding", "latin-1")  # the run's own text: as it was trained on
    assert own.returncode == 2 and own.stderr == ("error: --encoding and --encoding_errors need --data; leave them "
                                                  "out, or give --data FILE\n")
    wrong = evaluate("--out_dir", str(tmp / "run"), "--data", str(tmp / "utf8.txt"), "--encoding", "rot13")
    assert wrong.returncode == 2 and wrong.stderr == ("error: --encoding rot13: not a text encoding; try utf-8 or "
                                                      "latin-1\n")


@pytest.mark.parametrize("make, words", [
    (lambda tmp: ["--data", str(tmp / "empty.txt")], "no text to score"),
    (lambda tmp: ["--data", str(tmp / "missing.txt")], "missing.txt"),
    (lambda tmp: ["--data", str(tmp / "corpus.txt"), "--stride", "33"], "--stride 33: must be between 1"),
    (lambda tmp: ["--data", str(tmp / "corpus.txt"), "--stride", "0"], "--stride 0: must be between 1"),
    (lambda tmp: ["--batch_size", "-1"], "--batch_size -1: must be 1 or more (or 0, the run's own)"),
])
def test_bad_inputs_are_one_line(run, make, words, evaluate):
    tmp = run[0]
    (tmp / "empty.txt").write_text("", encoding="utf-8")
    done = evaluate("--out_dir", str(tmp / "run"), *make(tmp))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


def test_the_figures_are_never_written_over_the_runs_own_summary(run, evaluate):
    """--json RUN/summary.json, beside the run's checkpoints, is refused before anything is scored, and the summary
    keeps its bytes; the line names another file, which takes the figures."""
    tmp = run[0]
    summary = tmp / "run" / "summary.json"
    before = summary.read_bytes()
    done = evaluate("--out_dir", str(tmp / "run"), "--json", str(summary))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: --json {summary} would replace the run's own summary")
    assert summary.read_bytes() == before
    other = done.stderr.strip().rsplit("--json ", 1)[1]
    assert other == str(tmp / "run" / "evaluation.json")
    assert evaluate("--out_dir", str(tmp / "run"), "--json", other).returncode == 0
    assert json.loads(Path(other).read_text(encoding="utf-8"))["loss"] > 0 and summary.read_bytes() == before


def test_a_named_text_that_cannot_be_had_is_never_replaced_by_another(run, evaluate, monkeypatch):
    """Offline, training falls back from Tiny Shakespeare to pystdlib (and says so); scoring must not: its figure
    would be of another text."""
    import data.corpus as corpus_module

    monkeypatch.setattr(corpus_module, "SHAKESPEARE_URL", "http://127.0.0.1:9/unreachable")
    cache = run[0] / "empty_cache"
    done = evaluate("--out_dir", str(run[0] / "run"), "--data", "shakespeare", "--cache_dir", str(cache))
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith(
        "error: --data shakespeare: could not download Tiny Shakespeare (") and "pystdlib" not in done.stdout
    assert not (cache / "tinyshakespeare.txt").exists() and not list(cache.glob("pystdlib*"))


def test_batches_that_do_not_fit_in_memory_are_one_line(run, evaluate, monkeypatch):
    import evaluate as script

    def allocates_too_much(*args, **kwargs):  # the allocator's own error, as a batch of too many windows meets it
        return torch.empty(10**13)
    monkeypatch.setattr(script, "score", allocates_too_much)
    done = evaluate("--out_dir", str(run[0] / "run"), "--data", str(run[1]), "--batch_size", "100000")
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        "error: out of memory: batches of 100,000 windows of 32 characters do not fit on cpu; lower --batch_size")


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path, evaluate):
    done = evaluate("--out_dir", str(tmp_path), "--data", "x.txt")
    assert done.returncode == 2 and "holds no ckpt_best.safetensors or ckpt_last.safetensors" in done.stderr


def scaled(run, where, factor):
    """A copy of the run's model whose token table (tied to the output head) is multiplied by factor: finite weights
    whose logits grow past what float32 holds (inf, then NaN) or give a loss beyond e^709."""
    state = checkpoint.load(run[0] / "run" / "ckpt_best.safetensors", resume=True)
    state["model"]["wte.weight"] = state["model"]["wte.weight"] * factor
    state["model"]["lm_head.weight"] = state["model"]["wte.weight"]
    checkpoint.save(state, where)
    return where


def test_a_model_whose_output_is_not_a_number_is_one_line_and_writes_nothing(run, evaluate, tmp_path):
    figures = tmp_path / "figures.json"
    done = evaluate("--ckpt", str(scaled(run, tmp_path / "inf.pt", 1e36)), "--data", str(run[1]), "--json",
                    str(figures))
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith(
        f"error: {tmp_path / 'inf.pt'}: the model's loss on this text is not a number (")
    assert not figures.exists()


def test_a_loss_beyond_what_perplexity_can_show_is_still_reported_in_valid_json(run, evaluate, tmp_path):
    figures = tmp_path / "figures.json"
    done = evaluate("--ckpt", str(scaled(run, tmp_path / "big.pt", 1000.0)), "--data", str(run[1]), "--json",
                    str(figures))
    assert done.returncode == 0, done.stderr
    saved = json.loads(figures.read_text(encoding="utf-8"))  # strict JSON: no NaN or Infinity in it
    assert saved["loss"] > 709 and saved["perplexity"] is None
    assert f"perplexity e^{saved['loss']:.0f} (too large for a number)" in done.stdout


def test_batches_too_big_for_the_free_memory_are_refused_before_scoring(run, evaluate, monkeypatch):
    import evaluate as script
    from common import machine
    monkeypatch.setattr(machine, "free_memory", lambda: 2**30)
    monkeypatch.setattr(script, "score", lambda *args, **kwargs: pytest.fail("scored anyway"))
    done = evaluate("--out_dir", str(run[0] / "run"), "--data", str(run[1]), "--batch_size", "100000",
                    "--device", "cpu")
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith(
        "error: out of memory: batches of 100,000 windows of 32 characters would need about ")


def test_written_to_a_file_its_progress_is_plain_lines(run, evaluate, monkeypatch):
    """A terminal gets a bar; a log file gets plain lines, not hundreds of a bar's redraws run together (the output
    here is not a terminal)."""
    import evaluate as script
    monkeypatch.setattr(script, "tqdm", lambda *args, **kwargs: pytest.fail("a progress bar written to a file"))
    done = evaluate("--out_dir", str(run[0] / "run"), "--data", str(run[1]))
    assert done.returncode == 0 and "\r" not in done.stderr and "loss " in done.stdout
