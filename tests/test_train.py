"""Training end to end: outputs, TensorBoard tags, exact resume, the command line and its errors."""
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import fields

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from common import machine
from common.machine import CPU_BFLOAT16_SAMPLING_PARAMS, pick_dtype
from configs import load_config
from configs.loader import keep_global_batch
from configs.schema import ARCHITECTURE_FIELDS, CONFIG_MAX_BYTES, FIELDS, TYPES, TrainConfig
from data import Batches
from errors import UserError, run_cli
from model.config import ModelConfig
from training import checkpoint, device
from training.opening import prepare_data
from training.optim import get_lr
from conftest import ROOT, num_val_windows
from test_best_model import full_validation


def run(corpus, out_dir, *extra, say=lambda msg: None):
    argv = ["--config", "debug", "--data", str(corpus), "--cache_dir", str(corpus.parent / "cache"),
            "--out_dir", str(out_dir), *extra]
    cfg, _, explicit = load_config(argv, cuda_available=False)
    return train.train(cfg, explicit, say=say)


def test_debug_run_end_to_end(corpus, tmp_path):
    out = tmp_path / "run"
    result = run(corpus, out, "--max_iters", "60", "--eval_interval", "30", "--sample_chars", "40")
    history = result["history"]
    assert history[-1][1] < history[0][1] - 0.3  # the loss fell
    for name in ("ckpt_last.safetensors", "ckpt_best.safetensors"):
        state = checkpoint.load(out / name, resume=True)  # weights_only=True inside; all of it, as --resume reads it
        assert not any(key.startswith("_orig_mod.") for key in state["model"])
        assert set(state) == {"model", *checkpoint.CONTENTS}  # what the contract says, no more, no less
        assert isinstance(state["model"], dict)
        assert all(isinstance(state[key], kind) and (type(state[key]) is bool) == (kind is bool)
                   for key, (kind, _) in checkpoint.CONTENTS.items())
    assert checkpoint.load(out / "ckpt_last.safetensors")["iter"] == 60
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == 60 and summary["tokens_seen"] == 60 * 8 * 32
    assert summary["best_val_loss"] <= summary["val_loss"]
    assert summary["full_val_bits_per_char"] == pytest.approx(summary["full_val_loss"] / math.log(2))
    assert 0 < summary["full_val_loss"] < math.log(checkpoint.load(out / "ckpt_last.safetensors")["model_config"]["vocab_size"])
    # where the time went: every phase measured, none negative, together the whole; training is the trained seconds
    seconds = summary["seconds"]
    assert list(seconds) == ["start-up", "data", "opening", "compilation", "training steps", "evaluations",
                             "samples and pictures", "checkpoints", "full validation", "other", "total"]
    assert all(value >= 0 for value in seconds.values()) and seconds["start-up"] == 0  # in-process: no start-up
    assert sum(seconds.values()) - seconds["total"] == pytest.approx(seconds["total"], rel=1e-9)
    assert seconds["training steps"] == summary["train_seconds"]
    assert min(seconds["data"], seconds["opening"], seconds["evaluations"], seconds["samples and pictures"],
               seconds["checkpoints"], seconds["full validation"]) > 0 and seconds["compilation"] == 0  # uncompiled
    assert seconds["total"] >= summary["wall_seconds"]
    events = EventAccumulator(str(out))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert scalars >= {"loss/train", "loss/val", "optim/lr", "optim/grad_norm", "perf/tokens_per_sec", "perf/mfu"}
    assert sorted(tag.split("/")[0] for tag in scalars)[0] == "loss"  # the Scalars tab sorts groups by name
    assert {"config/text_summary", "samples/text_summary"} <= set(events.Tags()["tensors"])
    assert [e.step for e in events.Scalars("loss/val")] == [0, 30, 60]
    # the final figures live in the run itself (one entry per run in TensorBoard's list), at the final step
    final = events.Scalars("summary/full_val_loss")
    assert final[0].value == pytest.approx(summary["full_val_loss"]) and [e.step for e in final] == [60]
    assert not (out / "hparams").exists()
    from tensorboard.plugins.custom_scalar import layout_pb2
    layout = layout_pb2.Layout.FromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    loss_chart = layout.category[0].chart[0].multiline
    assert layout.category[0].title == "loss" and list(loss_chart.tag) == ["^loss/train$", "^loss/val$"]
    from tensorboard.plugins.hparams import plugin_data_pb2
    content = events.SummaryMetadata("_hparams_/experiment").plugin_data.content
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content).experiment
    names = [h.name for h in experiment.hparam_infos]  # TensorBoard shows the first five by name
    assert len(names) <= 5 and {"n_layer", "n_embd", "learning_rate", "optimizer", "max_iters"} <= set(names)
    assert [m.name.tag for m in experiment.metric_infos] == ["summary/full_val_loss", "summary/best_val_loss",
                                                            "summary/last_val_loss"]


def test_how_often_and_on_how_much_a_run_evaluates_never_changes_what_it_trains_on(corpus, tmp_path):
    """Evaluations read batches of their own (the same at every evaluation) and draw their samples with generators
    of their own: runs that evaluate at other steps, on more or fewer batches, with or without samples and pictures,
    train on the same batches with the same dropout to the same weights."""
    common = ("--max_iters", "12", "--dropout", "0.1", "--log_interval", "1", "--patience", "0")
    often = run(corpus, tmp_path / "often", *common, "--eval_interval", "3", "--eval_iters", "2",
                "--sample_chars", "8", "--log_attention", "true")
    rarely = run(corpus, tmp_path / "rarely", *common, "--eval_interval", "12", "--eval_iters", "5")
    assert often["history"] == rarely["history"] and len(often["history"]) == 12
    a, b = (checkpoint.load(tmp_path / name / "ckpt_last.safetensors")["model"] for name in ("often", "rarely"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("optimizer, dtype, total, split", [("adamw", "float32", 30, 20), ("muon", "bfloat16", 12, 8)])
def test_resume_gives_bit_identical_losses(corpus, tmp_path, optimizer, dtype, total, split):
    """A run finished at split, then resumed to total, trains as one run to total. (The first run evaluates at split,
    where the whole run does not: evaluations leave the training batches alone.)"""
    common = ("--dropout", "0.1", "--lr_decay_iters", str(total), "--log_interval", "1",
              "--eval_interval", "7", "--optimizer", optimizer, "--dtype", dtype)
    whole = run(corpus, tmp_path / "whole", "--max_iters", str(total), *common)
    run(corpus, tmp_path / "parts", "--max_iters", str(split), *common)
    resumed = run(corpus, tmp_path / "parts", "--max_iters", str(total), "--resume", *common)
    tail = [loss for it, loss in whole["history"] if it > split]
    assert [loss for _, loss in resumed["history"]] == tail and len(tail) == total - split
    a = checkpoint.load(tmp_path / "whole" / "ckpt_last.safetensors")["model"]
    b = checkpoint.load(tmp_path / "parts" / "ckpt_last.safetensors")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_on_another_text_chooses_the_best_model_anew_on_its_validation(corpus, tmp_path):
    """--resume --data with another text of the same characters (random ones, far harder): the best model is chosen
    again among the evaluations on the new text, so ckpt_best.safetensors and the summary's best are of that text, and the
    note says so; a validation loss of the first text would otherwise have kept its model as the best."""
    first = run(corpus, tmp_path / "r", "--max_iters", "20", "--eval_interval", "10")
    chars = sorted(set(corpus.read_text(encoding="utf-8")))
    noise = corpus.with_name("noise.txt")
    generator = torch.Generator().manual_seed(0)
    noise.write_text("".join(chars) + "".join(chars[i] for i in torch.randint(len(chars), (20000,),
                                                                              generator=generator)), encoding="utf-8")
    said = []
    resumed = run(noise, tmp_path / "r", "--resume", "--max_iters", "30", say=said.append)
    best = checkpoint.load(tmp_path / "r" / "ckpt_best.safetensors")
    assert best["iter"] == 30 and best["best_val_loss"] == resumed["val_loss"] > first["best_val_loss"]
    assert resumed["best_val_loss"] == resumed["val_loss"]
    assert any(line.endswith(f"so ckpt_best.safetensors (val {first['best_val_loss']:.4f}) is replaced at the next "
                             f"evaluation") for line in said), said


def test_resume_refuses_architecture_changes_and_accepts_training_changes(corpus, tmp_path):
    run(corpus, tmp_path / "r", "--max_iters", "4")
    with pytest.raises(UserError, match="^--resume: n_embd was 32 in this run and cannot change to 64: the saved "
                       r"weights and optimizer state fix it; leave --n_embd out"):
        run(corpus, tmp_path / "r", "--resume", "--n_embd", "64")
    with pytest.raises(UserError, match="optimizer was 'adamw' in this run and cannot change to 'muon'"):
        run(corpus, tmp_path / "r", "--resume", "--optimizer", "muon")
    said = []  # dropout is a training setting: it changes, said in one line, and the model trains with it
    result = run(corpus, tmp_path / "r", "--resume", "--max_iters", "5", "--dropout", "0.1", say=said.append)
    assert result["iterations"] == 5 and "resume: dropout changed from 0.0 to 0.1" in said
    assert checkpoint.load(tmp_path / "r" / "ckpt_last.safetensors")["model_config"]["dropout"] == 0.1
    said = []
    result = run(corpus, tmp_path / "r", "--resume", "--max_iters", "6", "--learning_rate", "1e-3", say=said.append)
    assert result["iterations"] == 6
    # the training seconds cover both sessions, and the done line says so; the whole command's time is given once,
    # by the line on where the time went
    assert any(line.startswith("done: 6 steps, ") and line.endswith(" s of training steps in all its sessions")
               for line in said), said
    spent = [line for line in said if not line.startswith("this run: about")]  # the estimate, before step 5
    assert len([line for line in spent if "in all" in line or "this session" in line]) == 1
    assert not [line for line in said if "checksum" in line]
    text = corpus.read_text(encoding="utf-8")
    corpus.write_text(text[len(text) // 2:] + text[: len(text) // 2], encoding="utf-8")  # same characters, new order
    said = []
    run(corpus, tmp_path / "r", "--resume", "--max_iters", "8", say=said.append)
    assert f"note: the text of {corpus} is not the text step 6 was trained on (its checksum differs)" in "".join(said)
    moved = corpus.with_name("moved.txt")
    corpus.rename(moved)
    saved_data = ["--out_dir", str(tmp_path / "r"), "--resume", "--max_iters", "10"]  # no --data: the run's own
    with pytest.raises(UserError, match=f"--resume: the text this run trained on, {corpus}, is no longer there; put "
                       "it back, or give its new place with --data"):
        train.train(*load_config(saved_data, False)[::2], say=lambda m: None)
    assert run(moved, tmp_path / "r", "--resume", "--max_iters", "10")["iterations"] == 10


def test_resume_on_a_text_with_other_characters_names_a_few_of_them_safely(corpus, tmp_path):
    """A --data whose vocabulary differs from the checkpoint's (here as many characters, two of them others) is
    refused naming the characters only on each side, written as repr writes them (a tab as '\\t'); vocabularies of the
    same characters in another order are said to be that."""
    run(corpus, tmp_path / "r", "--max_iters", "2")
    text = corpus.read_text(encoding="utf-8")
    assert "\t" not in text and "é" not in text and "q" in text and "v" in text
    other = corpus.with_name("other.txt")
    other.write_text(text.replace("q", "\t").replace("v", "é"), encoding="utf-8")
    before = (tmp_path / "r" / "ckpt_last.safetensors").read_bytes()
    with pytest.raises(UserError) as refused:
        run(other, tmp_path / "r", "--resume", "--max_iters", "4")
    assert ("vocabulary differs from " in str(refused.value)
            and "only in the corpus: '\\t' 'é', only in the checkpoint's: 'q' 'v')" in str(refused.value))
    assert (tmp_path / "r" / "ckpt_last.safetensors").read_bytes() == before
    from data.tokenizer import vocabulary_difference
    assert vocabulary_difference("ab", "ba", ("x", "y")) == "the same characters in another order"
    assert vocabulary_difference("abcdefgh\x00", "", ("x", "y")) == "only in x: 'a' 'b' 'c' 'd' 'e' 'f' and 3 more"


def test_resume_on_a_text_too_short_for_its_windows_names_what_a_resume_can_change(tmp_path):
    """A resume keeps the run's block_size and val_fraction, so a --data too short for its windows is refused with the
    ways a resume has (a longer text, such as the run's own; a new run in another folder with a block_size that fits,
    where one does), never a --block_size or --val_fraction, which it would refuse; the checkpoint is untouched."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("ab\n" * 400)
    run(corpus, tmp_path / "r", "--max_iters", "1", "--full_val", "false")
    before = (tmp_path / "r" / "ckpt_last.safetensors").read_bytes()
    for repeats, split, new_run in ((30, "val split of {} has 9 characters", ", or train a new run on this text with "
                                     "--block_size 8 or less in another --out_dir"),  # too short for block_size 32
                                    (3, "train split of {} has 8 characters", "")):  # val 1: too short for any
        other = tmp_path / f"other{repeats}.txt"
        other.write_text("ab\n" * repeats)
        with pytest.raises(UserError) as refused:
            run(other, tmp_path / "r", "--resume", "--max_iters", "4")
        assert str(refused.value) == (f"--resume: the {split.format(other)}, fewer than block_size + 1 = 33, and a "
                                      f"resume keeps the run's block_size (32) and val_fraction (0.1); resume on a "
                                      f"longer text (this run was trained on {corpus}){new_run}")
        assert (tmp_path / "r" / "ckpt_last.safetensors").read_bytes() == before


@pytest.mark.parametrize("flag, value, was", [("--val_fraction", "0.5", "0.1"), ("--seed", "7", "1337"),
                                              ("--encoding", "latin-1", "'utf-8'"),
                                              ("--encoding_errors", "replace", "'strict'"),
                                              ("--init_from", "/elsewhere/run", "''")])
def test_resume_keeps_what_its_evaluations_measure(corpus, tmp_path, flag, value, was):
    """A resumed run's validation split, the reading of its text and the seed of its evaluations' windows cannot
    change (validation could cover text the model trained on, and the best model be chosen by losses measured on
    other text), nor the model it started from: one line naming the setting, a new run and --init_from; nothing is
    written. The run's own value is no change and passes."""
    run(corpus, tmp_path / "r", "--max_iters", "2")
    before = (tmp_path / "r" / "ckpt_last.safetensors").read_bytes()
    name = flag[2:]
    with pytest.raises(UserError, match=f"^--resume: {name} was {was} in this run and cannot change to .*; leave "
                       f"{flag} out, or fine-tune it with --init_from {tmp_path / 'r'}$"):
        run(corpus, tmp_path / "r", "--resume", flag, value)
    assert (tmp_path / "r" / "ckpt_last.safetensors").read_bytes() == before
    assert run(corpus, tmp_path / "r", "--resume", flag, was.strip("'"), "--max_iters", "3")["iterations"] == 3


def test_a_fine_tuned_run_resumes_with_its_init_from_however_spelled(corpus, tmp_path, monkeypatch):
    """A run fine-tuned --init_from a folder resumes with that --init_from given again, spelled relatively, with ./ or
    a trailing slash, absolutely, or as the checkpoint file in it; another model's folder is refused."""
    run(corpus, tmp_path / "base", "--max_iters", "2")
    run(corpus, tmp_path / "other", "--max_iters", "2")
    monkeypatch.chdir(tmp_path)
    run(corpus, tmp_path / "tuned", "--init_from", "base", "--max_iters", "3")
    for steps, spelling in enumerate(["base", "./base/", str(tmp_path / "base"), "base/ckpt_best.safetensors"], start=4):
        assert run(corpus, tmp_path / "tuned", "--resume", "--init_from", spelling, "--max_iters",
                   str(steps))["iterations"] == steps
    with pytest.raises(UserError, match="^--resume: init_from was 'base' in this run and cannot change to 'other'"):
        run(corpus, tmp_path / "tuned", "--resume", "--init_from", "other", "--max_iters", "9")


def test_out_dir_with_another_run_needs_resume_or_overwrite(corpus, tmp_path):
    run(corpus, tmp_path / "r", "--max_iters", "2")
    before = (tmp_path / "r" / "ckpt_last.safetensors").read_bytes()
    with pytest.raises(UserError, match="already holds a run; pass --resume .* --overwrite"):
        run(corpus, tmp_path / "r", "--max_iters", "2")
    assert (tmp_path / "r" / "ckpt_last.safetensors").read_bytes() == before
    assert run(corpus, tmp_path / "r", "--max_iters", "3", "--overwrite")["iterations"] == 3
    with pytest.raises(UserError, match="no .*ckpt_last.safetensors to continue"):
        run(corpus, tmp_path / "empty", "--resume")


def test_learning_rate_schedule():
    cfg, _, _ = load_config(["--config", "debug", "--max_iters", "100", "--warmup_iters", "10",
                             "--learning_rate", "1e-3", "--min_lr", "1e-4"], False)
    assert get_lr(0, cfg) == pytest.approx(1e-3 / 11)
    assert get_lr(9, cfg) == pytest.approx(1e-3 * 10 / 11)
    assert get_lr(10, cfg) == pytest.approx(1e-3)
    assert get_lr(55, cfg) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert get_lr(100, cfg) == pytest.approx(1e-4)
    # wsd: flat after the warm-up until the last 40% of the 90 steps after it, then a straight line to min_lr
    wsd, _, _ = load_config(["--config", "debug", "--max_iters", "100", "--warmup_iters", "10", "--learning_rate",
                             "1e-3", "--min_lr", "1e-4", "--lr_schedule", "wsd", "--warmdown_fraction", "0.4"], False)
    assert [get_lr(it, wsd) for it in (10, 40, 64)] == [1e-3] * 3
    for it in (70, 82, 91, 99):
        assert get_lr(it, wsd) == pytest.approx(1e-3 - (it - 64) / 36 * 9e-4)
    assert get_lr(100, wsd) == pytest.approx(1e-4)


def test_a_run_that_ends_inside_its_warm_up_says_so_before_it_starts(corpus, tmp_path):
    messages = []
    run(corpus, tmp_path / "a", "--max_iters", "8", "--warmup_iters", "10", "--learning_rate", "1e-3",
        say=messages.append)
    notes = [m for m in messages if m.startswith("note: --warmup_iters 10 is not shorter than --max_iters 8")]
    assert notes == ["note: --warmup_iters 10 is not shorter than --max_iters 8, so the learning rate only rises, to "
                     "0.00073. Give a shorter warm-up, e.g. --warmup_iters 1"]
    assert messages.index(notes[0]) < next(i for i, m in enumerate(messages) if ": evaluation: " in m)  # before step 0
    quiet = []
    run(corpus, tmp_path / "b", "--max_iters", "11", "--warmup_iters", "10", say=quiet.append)
    assert not [m for m in quiet if "--warmup_iters" in m]


# --- the command line -----------------------------------------------------------------------------
def test_overrides_both_spellings_and_presets():
    cfg, note, explicit = load_config(["--config", "debug", "--max_iters=7", "--batch_size", "3", "--bias", "false",
                                       "--resume"], False)
    assert (cfg.max_iters, cfg.batch_size, cfg.bias, cfg.resume, cfg.n_layer) == (7, 3, False, True, 2)
    assert note == "config: debug" and {"max_iters", "batch_size", "n_layer"} <= explicit


def test_default_preset_follows_the_device():
    cpu_cfg, cpu_note, _ = load_config([], cuda_available=False)
    gpu_cfg, gpu_note, _ = load_config([], cuda_available=True)
    assert cpu_cfg.config_name == "shakespeare_char_cpu" and "CUDA is not available" in cpu_note
    assert (gpu_cfg.config_name, gpu_cfg.n_layer, gpu_cfg.n_embd, gpu_cfg.block_size) == \
        ("shakespeare_char_gpu", 6, 384, 256)
    assert "CUDA is available" in gpu_note


def evaluation_due(it: int, cfg) -> bool:
    """The rule the loop's arithmetic implements, step by step: every eval_interval steps and at the last step."""
    return it % cfg.eval_interval == 0 or it == cfg.max_iters


@pytest.mark.parametrize("preset", ["shakespeare_char_cpu", "shakespeare_char_cpu_long", "shakespeare_char_gpu"])
def test_the_default_presets_evaluate_often_enough_for_a_curve(preset):
    """Each default preset evaluates at least 10 times from step 0 to max_iters (loss/val as a curve, not 3 points),
    and --patience covers at least as many steps as 5 evaluations of 150 steps would (it cannot stop them sooner)."""
    from training.evaluation import evaluations_left
    cfg = load_config(["--config", preset], False)[0]
    assert sum(evaluation_due(it, cfg) for it in range(cfg.max_iters + 1)) == evaluations_left(0, cfg) >= 10
    assert cfg.patience * cfg.eval_interval >= min(5 * 150, cfg.max_iters)


@pytest.mark.parametrize("interval, max_iters", [(30, 300), (7, 40), (50, 49), (1, 5)])
def test_the_loops_next_evaluation_is_the_first_step_from_here_that_evaluation_due_names(interval, max_iters):
    """The loop keeps the step of its next evaluation instead of asking at every step: for every step from 0 to
    max_iters, next_evaluation() is the first step from there on at which evaluation_due() holds."""
    from training.evaluation import next_evaluation
    cfg = load_config(["--config", "debug", "--eval_interval", str(interval), "--max_iters", str(max_iters)],
                      False)[0]
    for it in range(max_iters + 1):
        assert next_evaluation(it, cfg) == next(j for j in range(it, max_iters + 1) if evaluation_due(j, cfg))


@pytest.mark.parametrize("argv, message", [
    (["--lerning_rate", "1"], "unknown option --lerning_rate; did you mean --learning_rate?"),
    (["--max_iters", "ten"], "--max_iters: expected an integer, got 'ten'"),
    (["--dropout", "lots"], "--dropout: expected a number, got 'lots'"),
    (["--bias", "maybe"], "--bias: expected true or false, got 'maybe'"),
    (["--n_layer"], "argument --n_layer: expected one argument"),
    (["--config", "debug", "--dropout", "1"], "dropout must be in [0, 1), got 1.0"),
    (["--config", "shakespear"], "did you mean shakespeare_char"),
    (["--config", "debug", "--n_embd", "33"], "n_embd (33) must be divisible by n_head (2)"),
    (["--dtype", "fp8"], "--dtype 'fp8': must be one of auto, float32"),
    (["--eval_only"], "unknown option --eval_only: here it is python scripts/evaluate.py --out_dir"),
    (["--n_embd", str(2**70)], "n_embd must be at most 2,147,483,647, got 1,180,591,620,717,411,303,424"),
    (["mine.toml"], "mine.toml: a config file is given with --config: "),
])
def test_bad_command_lines_are_one_line_errors(argv, message, capsys):
    assert run_cli(train.main, argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("error: ")


def test_every_count_has_a_ceiling_named_in_one_line_and_the_ceiling_itself_is_accepted(corpus, tmp_path, capsys):
    """--max_iters 10^20 was accepted (its estimate: 18 billion years), and past 10^308 it, warmup_iters, batch_size,
    grad_accum_steps and eval_iters ended in an OverflowError (the estimate, the learning rate, the memory check), and
    eval_iters 2^63 in the OOM killer. Every integer setting now has a ceiling: a value past it is one line naming the
    setting, exit 2, before anything runs; the new ceilings are named in their lines and are themselves accepted."""
    where = ["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "cache"), "--out_dir",
             str(tmp_path / "run")]
    for name, kind in TYPES.items():
        if kind is int:
            assert run_cli(train.main, [*where, f"--{name}", str(10**400)]) == 2, name
            err = capsys.readouterr().err
            assert err.startswith(f"error: --{name} ")
            assert err.count("\n") == 1 and "Traceback" not in err, err
    steps = "must be at most 1,000,000,000,000"
    ceilings = {**{name: (10**12, steps) for name in ("max_iters", "warmup_iters", "lr_decay_iters", "eval_interval",
                                                      "log_interval", "max_nonfinite_steps", "patience")},
                **{name: (2**31 - 1, "must be at most 2,147,483,647") for name in ("batch_size", "grad_accum_steps")},
                "eval_iters": (10**6, "must be at most 1,000,000")}
    for name, (ceiling, said) in ceilings.items():
        assert run_cli(train.main, [*where, f"--{name}", str(ceiling + 1)]) == 2
        assert capsys.readouterr().err == f"error: --{name} {ceiling + 1}: {said}\n"
        assert getattr(load_config([*where, f"--{name}", str(ceiling)], False)[0], name) == ceiling
    assert run_cli(train.main, [*where, "--max_iters", str(10**20)]) == 2
    assert capsys.readouterr().err == f"error: --max_iters {10**20}: {steps}\n"
    assert not (tmp_path / "run").exists()


def test_help_lists_every_field_with_default(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for name, f in FIELDS.items():
        if name != "config_name":
            assert f"--{name}" in text and " ".join(f.metadata["help"].split()) in text
    assert "(default: 0.001)" in text


def test_the_model_settings_have_one_source(tmp_path):
    """TrainConfig's model fields are ModelConfig's: the same defaults, the same checks, in the same words."""
    assert TrainConfig().model_config(vocab_size=65) == ModelConfig()
    assert [f.name for f in fields(ModelConfig) if f.name != "vocab_size"] == list(ARCHITECTURE_FIELDS)
    for bad in (dict(n_embd=33, n_head=2), dict(dropout=1.5), dict(position="sinusoid"), dict(n_layer=-1)):
        with pytest.raises(ValueError) as from_model:
            ModelConfig(**bad)
        with pytest.raises(ValueError) as from_training:
            TrainConfig(**bad)
        assert str(from_model.value) == str(from_training.value)
    preset = tmp_path / "bare.toml"  # a preset that leaves the model alone gets the model's defaults
    preset.write_text("max_iters = 3\n")
    cfg, _, _ = load_config(["--config", str(preset)], False)
    assert cfg.model_config(65) == ModelConfig()


def test_a_config_that_is_a_folder_or_not_utf8_text_says_so_and_how_to_fix_it(tmp_path, capsys):
    """--config DIR says it is a folder (not 'no such preset or file'); a UTF-16 or binary file (a nanoGPT .py config
    too) says which byte is not UTF-8 and to save it so; a file beyond CONFIG_MAX_BYTES, a pipe or a device is refused
    unread, and TOML or Python nested deeper than Python's stack is not valid: one line each, exit 2. A folder named
    like a preset leaves the preset chosen."""
    utf16, binary, utf16_py = tmp_path / "utf16.toml", tmp_path / "binary.toml", tmp_path / "utf16.py"
    utf16.write_text("max_iters = 3\n", encoding="utf-16")
    utf16_py.write_text("max_iters = 3\n", encoding="utf-16")
    binary.write_bytes(bytes(range(128, 256)))
    big, fifo, deep, deep_py = (tmp_path / name for name in ("big.toml", "fifo.toml", "deep.toml", "deep.py"))
    big.write_text("#" * CONFIG_MAX_BYTES + "\n")
    os.mkfifo(fifo)
    deep.write_text("max_iters = " + "[" * 5000 + "]" * 5000 + "\n")
    deep_py.write_text("max_iters = " + "1+" * 100_000 + "1\n")
    for spec, message in ((tmp_path, f"--config {tmp_path}: a folder; give a .toml file"),
                          (fifo, f"--config {fifo}: not a regular file (a device, pipe or socket); save it to a file"),
                          ("/dev/zero", "--config /dev/zero: not a regular file (a device, pipe or socket)"),
                          (deep, f"--config {deep}: not valid TOML (nested too deep); give a TOML file of settings"),
                          (deep_py, f"--config {deep_py}: cannot be read as a Python config (RecursionError)"),
                          (utf16_py, f"--config {utf16_py}: not UTF-8 text: byte 0xff at position 0 cannot be decoded "
                                     f"(it begins with UTF-16's byte-order mark); save it as UTF-8"),
                          (utf16, f"--config {utf16}: not UTF-8 text: byte 0xff at position 0 cannot be decoded (it "
                                  f"begins with UTF-16's byte-order mark); save it as UTF-8"),
                          (binary, f"--config {binary}: not UTF-8 text: byte 0x80 at position 0 cannot be decoded; "
                                   f"save it as UTF-8"),
                          (big, f"--config {big} is {CONFIG_MAX_BYTES + 1:,} bytes, more than the "
                                f"{CONFIG_MAX_BYTES:,} such a file can hold; give a TOML file of settings")):
        assert run_cli(train.main, ["--config", str(spec)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    (tmp_path / "debug").mkdir()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert load_config(["--config", "debug"], False)[0].config_name == "debug"
    finally:
        os.chdir(cwd)


def test_a_bad_value_names_the_config_file_and_key_it_came_from_or_the_flag(tmp_path, capsys):
    """A value a --config file gives is blamed on that file and its key (it was blamed on a flag nobody typed); the
    same check of a value typed on the command line names the flag."""
    negative, dropout = tmp_path / "c_neg.toml", tmp_path / "c_drop.toml"
    negative.write_text("max_iters = -5\n")
    dropout.write_text("dropout = 1.5\n")
    for argv, message in ((["--config", str(negative)], f"error: {negative}: max_iters = -5: must not be negative; "
                                                         "correct it there, or give --max_iters to set it"),
                          (["--config", str(dropout)], f"error: {dropout}: dropout must be in [0, 1), got 1.5; "
                                                        "correct it there, or give --dropout to set it"),
                          (["--config", str(negative), "--max_iters", "-3"], "error: --max_iters -3: must not be "
                                                                             "negative\n"),
                          (["--config", "debug", "--dropout", "1"], "error: --dropout must be in [0, 1), got 1.0\n"),
                          # a check of two settings blames neither (nor the preset the other came from)
                          (["--config", "debug", "--n_head", "5"], "error: n_embd (32) must be divisible by n_head "
                                                                   "(5); try n_embd=30\n"),
                          # the n_embd suggested fits rope's even heads (161 / 7 is 23), and the ceiling on sizes
                          (["--n_head", "7"], "error: n_embd (160) must be divisible by n_head (7); try n_embd=154\n"),
                          (["--n_head", "2", "--n_embd", "2147483647"], "error: n_embd (2147483647) must be divisible "
                                                                        "by n_head (2); try n_embd=2147483644\n")):
        assert run_cli(train.main, argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err
    assert load_config(["--config", str(negative), "--max_iters", "3"], False)[0].max_iters == 3
    assert load_config(["--n_head", "7", "--n_embd", "154"], False)[0].n_embd == 154  # the suggestion is taken


def test_two_presets_are_refused_in_one_line_and_one_named_twice_is_taken():
    """--config debug --config shakespeare_char_cpu: one line naming both (the second replaced the first, unsaid);
    the same preset twice, however named (a repeated flag in a script), is that preset."""
    with pytest.raises(UserError) as refused:
        load_config(["--config", "debug", "--config", "shakespeare_char_cpu"], False)
    assert str(refused.value) == "--config is given 2 times (debug, shakespeare_char_cpu); give one"
    assert load_config(["--config", "debug", "--config=configs/debug.toml"], False)[0] == load_config(
        ["--config", "debug"], False)[0]  # (one preset, named two ways)


def test_bad_preset_file_names_the_field(tmp_path):
    bad = tmp_path / "mine.toml"
    bad.write_text("n_layers = 3\n")
    with pytest.raises(UserError, match="unknown field n_layers; did you mean n_layer"):
        load_config(["--config", str(bad)], False)
    for table in ("[model]\nn_layer = 3\n", "model.n_layer = 3\n"):  # a TOML table, or a dotted key that makes one
        bad.write_text("max_iters = 5\n" + table)
        with pytest.raises(UserError) as refused:
            load_config(["--config", str(bad)], False)
        assert str(refused.value) == (f"{bad}: [model] is a table; move its settings to the top level as "
                                      f"name = value lines")
    bad.write_text("n_layer = {x = 1}\n")  # a setting's name with a table for its value: the wrong type
    with pytest.raises(UserError, match="n_layer"):
        load_config(["--config", str(bad)], False)


def compiled_with(monkeypatch, backend) -> list:
    """torch.compile through the given backend (dynamo's capture, then backend(graph, inputs)); returns the list of
    every call's keyword arguments."""
    calls, real_compile = [], torch.compile

    def compile_with_backend(module, **kwargs):
        calls.append(kwargs)
        return real_compile(module, backend=backend)
    monkeypatch.setattr(torch, "compile", compile_with_backend)
    torch.compiler.reset()
    return calls


def debug_argv(corpus, tmp_path, name, *extra):
    return ["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "c"),
            "--out_dir", str(tmp_path / name), *extra]


def train_argv(argv: list[str], say=lambda message: None) -> dict:
    cfg, _, explicit = load_config(argv, False)
    return train.train(cfg, explicit, say=say)


@pytest.mark.slow
def test_a_run_compiled_by_inductor_trains_as_the_uncompiled_one_to_rounding(corpus, tmp_path):
    """The real compiler, as a GPU run uses it (each block compiled, forward and backward; inductor generates C++
    here where it generates Triton on CUDA): no fallback, and the losses and weights of the uncompiled run to
    float32 rounding (inductor fuses and reorders the arithmetic)."""
    messages = []
    common = ["--dtype", "float32", "--max_iters", "4", "--eval_interval", "4", "--full_val", "false"]
    compiled = train_argv(debug_argv(corpus, tmp_path, "inductor", "--compile", "true", *common), say=messages.append)
    assert any(m.startswith("torch.compile (") for m in messages)
    assert not any("torch.compile failed" in m for m in messages), messages
    plain = train_argv(debug_argv(corpus, tmp_path, "eager", "--compile", "false", *common))
    assert [it for it, _ in compiled["history"]] == [it for it, _ in plain["history"]]
    assert [loss for _, loss in compiled["history"]] == pytest.approx([loss for _, loss in plain["history"]], rel=1e-4)
    weights = [checkpoint.load(tmp_path / name / "ckpt_last.safetensors")["model"] for name in ("inductor", "eager")]
    for name in weights[1]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_a_failing_torch_compile_falls_back_to_eager_with_a_warning(corpus, tmp_path, monkeypatch, scope):
    def exploding(graph, inputs):  # what inductor does when it cannot build a kernel: it raises at the first call
        raise RuntimeError("inductor exploded\nmore detail")
    compiled_with(monkeypatch, exploding)
    messages = []
    argv = debug_argv(corpus, tmp_path, "run", "--compile", "true", "--max_iters", "6", "--compile_scope", scope)
    result = train_argv(argv, say=messages.append)
    warnings = [m for m in messages if m.startswith("warning: torch.compile failed")]
    assert len(warnings) == 1 and "RuntimeError: inductor exploded" in warnings[0], messages
    plain = train_argv(debug_argv(corpus, tmp_path, "plain", "--max_iters", "6"))
    assert result["history"] == plain["history"] and result["full_val_loss"] == plain["full_val_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_a_compiled_step_whose_gradients_are_not_finite_falls_back_and_trains_as_the_uncompiled_run(
        corpus, tmp_path, monkeypatch, scope):
    """A compiler whose backward computes NaN where the uncompiled one does not (inductor's AVX-512 bfloat16 code on
    some CPUs does): the first step is computed again uncompiled, with the warning, and the run's every logged loss
    and its full validation are the uncompiled run's."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def forward(graph, inputs):
        return make_boxed_func(graph.forward)

    def nan_backward(graph, inputs):
        def run(args):
            return [g * float("nan") if isinstance(g, torch.Tensor) else g for g in graph.forward(*args)]
        run._boxed_call = True
        return run
    compiled_with(monkeypatch, aot_autograd(fw_compiler=forward, bw_compiler=nan_backward))
    messages = []
    argv = debug_argv(corpus, tmp_path, "run", "--compile", "true", "--max_iters", "6", "--compile_scope", scope)
    result = train_argv(argv, say=messages.append)
    assert [m for m in messages if m.startswith("warning: torch.compile failed")] == \
        ["warning: torch.compile failed (its first step's gradients were not finite; that step is computed again "
         "uncompiled); continuing without it (--compile false skips the attempt)"]
    plain = train_argv(debug_argv(corpus, tmp_path, "plain", "--max_iters", "6"))
    assert result["history"] == plain["history"] and result["full_val_loss"] == plain["full_val_loss"]


@pytest.mark.slow
def test_a_run_whose_compilation_failed_is_not_compiled_again_when_resumed(corpus, tmp_path, monkeypatch):
    """The fallback is recorded in the run's config (--compile false in its checkpoints, said once), so that a resume
    does not pay for compiling and failing again; --resume --compile true tries again."""
    def exploding(graph, inputs):
        raise RuntimeError("inductor exploded")
    compiled_with(monkeypatch, exploding)
    messages = []
    train_argv(debug_argv(corpus, tmp_path, "run", "--compile", "true", "--max_iters", "6"), say=messages.append)
    assert "note: the run's config now says --compile false, so a resume does not try again (--resume --compile " \
           "true does)" in messages
    assert checkpoint.load(tmp_path / "run" / "ckpt_last.safetensors")["run_config"]["compile"] == "false"
    resumed = []
    train_argv(debug_argv(corpus, tmp_path, "run", "--resume", "--max_iters", "8"), say=resumed.append)
    assert not [m for m in resumed if "torch.compile" in m], resumed
    again = []
    train_argv(debug_argv(corpus, tmp_path, "run", "--resume", "--max_iters", "10", "--compile", "true"),
               say=again.append)
    assert "resume: compile changed from 'false' to 'true'" in again
    assert len([m for m in again if m.startswith("warning: torch.compile failed")]) == 1, again


@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_torch_compile_that_cannot_start_is_a_warning_too(corpus, tmp_path, monkeypatch, scope):
    """torch.compile refusing at once is the same warning as a compilation failing at first use, and it is recorded
    the same way: the run's checkpoint says --compile false, with the note."""
    def unsupported(module, **kwargs):  # e.g. a Python that dynamo does not support yet: torch.compile itself raises
        raise RuntimeError("torch.compile is not supported on this Python")
    monkeypatch.setattr(torch, "compile", unsupported)
    messages = []
    argv = debug_argv(corpus, tmp_path, "run", "--compile", "true", "--max_iters", "2", "--full_val", "false",
                      "--compile_scope", scope)
    assert train_argv(argv, say=messages.append)["iterations"] == 2
    assert [m for m in messages if m.startswith("warning: torch.compile failed")] == \
        ["warning: torch.compile failed (RuntimeError: torch.compile is not supported on this Python); "
         "continuing without it (--compile false skips the attempt)"]
    assert "note: the run's config now says --compile false, so a resume does not try again (--resume --compile " \
           "true does)" in messages
    assert checkpoint.load(tmp_path / "run" / "ckpt_last.safetensors")["run_config"]["compile"] == "false"


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_a_compiled_run_trains_the_model_it_saves_step_for_step_as_an_uncompiled_one(corpus, tmp_path, monkeypatch,
                                                                                      scope):
    """Compiled through dynamo with eager kernels (the same arithmetic), the losses, the saved weights and the full
    validation equal the uncompiled run's bit for bit: the compiled blocks train the model's own parameters."""
    calls = compiled_with(monkeypatch, "eager")
    runs = {}
    for name, extra in (("plain", ["--compile", "false"]), (scope, ["--compile", "true", "--compile_scope", scope])):
        cfg, _, explicit = load_config(debug_argv(corpus, tmp_path, name, "--max_iters", "12", "--eval_interval", "6",
                                                  "--log_interval", "1", *extra), False)
        runs[name] = train.train(cfg, explicit, say=lambda m: None)
    assert len(calls) == (2 if scope == "blocks" else 1)  # debug has 2 blocks: one torch.compile each
    assert runs[scope]["history"] == runs["plain"]["history"] and len(runs["plain"]["history"]) == 12
    assert runs[scope]["full_val_loss"] == runs["plain"]["full_val_loss"]
    weights = [checkpoint.load(tmp_path / name / "ckpt_last.safetensors")["model"] for name in ("plain", scope)]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_compile_mode_and_scope_reach_torch_compile_and_bad_ones_are_refused(corpus, tmp_path, monkeypatch):
    calls = []

    def recording_compile(module, **kwargs):
        calls.append((type(module).__name__, kwargs.get("mode")))
        return module
    monkeypatch.setattr(torch, "compile", recording_compile)
    for mode, scope in (("max-autotune-no-cudagraphs", "blocks"), ("default", "model")):
        calls.clear()
        argv = debug_argv(corpus, tmp_path, f"run-{scope}", "--compile", "true", "--max_iters", "2", "--full_val",
                          "false", "--compile_mode", mode, "--compile_scope", scope)
        messages = []
        train_argv(argv, say=messages.append)
        want = [("Block", mode)] * 2 if scope == "blocks" else [("GPT", None)]  # default: torch's own
        assert calls == want
        # the run says so before it waits for the compilation (and names what it compiles)
        said = [m for m in messages if m.startswith("torch.compile (")]
        assert said == [m for m in messages if "torch.compile" in m][:1] and len(said) == 1
        assert f"scope {scope}" in said[0] and (f"mode {mode}" in said[0]) == (mode != "default")
        assert messages.index(said[0]) < next(i for i, m in enumerate(messages) if m.startswith("step 0:"))
    messages = []
    train_argv(debug_argv(corpus, tmp_path, "plain", "--max_iters", "2", "--full_val", "false"), say=messages.append)
    assert not any("torch.compile" in m for m in messages)  # a CPU's auto: not compiled, nothing said
    argv = debug_argv(corpus, tmp_path, "bad")
    with pytest.raises(UserError, match="--compile_mode 'fast': must be one of default, max-autotune-no-cudagraphs"):
        load_config(argv + ["--compile_mode", "fast"], False)
    for mode in ("reduce-overhead", "max-autotune"):  # CUDA graphs: not offered until a GPU measures them
        with pytest.raises(UserError, match=f"--compile_mode '{mode}': replays CUDA graphs, which training does not"):
            load_config(argv + ["--compile_mode", mode, "--compile_scope", "model"], False)
    with pytest.raises(UserError, match="--compile_scope 'layers': must be one of blocks, model"):
        load_config(argv + ["--compile_scope", "layers"], False)


def test_muon_dtype_reaches_the_newton_schulz_iterations_of_a_run(corpus, tmp_path, monkeypatch):
    """--muon_dtype float32 or bfloat16 is the precision every Newton-Schulz call of the run computes in, whatever the
    CPU has; a value outside the three is refused in one line naming them."""
    import training.optim as optim
    seen: list[torch.dtype] = []
    real = optim.orthogonalize
    monkeypatch.setattr(optim, "orthogonalize", lambda *args: seen.append(args[-1]) or real(*args))
    for choice, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        seen.clear()
        train_argv(debug_argv(corpus, tmp_path, choice, "--optimizer", "muon", "--muon_dtype", choice, "--max_iters",
                              "2", "--full_val", "false"))
        assert seen and set(seen) == {dtype}
    with pytest.raises(UserError, match="--muon_dtype 'float16': must be one of auto, float32, bfloat16"):
        load_config(debug_argv(corpus, tmp_path, "bad") + ["--muon_dtype", "float16"], False)


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["blocks", "model"])
@pytest.mark.parametrize("compile_eval, graphs", [("true", 2), ("false", 1)])
def test_a_compiled_run_compiles_its_model_once_for_training_and_once_for_evaluation(corpus, tmp_path, monkeypatch,
                                                                                      compile_eval, graphs, scope):
    """Full validation's last batch is padded to the batch size: a smaller one would compile the model a third time
    (10-13 s on a 2-core CPU for the debug preset). --compile_eval false evaluates uncompiled: one graph. Compiled by
    blocks, every block runs the one graph compiled for the first. The run's compile note names what waits for it."""
    traced, said = [], []

    def counting(graph, inputs):  # dynamo's capture without code generation
        traced.append(graph)
        return graph.forward
    compiled_with(monkeypatch, counting)
    cfg, _, explicit = load_config(debug_argv(corpus, tmp_path, "run", "--compile", "true", "--max_iters", "4",
                                              "--eval_interval", "2", "--compile_eval", compile_eval,
                                              "--compile_scope", scope), False)
    summary = train.train(cfg, explicit, say=said.append)
    assert num_val_windows(train_batches(cfg)) % cfg.batch_size  # the last batch would be smaller
    assert len(traced) == graphs
    waits = "the first evaluation and the first step wait" if compile_eval == "true" else "the first step waits"
    assert [line for line in said if line.startswith("torch.compile (scope")] == [
        f"torch.compile (scope {scope}): {waits} while it compiles, longest on a machine's first run (its cache serves "
        f"later ones); --compile false skips it"]
    by_hand = full_validation(tmp_path / "run" / summary["model_checkpoint"], corpus.read_text(encoding="utf-8"))
    assert summary["full_val_loss"] == pytest.approx(by_hand, rel=1e-5)  # the padding rows count for nothing


@pytest.mark.slow
def test_compilation_is_a_phase_of_its_own_and_never_training_time(corpus, tmp_path, monkeypatch):
    """What torch.compile takes (here a backend that needs 1 s per graph: the training graph at the first step,
    the evaluation graph at the first evaluation) is counted as compilation, not as training steps, evaluations or
    the training clock behind tokens/s."""
    def slow(graph, inputs):
        time.sleep(1.0)
        return graph.forward
    compiled_with(monkeypatch, slow)
    cfg, _, explicit = load_config(debug_argv(corpus, tmp_path, "run", "--compile", "true", "--max_iters", "4",
                                              "--eval_interval", "4", "--full_val", "false"), False)
    seconds = train.train(cfg, explicit, say=lambda m: None)["seconds"]
    assert seconds["compilation"] >= 2.0  # two graphs
    assert seconds["training steps"] < 1.0 and seconds["evaluations"] < 1.0  # neither holds a graph's second
    assert sum(seconds.values()) - seconds["total"] == pytest.approx(seconds["total"], rel=1e-9)


def train_batches(cfg):
    return Batches(prepare_data(cfg, lambda m: None), cfg.block_size, cfg.batch_size, "cpu")


@pytest.mark.parametrize("has_units", [True, False])
def test_auto_dtype_on_cpu_is_bfloat16_only_with_bfloat16_units_and_for_sampling_only_a_large_model(monkeypatch,
                                                                                                    has_units):
    monkeypatch.setattr(machine, "cpu_has_bfloat16_units", lambda: has_units)
    cpu = torch.device("cpu")
    assert pick_dtype("auto", cpu) == (torch.bfloat16 if has_units else torch.float32)
    limit = CPU_BFLOAT16_SAMPLING_PARAMS
    assert pick_dtype("auto", cpu, sampling=True) == torch.float32
    assert pick_dtype("auto", cpu, sampling=True, params=limit) == torch.float32
    assert pick_dtype("auto", cpu, sampling=True, params=limit + 1) == (torch.bfloat16 if has_units
                                                                                else torch.float32)
    assert pick_dtype("bfloat16", cpu, sampling=True) == torch.bfloat16  # asked for by name: given
    with pytest.raises(UserError, match="float16: not supported on CPU"):
        pick_dtype("float16", cpu)  # training: CPU autocast has no float16
    assert pick_dtype("float16", cpu, sampling=True) == torch.float16  # sampling casts the weights instead


PAGE_FAULTS = """
import resource, sys, torch
from common.machine import setup
if sys.argv[1] == "setup":
    setup("cpu", "float32")

def faults():  # the process's page faults while a 40 MB tensor is made, written and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(40 << 20, dtype=torch.uint8).fill_(1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

rounds = [faults() for _ in range(48)]
print(sum(rounds[24:]))  # the second half: once the heap has grown to hold the block
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_cpu_run_keeps_the_memory_it_frees_for_the_next_request_instead_of_faulting_in_new_pages():
    """After setup() on a CPU, a 40 MB block freed and asked for again (larger than any threshold glibc picks by
    itself) comes from memory the process kept once the heap has grown to hold it: over the last 24 of 48 rounds,
    under a quarter of the page faults of a process without it, which maps every such block afresh (a page fault per
    4 KB page touched: 24 x 10,240 here). The heap's growth takes 2 to 12 rounds, by what else landed in its holes
    (seen here under load), so the first half is not counted."""
    def faults(mode: str) -> int:
        return int(subprocess.run([sys.executable, "-c", PAGE_FAULTS, mode], cwd=ROOT, capture_output=True,
                                  text=True, check=True).stdout)

    assert machine.keep_freed_memory()
    plain, kept = faults("plain"), faults("setup")
    assert plain > 0 and kept * 4 < plain


def test_a_log_file_gets_a_line_per_log_interval_and_mfu_never_passes_100(corpus, tmp_path, monkeypatch):
    """A line per log interval naming the peak FLOP/s its MFU divides by, MFU capped at 100%, and one note before the
    first step saying that peak is an estimate measured at the start (on a shared machine it moves with the load)."""
    import re
    import sys
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)  # output to a file, not a terminal
    monkeypatch.setattr(device, "measure_peak_flops", lambda *args: 1.0)  # a peak measured far too low
    messages = []
    cfg, _, explicit = load_config(["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "c"),
                                    "--out_dir", str(tmp_path / "run"), "--max_iters", "20", "--log_interval", "5",
                                    "--eval_interval", "10"], False)
    train.train(cfg, explicit, say=messages.append)
    pattern = r"step (\d+)/20: loss \d+\.\d{4}, [\d.]+ ms/step, [\d,]+ tokens/s, mfu ([\d.]+)% of 1e-12 TFLOP/s"
    assert sum("mfu below: the model's FLOPs per second over 1e-12 TFLOP/s, the peak this device measured just now "
               "(an estimate" in m for m in messages) == 1  # the basis, said once
    steps = [re.fullmatch(pattern, m) for m in messages if re.fullmatch(pattern, m)]
    assert [int(m.group(1)) for m in steps] == [5, 10, 15, 20]
    assert all(float(m.group(2)) == 100.0 for m in steps)  # capped: the ratio can never pass 1
    evaluations = [m for m in messages if ": evaluation: train loss " in m]
    assert [m.split(":")[0] for m in evaluations] == ["step 0", "step 10", "step 20"]
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert max(e.value for e in events.Scalars("perf/mfu")) == 100.0  # a percentage, as on the console


def test_the_peak_never_times_a_shapes_first_product(monkeypatch):
    """The peak FLOP/s the MFU divides by never times a shape's first product, which on a GPU carries the library's
    set-up: with the first product made a second slower, the peak is still this machine's rate, not one product a
    second."""
    cpu = torch.device("cpu")
    rate = device.measure_peak_flops(cpu, torch.float32)
    products, matmul = [], torch.Tensor.__matmul__

    def slow_first(a, b):  # a device that sets itself up at its first product
        if not products:
            time.sleep(1.0)
        products.append(a.shape)
        return matmul(a, b)
    monkeypatch.setattr(torch.Tensor, "__matmul__", slow_first)
    assert device.measure_peak_flops(cpu, torch.float32) > rate / 8
    assert len(products) >= 2  # the warm-up, then at least one timed


def test_max_autotune_keeps_torchs_asides_off_the_screen(monkeypatch):
    """A max-autotune mode hides what torch says to itself: the TypedStorage warning torch's autotuner raises is not
    shown where a torch module raises it, but still is where a user's code does; inductor's tables of kernel timings
    are turned off, unless an environment variable of torch's asks for them."""
    import warnings
    from torch._inductor import config
    from torch.storage import _reset_warn_typed_storage_removal
    for name in device.AUTOTUNE_TABLES:
        monkeypatch.setattr(config, name, getattr(config, name))  # put back after the test
    displayed, stats = device.AUTOTUNE_TABLES.values()
    monkeypatch.delenv(displayed[0], raising=False)
    monkeypatch.setenv(stats[0], "1")  # asked for: kept
    report = config.max_autotune_report_choices_stats

    def storage_called_from(module: str) -> list[str]:
        _reset_warn_typed_storage_removal()  # torch warns once a process
        with warnings.catch_warnings(record=True) as caught:
            exec(compile("torch.zeros(2).storage()", f"{module}.py", "exec"), {"__name__": module, "torch": torch})
        return [str(w.message).split(".")[0] for w in caught]
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert storage_called_from("torch._inductor.select_algorithm") == ["TypedStorage is deprecated"]
        device.quiet_autotuning()
        assert storage_called_from("torch._inductor.select_algorithm") == []
        assert storage_called_from("my_tool") == ["TypedStorage is deprecated"]
    assert config.autotune_num_choices_displayed == 0
    assert config.max_autotune_report_choices_stats == report


@pytest.mark.parametrize("argv, preset, n_layer, max_iters", [
    ([], "shakespeare_char_cpu", 2, 300),  # no CUDA here: the CPU preset is what would run
    (["--config", "shakespeare_char_cpu_long"], "shakespeare_char_cpu_long", 5, 2000),
])
def test_help_shows_the_values_this_command_would_use(argv, preset, n_layer, max_iters, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        train.main(argv + ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"preset {preset}" in text
    assert f"number of transformer blocks (0: none, a bigram model); here {n_layer}, from {preset} (default: 6)" in text
    assert f"optimizer steps to train for; here {max_iters}, from {preset} (default: 5000)" in text


def test_every_evaluation_and_the_full_validation_report_progress(corpus, tmp_path, monkeypatch):
    from training.report import Log, PlainProgress
    tasks = []

    class Recorder(PlainProgress):
        def __init__(self, say, what, total):
            super().__init__(say, what, total, every=0.0)  # a line at every batch
            tasks.append(self)
    monkeypatch.setattr(Log, "task", lambda self, what, total: Recorder(self.say, what, total))
    messages = []
    result = train.train(*load_config(["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "c"),
                                       "--out_dir", str(tmp_path / "r"), "--max_iters", "10", "--eval_interval", "10",
                                       "--eval_iters", "3"], False)[::2], say=messages.append)
    n_val = checkpoint.load(tmp_path / "r" / "ckpt_last.safetensors")["data"]["n_val"]
    windows = -(-len(range(0, n_val - 32, 32)) // 8)  # non-overlapping windows of block 32, in batches of 8
    assert result["iterations"] == 10
    assert [(t.what, t.total, t.done) for t in tasks] == [("evaluating at step 0", 6, 6),
                                                          ("evaluating at step 10", 6, 6),
                                                          ("full validation of step 10's model", windows, windows)]
    assert any(m.startswith("full validation of step 10's model: 1/") and m.endswith("min left") for m in messages)


def test_where_the_validation_split_fits_in_an_estimate_it_is_measured_exactly(corpus, tmp_path):
    """A validation split whose windows all fit in eval_iters batches is read whole at every evaluation, in fewer
    batches than the estimate: the best evaluation's figure is then exactly the full validation of the model handed
    over, and choosing the best model compares exact figures."""
    cfg, _, explicit = load_config(debug_argv(corpus, tmp_path, "run", "--max_iters", "8", "--eval_interval", "4",
                                              "--eval_iters", "200"), False)
    batches = train_batches(cfg)
    assert batches.val_fits(cfg.eval_iters) and batches.num_val_batches() < cfg.eval_iters
    summary = train.train(cfg, explicit, say=lambda m: None)
    assert summary["best_val_loss"] == summary["full_val_loss"]
    assert not train_batches(cfg).val_fits(batches.num_val_batches() - 1)


@pytest.mark.slow
def test_a_small_text_that_overfits_is_warned_once_with_what_to_try(tmp_path):
    """4,000 characters whose validation part (the last 10%) holds other lines than the training part: a 96-wide model
    learns the training lines by heart within 300 steps. The run says so once, at the first evaluation where the
    validation loss has risen over the last three while the training loss fell, and names what to try; a run whose
    two losses fall together is never warned."""
    from conftest import play_text
    from training.evaluation import overfitting
    corpus = tmp_path / "small.txt"
    corpus.write_text(play_text(3600, seed=0) + play_text(400, seed=1), encoding="utf-8")
    said = []
    cfg, _, explicit = load_config(["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "c"),
                                    "--out_dir", str(tmp_path / "run"), "--max_iters", "350", "--eval_interval", "25",
                                    "--n_embd", "96", "--n_head", "4", "--learning_rate", "5e-3", "--min_lr", "5e-3",
                                    "--patience", "0", "--full_val", "false"], False)
    train.train(cfg, explicit, say=said.append)
    evaluations = checkpoint.load(tmp_path / "run" / "ckpt_last.safetensors")["losses"]["eval"]
    first = next(n for n in range(len(evaluations) + 1) if overfitting(evaluations[:n]))
    assert first < len(evaluations)  # it went on overfitting after the warning: still said once
    warnings = [m for m in said if m.startswith("warning: the model is learning the training text by heart")]
    assert len(warnings) == 1, warnings
    (a, train_a, val_a), (b, train_b, val_b) = evaluations[first - 3], evaluations[first - 1]
    assert warnings == [
        f"warning: the model is learning the training text by heart: from step {a} to step {b} the validation loss "
        f"rose from {val_a:.3f} to {val_b:.3f}. Try a smaller model, --dropout 0.2, fewer steps, or more text "
        f"(docs/training.md, \"Small texts\")"]
    assert val_b > val_a and train_b < train_a  # the line's "rose" and "fell" are true of its figures
    falling = [(step, 3.0 - step / 100, 3.1 - step / 120) for step in range(0, 300, 25)]
    assert not any(overfitting(falling[:n]) for n in range(len(falling) + 1))


def test_a_longer_max_iters_on_resume_says_the_schedule_is_stretched_and_how_to_keep_it(corpus, tmp_path):
    """Resuming a finished run with a larger max_iters moves its cosine decay (which follows max_iters): the note
    gives the rate at the resumed step before and after (get_lr's own values) and the flag that keeps the old decay,
    with which the run goes on at min_lr; the same max_iters says nothing."""
    run(corpus, tmp_path / "r", "--max_iters", "20")
    old, _, _ = load_config(["--config", "debug", "--max_iters", "20"], False)
    new, _, _ = load_config(["--config", "debug", "--max_iters", "40"], False)
    said = []
    run(corpus, tmp_path / "r", "--resume", "--max_iters", "40", say=said.append)
    note = next(line for line in said if "schedule is stretched" in line)
    assert (f"stretched from 20 to 40 steps: at step 20 the rate goes from {get_lr(20, old):.3g} to "
            f"{get_lr(20, new):.3g}" in note and note.endswith("add --lr_decay_iters 20"))
    said = []
    run(corpus, tmp_path / "r", "--resume", "--max_iters", "50", "--lr_decay_iters", "20", say=said.append)
    assert not [line for line in said if "schedule" in line]


def test_resume_under_another_number_of_processes_keeps_the_tokens_per_step_or_refuses():
    """A run of 2 processes x 2 accumulation steps resumed by 1 process takes 4 accumulation steps (the same tokens
    per step, said in one line); by 3 processes it cannot share 4 micro-batches, and refuses in one line naming the
    fix; a --grad_accum_steps given now is the user's choice and is kept."""
    cfg, _, _ = load_config(["--config", "debug", "--grad_accum_steps", "2"], False)
    state = {"tokens_per_iter": cfg.batch_size * cfg.block_size * 2 * 2}
    said = []
    kept = keep_global_batch(cfg, set(), state, 1, said.append)
    assert kept.grad_accum_steps == 4 and kept.batch_size * kept.block_size * 4 == state["tokens_per_iter"]
    assert said == [f"resume: 1 process now, so grad_accum_steps 2 -> 4, keeping "
                    f"{state['tokens_per_iter']:,} tokens per step"]
    with pytest.raises(UserError, match="^--resume: 3 processes cannot share 4 micro-batches evenly; use a process "
                                        "count that divides 4, or give --grad_accum_steps$"):
        keep_global_batch(cfg, set(), state, 3, said.append)
    assert keep_global_batch(cfg, {"grad_accum_steps"}, state, 1, said.append) is cfg
    assert keep_global_batch(cfg, set(), {}, 1, said.append) is cfg  # a checkpoint that does not record it
