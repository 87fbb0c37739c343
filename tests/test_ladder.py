"""scripts/ladder.py: the rungs train with one budget, the table, ladder.json and ladder.png are written, finished
rungs are reused byte for byte, changed settings retrain, each rung's train.py command is printed, and a Chinese
corpus works as well as an English one."""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from conftest import ROOT, patient
from configs import load_config
from training import checkpoint

SENTENCES = ["注意力让每个字回头看前面的字。", "查询和键的点积决定权重。",
             "值按权重相加，得到新的表示。",
             "缩放让梯度不会消失。", "掩码挡住未来，只看过去。"]


def ladder(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "ladder.py"), "--config", "debug", *args],
                          capture_output=True, text=True, timeout=patient(300))


def ladder_here(capfd, *args) -> subprocess.CompletedProcess:
    """The ladder's main() through run_cli, as its command runs it, in this process (a new interpreter would spend
    seconds importing torch again): its exit code and what it printed, its rungs' train.py processes included (capfd
    reads the file descriptors they inherit, as a pipe from the command would)."""
    import ladder as script
    from errors import run_cli

    capfd.readouterr()
    code = run_cli(script.main, ["--config", "debug", *args])
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["ladder.py", *args], code, out, err)


@pytest.mark.slow
def test_a_small_ladder_on_chinese_text_writes_its_table_and_reuses_finished_rungs(tmp_path, capfd):
    corpus = tmp_path / "zh.txt"
    corpus.write_text("\n".join(SENTENCES[i % 5] + SENTENCES[(i * 3) % 5] for i in range(400)), encoding="utf-8")
    out = tmp_path / "ladder"
    base = ["--data", str(corpus), "--out_dir", str(out), "--cache_dir", str(tmp_path / "cache"),
            "--eval_iters", "3", "--max_iters", "6"]  # eval_iters: train.py's
    common = [*base, "--rungs", "bigram,one_head"]
    first = ladder_here(capfd, *common)
    assert first.returncode == 0, first.stderr
    rows = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    assert [row["name"] for row in rows] == ["bigram", "one_head"]
    assert all(row["full_val_loss"] > 0 and row["steps"] == 6 for row in rows)
    assert rows[0]["parameters"] < rows[1]["parameters"]  # a table of odds is smaller than a transformer
    for row in rows:
        assert f"{row['full_val_loss']:.4f}" in first.stdout  # the printed table
        assert any((ROOT / row["out_dir"]).glob("events.out.tfevents.*"))  # each rung is its own TensorBoard run
    assert Image.open(out / "ladder.png").format == "PNG"
    two_bars = Image.open(out / "ladder.png").size
    kept = (out / "03-one_head" / "ckpt_last.safetensors").read_bytes()

    damaged = out / "01-bigram" / "ckpt_last.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:100])  # cut short
    again = ladder_here(capfd, *common)  # the finished rung is reused, byte for byte; the damaged one is trained again
    assert again.returncode == 0 and again.stderr.count("reused") == 1, again.stderr
    assert "not a readable checkpoint" in again.stderr, again.stderr
    assert (out / "03-one_head" / "ckpt_last.safetensors").read_bytes() == kept
    healed = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    figures = [[{k: v for k, v in row.items() if k != "train_seconds"} for row in table] for table in (healed, rows)]
    assert figures[0] == figures[1]  # trained again to exactly the same loss

    # one rung run again: the table and the picture still hold the rung measured before, with the same settings
    subset = ladder_here(capfd, *base, "--rungs", "bigram")
    assert subset.returncode == 0 and "[1/1] bigram" in subset.stderr and subset.stderr.count("reused") == 1
    assert json.loads((out / "ladder.json").read_text(encoding="utf-8")) == healed
    assert Image.open(out / "ladder.png").size == two_bars  # a bar each (its height grows with the rungs)
    assert f"wrote {out / 'ladder.json'} (1 of its rungs measured before)" in subset.stderr

    # a rung's command, printed and in ladder.json, is train.py's own, with the settings the rung trained with
    words = shlex.split(healed[0]["command"])
    assert Path(words[1]).resolve() == ROOT / "train.py" and healed[0]["command"] in again.stderr
    saved = checkpoint.load(damaged)["run_config"]
    assert saved["eval_iters"] == 3  # an option the ladder does not know reached the rung
    wanted = load_config(words[2:], False)[0].to_dict()
    assert {k: v for k, v in saved.items() if k not in ("resume", "overwrite")} == \
        {k: v for k, v in wanted.items() if k not in ("resume", "overwrite")}

    # another budget is another run: the ladder trains the rung again instead of reusing it
    import ladder as script
    one_head = next(settings for name, _, settings in script.RUNGS if name == "one_head")
    different = ("different", f"{out / '03-one_head'} holds a run with other settings")
    for steps, state in ((8, different), (6, ("finished", ""))):
        args = SimpleNamespace(config="debug", data=str(corpus), out_dir=str(out), max_iters=steps,
                               cache_dir=str(tmp_path / "cache"))
        argv = script.rung_argv(args, 3, "one_head", one_head, ["--eval_iters", "3"])
        assert script.state_of(load_config(argv, False)[0], script.decide_corpus(args)[1]) == state
    # the same settings on another text: trained again, never its loss on the old text reported as the new one's
    other = tmp_path / "other.txt"
    other.write_text("".join(reversed(corpus.read_text(encoding="utf-8"))), encoding="utf-8")
    elsewhere = SimpleNamespace(**{**vars(args), "data": str(other)})
    assert script.state_of(load_config(argv, False)[0], script.decide_corpus(elsewhere)[1]) == (
        "different", f"{out / '03-one_head'} holds a run trained on another text ({corpus})")
    summary = out / "03-one_head" / "summary.json"
    summary.write_text(summary.read_text(encoding="utf-8")[:40], encoding="utf-8")  # cut short: trained again
    assert script.state_of(load_config(argv, False)[0], script.decide_corpus(args)[1]) == (
        "damaged", f"{summary} cannot be read")
    kept_summary = summary.read_bytes()
    summary.unlink()
    os.mkfifo(summary)  # a pipe in its place is never waited on (it would hang the ladder for ever)
    assert script.state_of(load_config(argv, False)[0], script.decide_corpus(args)[1]) == (
        "damaged", f"{summary} cannot be read")
    summary.unlink()
    summary.write_bytes(kept_summary)
    # a rung left out of --rungs whose folder holds no finished run of these settings is left out of the table, said
    alone = ladder_here(capfd, *base, "--rungs", "bigram")
    rows = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    assert alone.returncode == 0 and [row["name"] for row in rows] == ["bigram"]
    assert alone.stderr.endswith("note: the table leaves out rungs with no finished run of these settings: "
                                 "one_head (damaged); --rungs one_head trains them with these\n")


def test_an_unknown_rung_is_one_line(tmp_path, capfd):
    """An unknown rung, or a --rungs naming none (empty, or commas alone), is one line and trains nothing; a stray
    comma beside a rung is no rung of its own."""
    wrong = ladder_here(capfd, "--out_dir", str(tmp_path / "l"), "--rungs", "bigram,,trigram")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "--rungs: no rung trigram;" in wrong.stderr
    for none in ("", ",", " , "):
        empty = ladder_here(capfd, "--out_dir", str(tmp_path / "l"), "--rungs", none)
        assert empty.returncode == 2 and empty.stderr.startswith("error: --rungs: names no rung; choose from bigram, "
                                                                 "average,"), empty.stderr
    assert not (tmp_path / "l").exists()


def test_an_out_dir_that_holds_a_training_run_is_refused_and_left_as_it_was(tmp_path, corpus, capfd):
    """--out_dir naming a training run's folder (a checkpoint there, or a run's logs alone) is one line and writes
    nothing there: the rungs' folders and the table would be mixed into the run's."""
    for held in ("ckpt_last.safetensors", "summary.json"):
        run = tmp_path / held.split(".")[0]
        run.mkdir()
        (run / held).write_bytes(b"the run's own bytes")
        refused = ladder_here(capfd, "--out_dir", str(run), "--data", str(corpus), "--cache_dir",
                              str(tmp_path / "cache"))
        assert refused.returncode == 2 and refused.stderr == (
            f"error: --out_dir {run} holds a training run ({held}); choose another --out_dir\n")
        assert [p.name for p in run.iterdir()] == [held] and (run / held).read_bytes() == b"the run's own bytes"


def test_a_ladder_that_ends_before_a_rung_wrote_leaves_no_folder_it_made(tmp_path, corpus, capfd, monkeypatch):
    """A ladder that ends before a rung wrote in its --out_dir (a text that is not there; its first rung's train.py
    stopped while loading) removes the folders it made, missing parents included, and keeps one that was there."""
    import ladder as script
    missing = str(tmp_path / "no such.txt")
    failed = ladder_here(capfd, "--out_dir", str(tmp_path / "new" / "ladder"), "--data", missing)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and "no such.txt" in failed.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]
    def stopped_before_training(*args):  # (train.py: "stopped before training began")
        raise script.Interrupted("stopped during rung bigram; run the same command again to go on")
    monkeypatch.setattr(script, "train_rung", stopped_before_training)
    stopped = ladder_here(capfd, "--out_dir", str(tmp_path / "new" / "ladder"), "--data", str(corpus),
                          "--cache_dir", str(tmp_path / "cache"))
    assert stopped.returncode == 130 and not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    assert ladder_here(capfd, "--out_dir", str(tmp_path / "mine"), "--data", missing).returncode == 2
    assert (tmp_path / "mine").is_dir()


def test_a_ladder_json_the_ladder_did_not_write_is_kept_and_said_in_one_line(tmp_path, capfd):
    """A ladder.json that is not a table the ladder wrote (another file of that name, one damaged, a link, a folder)
    would be replaced by the new table: the ladder refuses in one line before it trains, and every file stays as it
    was."""
    out = tmp_path / "ladder"
    out.mkdir()
    table = out / "ladder.json"
    elsewhere = tmp_path / "notes.json"
    elsewhere.write_text('[{"rung": 1}]', encoding="utf-8")
    for content, why in ((b"my own notes", "not JSON"), (b'[{"rung": 1, "name": "bigram"', "not JSON"),
                         (b"\xff\xfe", "not JSON"), (b'{"rung": 1}', "JSON, but not a list of rungs"),
                         (b'[{"name": "bigram"}]', "JSON, but not a list of rungs"), (elsewhere, "a link"),
                         (None, "a folder")):
        if isinstance(content, bytes):
            table.write_bytes(content)
        elif content is None:
            table.mkdir()
        else:
            table.symlink_to(content)
        done = ladder_here(capfd, "--out_dir", str(out), "--rungs", "bigram", "--max_iters", "1")
        assert (done.returncode, done.stderr) == (2, f"error: {table} is not a ladder table ({why})."
                                                     f" Move it away, or choose another --out_dir\n")
        assert [path.name for path in out.iterdir()] == ["ladder.json"]  # no rung folder, no picture
        if isinstance(content, bytes):
            assert table.read_bytes() == content
        elif content is None:
            assert table.is_dir() and not any(table.iterdir())
        else:
            assert table.readlink() == elsewhere and elsewhere.read_text(encoding="utf-8") == '[{"rung": 1}]'
        table.rmdir() if table.is_dir() and not table.is_symlink() else table.unlink()


def strict_json(text: str):
    """JSON as the standard defines it: NaN and Infinity are not part of it (Python's json accepts them)."""
    def refuse(word):
        raise ValueError(f"not JSON: {word}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow
def test_a_rung_whose_loss_is_not_a_number_gives_valid_json_and_a_picture(tmp_path, corpus, capfd):
    """A finished rung whose summary holds NaN (a run that diverged): ladder.json stays strict JSON (null for the
    loss), and the picture is drawn, that rung's bar empty and labelled, instead of a traceback."""
    out = tmp_path / "ladder"
    common = ["--data", str(corpus), "--out_dir", str(out), "--cache_dir", str(tmp_path / "cache"),
              "--eval_iters", "2", "--rungs", "bigram", "--max_iters", "2"]
    assert ladder_here(capfd, *common).returncode == 0
    summary_path = out / "01-bigram" / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    summary["full_val_loss"] = float("nan")
    summary_path.write_text(json.dumps(summary), encoding="utf-8")  # Python writes the NaN as NaN
    (out / "ladder.png").unlink()
    again = ladder_here(capfd, *common)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert "reused" in again.stderr  # the NaN summary is a finished rung's result, not a damaged file
    rows = strict_json((out / "ladder.json").read_text(encoding="utf-8"))
    assert rows[0]["full_val_loss"] is None and rows[0]["bits_per_char"] is None
    assert rows[0]["steps"] == 2 and rows[0]["name"] == "bigram"
    assert Image.open(out / "ladder.png").format == "PNG"


@pytest.mark.slow
def test_offline_the_ladder_decides_the_corpus_once_and_its_commands_name_it(tmp_path, capfd,
                                                                             monkeypatch):
    """Without a network the default --data shakespeare falls back to the offline corpus once, for the whole ladder,
    and every rung's command (printed and in ladder.json) says --data pystdlib: run as printed, it trains on the same
    text, where a printed --data shakespeare would train on another text once online."""
    from data import corpus

    out = tmp_path / "ladder"
    unreachable = "http://127.0.0.1:9/unreachable"  # no download possible: here, and in the rungs' processes
    monkeypatch.setattr(corpus, "SHAKESPEARE_URL", unreachable)
    monkeypatch.setenv("CHARGPT_SHAKESPEARE_URL", unreachable)
    done = ladder_here(capfd, "--out_dir", str(out), "--cache_dir", str(tmp_path / "cache"), "--eval_iters", "2",
                       "--rungs", "bigram,average", "--max_iters", "2")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("using the offline corpus 'pystdlib'") == 1, done.stderr  # said once, by the ladder
    rows = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    for row in rows:
        words = shlex.split(row["command"])
        assert row["command"] in done.stderr and words[words.index("--data") + 1] == "pystdlib"
        assert load_config(words[2:], False)[0].data == "pystdlib"
        trained_on = checkpoint.load(ROOT / row["out_dir"] / "ckpt_last.safetensors")["data"]
        assert trained_on["source"] == "pystdlib" and row["corpus"] == "pystdlib", trained_on
    assert "--data shakespeare" not in done.stderr


def test_close_rungs_get_more_seeds_and_the_table_shows_steps_and_spread(tmp_path, corpus, capfd):
    """Two compared rungs whose losses are close each train SEEDS seeds; the table gives each rung's mean over its
    seeds, their losses, each seed's model step, and says a difference inside the spread is one."""
    import ladder as script
    out = tmp_path / "ladder"
    done = ladder_here(capfd, "--data", str(corpus), "--out_dir", str(out), "--cache_dir", str(tmp_path / "cache"),
                       "--eval_iters", "2", "--rungs", "default,unscaled", "--max_iters", "2")
    assert done.returncode == 0, done.stderr
    rows = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    for row, folder in zip(rows, ("07-default", "08-unscaled")):
        assert row["seeds"] == [1337, 1338, 1339] and len(row["seed_losses"]) == 3
        runs = [out / folder] + [out / f"{folder}-seed{seed}" for seed in (1338, 1339)]
        summaries = [json.loads((run / "summary.json").read_text(encoding="utf-8")) for run in runs]
        assert row["seed_losses"] == [summary["full_val_loss"] for summary in summaries]
        assert row["model_steps"] == [summary["model_step"] for summary in summaries]
        assert row["full_val_loss"] == sum(row["seed_losses"]) / 3
    default, unscaled = rows
    low, high = min(unscaled["seed_losses"]), max(unscaled["seed_losses"])
    within = low <= max(default["seed_losses"]) and min(default["seed_losses"]) <= high
    assert unscaled["compared"] == (f"{unscaled['full_val_loss'] - default['full_val_loss']:+.3f} vs default"
                                    + (" (within the spread of seeds)" if within else ""))
    assert f"3: {low:.4f}-{high:.4f}" in done.stdout and unscaled["compared"] in done.stdout
    assert script.reference(1) is None and script.reference(3) == 2 and script.reference(12) == script.DEFAULT


def test_a_difference_inside_the_seeds_spread_is_said_to_be_one():
    """finish_row: ranges of seeds that overlap are 'within the spread'; apart, or of one seed, they are not."""
    import ladder as script

    def row(number, name, losses):
        return {"rung": number, "name": name, "runs": [
            {"full_val_loss": loss, "seed": 1337 + i, "model_step": 30 * (i + 1), "iterations": 300,
             "train_seconds": 1.0, "out_dir": name, "command": name} for i, loss in enumerate(losses)]}
    for losses, said in (([5.30, 5.46], " (within the spread of seeds)"), ([5.00, 5.10], ""), ([5.35], "")):
        rows = {7: row(7, "default", [5.40, 5.50]), 8: row(8, "unscaled", losses)}
        table = [script.finish_row(r, rows) for r in rows.values()]
        mean = sum(losses) / len(losses)
        assert table[1]["compared"] == f"{mean - 5.45:+.3f} vs default{said}"
        assert table[1]["model_steps"] == [30 * (i + 1) for i in range(len(losses))]


def test_without_config_the_rungs_start_from_the_default_run_fitted_to_the_text(tmp_path, capfd):
    """Without --config the ladder's default rung trains with the settings train.py's default run takes on the text
    (configs/fit.py's, said in one line); each rung's own settings and a flag passed to every rung win over the fit."""
    import ladder as script
    import train
    text = tmp_path / "poems.txt"
    text.write_text("".join(chr(0x4E00 + (i * 7919) % 300) for i in range(3000)), encoding="utf-8")
    common = ["--cache_dir", str(tmp_path / "cache"), "--max_iters", "2", "--eval_iters", "1", "--num_threads", "1"]
    cfg, _, explicit = load_config([*common, "--data", str(text), "--out_dir", str(tmp_path / "run")], False)
    said = []
    train.train(cfg, explicit, say=said.append)
    default_run = checkpoint.load(tmp_path / "run" / "ckpt_last.safetensors")["run_config"]
    assert [line for line in said if line.startswith("fitted")]  # train.py fitted this text

    def rung(number: int, passed: list[str]) -> dict:
        args = SimpleNamespace(config=None, data=str(text), out_dir=str(tmp_path / "ladder"), max_iters=2,
                               cache_dir=str(tmp_path / "cache"))
        args.config = script.PRESET  # as climb() sets it
        capfd.readouterr()
        script.fit_to_text(args, passed)
        assert capfd.readouterr().err.startswith("fitted to 2,700 training characters in 300 letters (few of each)")
        name, _, overrides = script.RUNGS[number - 1]
        return load_config(script.rung_argv(args, number, name, overrides, passed), False)[0].to_dict()

    passed = ["--eval_iters", "1", "--num_threads", "1"]
    default = rung(script.DEFAULT, passed)
    rung_only = {"out_dir", "sample_chars", "log_attention", "patience", "resume", "overwrite"}
    assert {k: v for k, v in default.items() if k not in rung_only} == \
        {k: v for k, v in default_run.items() if k not in rung_only}
    assert default["n_layer"] == 3 and rung(3, passed)["n_layer"] == 1  # one_head's own setting wins
    assert rung(script.DEFAULT, [*passed, "--n_embd", "64"])["n_embd"] == 64  # a passed flag wins


def test_a_finished_rung_that_chose_its_thread_count_is_reused(tmp_path):
    """--num_threads 0 (the CPU preset's) lets a rung measure its count, and its run saves the count it chose; run
    again, the ladder reuses that rung, and a rung given another count explicitly trains again."""
    import ladder as script
    import train
    text = tmp_path / "notes.txt"
    text.write_text("the cat sat on the mat. " * 400, encoding="utf-8")
    args = SimpleNamespace(config="debug", data=str(text), out_dir=str(tmp_path / "ladder"), max_iters=2,
                           cache_dir=str(tmp_path / "cache"))
    name, _, overrides = script.RUNGS[0]
    argv = script.rung_argv(args, 1, name, overrides, ["--num_threads", "0"])
    cfg, _, explicit = load_config(argv, False)
    train.train(cfg, explicit, say=lambda line: None)
    chose = checkpoint.load(Path(cfg.out_dir) / "ckpt_last.safetensors")["run_config"]["num_threads"]
    assert chose >= 1
    sha256 = script.decide_corpus(args)[1]
    assert script.state_of(load_config(argv, False)[0], sha256) == ("finished", "")
    other = script.rung_argv(args, 1, name, overrides, ["--num_threads", str(chose + 1)])
    assert script.state_of(load_config(other, False)[0], sha256)[0] == "different"
