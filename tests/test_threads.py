"""A run on a busy machine: the thread count measured (from timings handed in, never the clock's), said, recorded in
the run and kept on resume; --num_threads repeating a run to the last digit; the estimate from steps timed at that
count; the watch on steps that slow down; the scripts' own thread counts; the newest run that is not training."""
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

import evaluate as evaluate_cli
import sample as sample_cli
import train
from common import machine, run_folder
from common.machine import Threads, choose_threads, measure_threads, thread_counts
from common.run_folder import RunDir
from configs import load_config
from data import prepare, resolve
from errors import run_cli
from training import checkpoint, device, opening
from training.checkpoint import Progress
from training.device import SlowdownWatch
from training.evaluation import evaluations_left
from training.opening import ProbeStep, build_run, expected_seconds, say_estimate
from training.report import Log, stopped_line


def by_threads(table: dict[int, float], calls: list[int] | None = None):
    """A stand-in for timed work: the seconds table gives for the thread count set now (each call's count recorded
    in calls)."""
    def time_once(*args) -> float:
        if calls is not None:
            calls.append(torch.get_num_threads())
        return table[torch.get_num_threads()]
    return time_once


def test_the_counts_tried_halve_from_every_core_down_to_one():
    assert thread_counts(1) == [1] and thread_counts(2) == [2, 1] and thread_counts(6) == [6, 3, 1]
    assert thread_counts(8) == [8, 4, 2, 1] and thread_counts(12) == [12, 6, 3, 1]


@pytest.mark.parametrize("table, chosen, timed, order", [
    # a busy machine: two threads' first call far slower than one thread's: never timed again
    ({2: 0.50, 1: 0.10}, 1, {2: 1, 1: 3}, [1, 1, 2, 1, 1]),
    # a quiet one: two threads faster, by less: both timed every round, in turn
    ({2: 0.05, 1: 0.07}, 2, {2: 3, 1: 3}, [1, 1, 2, 2, 1, 2, 1, 2]),
    # no difference: the fewer threads, which leave the machine more room
    ({2: 0.10, 1: 0.10}, 1, {2: 3, 1: 3}, [1, 1, 2, 2, 1, 2, 1, 2]),
])
def test_the_faster_count_is_chosen_and_set(monkeypatch, table, chosen, timed, order):
    """The decision from the timings alone (handed in: no clock is read): a warm-up at one thread, one counted call
    there, each other count's first (cold) call not counted unless it is far slower, then rounds in turn; the count
    with the lowest median is set."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    calls = []
    threads = choose_threads(0, by_threads(table, calls))
    assert threads.count == chosen == torch.get_num_threads() and threads.why == "measured"
    assert {n: len(seconds) for n, seconds in threads.seconds.items()} == timed and calls == order
    assert threads.steady == [table[chosen]] * timed[chosen]


def test_a_cold_first_call_does_not_drop_a_count_that_is_faster_warm():
    """Two threads' first call pays for starting them (here twice one thread's time): it is not counted, and two
    threads, faster once warm, are chosen; a first call beyond FAR_SLOWER is."""
    calls = iter([0.05, 0.05, 0.10, 0.04, 0.05, 0.04, 0.05, 0.04])  # warm-up, one thread, two cold, then in turn
    seconds = measure_threads(lambda: next(calls), [2, 1])
    assert seconds == {2: [0.04, 0.04, 0.04], 1: [0.05, 0.05, 0.05]} and machine.fastest(seconds) == 2
    calls = iter([0.05, 0.05, 0.16, 0.05, 0.05])
    assert measure_threads(lambda: next(calls), [2, 1]) == {2: [0.16], 1: [0.05, 0.05, 0.05]}


def test_slow_work_stops_the_rounds_at_the_budget_once_the_leader_has_two_timings():
    seconds = measure_threads(by_threads({4: 2.9, 2: 2.5, 1: 2.0}), [4, 2, 1], rounds=3, budget=4.0)
    assert {n: len(times) for n, times in seconds.items()} == {4: 1, 2: 1, 1: 2}


def test_a_given_count_is_never_measured_against_another(monkeypatch):
    """--num_threads N, OMP_NUM_THREADS and a one-core process: that count, set, and timed only when asked (for an
    estimate)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    calls = []
    time_once = by_threads({1: 0.1, 2: 0.2, 3: 0.3}, calls)
    threads = choose_threads(2, time_once)
    assert (threads.count, threads.why, threads.seconds, calls) == (2, "asked", {}, [])
    assert torch.get_num_threads() == 2 and threads.line("a step") == "threads: 2 (--num_threads 2)"
    threads = choose_threads(3, time_once, timed=True)  # more threads than cores: kept, and the line says what it costs
    assert set(calls) == {3} and threads.seconds == {3: [0.3] * 3} and threads.line("a step") == (
        "threads: 3 (--num_threads 3); a step: 300 ms; more than the 2 cores this process may use: 2 or fewer is "
        "faster (--num_threads 0 measures)")
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert choose_threads(0, time_once).why == "OMP_NUM_THREADS" and torch.get_num_threads() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(machine, "cores", lambda: 1)
    assert choose_threads(0, time_once).why == "one core" and len(calls) == 4


def test_more_threads_than_cores_are_kept_and_the_line_says_what_to_change(monkeypatch):
    """The threads line's note on a count above the cores names the fix for where the count came from (OMP_NUM_THREADS
    is read again by --num_threads 0), and counts one core in the singular."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    assert Threads(3, "OMP_NUM_THREADS", {}).line("a step") == (
        "threads: 3 (OMP_NUM_THREADS); more than the 2 cores this process may use: 2 or fewer is faster (unset "
        "OMP_NUM_THREADS, or give --num_threads N)")
    monkeypatch.setattr(machine, "cores", lambda: 1)
    assert Threads(2, "kept", {}).line("a step").endswith(
        "--num_threads 0 measures again); more than the 1 core this process may use: 1 or fewer is faster")
    assert "more than" not in Threads(1, "asked", {}).line("a step")


def debug_argv(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["--config", "debug", "--data", str(corpus), "--cache_dir", str(out.parent / "cache"), "--out_dir",
            str(out), *extra]


def train_quietly(argv: list[str], said: list | None = None) -> dict:
    cfg, _, explicit = load_config(argv, False)
    return train.train(cfg, explicit, say=(said.append if said is not None else lambda message: None))


def test_a_run_measures_its_threads_says_them_records_them_and_keeps_them_on_resume(corpus, tmp_path, monkeypatch):
    """With steps that (by the timings handed in) run faster on one thread than on two, a run of the debug preset
    with --num_threads 0 trains on one: it says so and why, records 1 in its checkpoints and summary, and trains to
    the last digit as --num_threads 1 does. Its resume measures nothing: it times steps at the count it kept."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    calls = []
    monkeypatch.setattr(ProbeStep, "__call__", by_threads({2: 0.2, 1: 0.05}, calls))
    said = []
    measured = train_quietly(debug_argv(corpus, tmp_path / "measured", "--num_threads", "0", "--max_iters", "10"),
                             said)
    assert "threads: 1 of 2 cores, the faster just now (a step: 200 ms with 2; 50 ms with 1); --num_threads N sets " \
           "the count" in said
    assert checkpoint.load(tmp_path / "measured" / "ckpt_last.safetensors")["run_config"]["num_threads"] == 1
    assert json.loads((tmp_path / "measured" / "summary.json").read_text())["threads"] == 1 == measured["threads"]
    assert 2 in calls

    fixed = train_quietly(debug_argv(corpus, tmp_path / "fixed", "--num_threads", "1", "--max_iters", "10"))
    assert measured["history"] == fixed["history"] and measured["full_val_loss"] == fixed["full_val_loss"]

    calls.clear()
    said.clear()
    torch.set_num_threads(2)  # a new process would start with every core
    resumed = train_quietly(["--out_dir", str(tmp_path / "measured"), "--resume", "--max_iters", "20"], said)
    assert set(calls) == {1} and resumed["threads"] == 1, said
    assert "threads: 1 (this run's own, kept on resume; --num_threads 0 measures again); a step: 50 ms" in said

    said.clear()
    train_quietly(["--out_dir", str(tmp_path / "measured"), "--resume", "--max_iters", "25", "--num_threads", "0"],
                  said)
    assert "resume: the thread count is measured again (--num_threads 0; this run had 1)" in said, said
    assert not [line for line in said if "num_threads changed" in line]


@pytest.mark.slow
def test_a_given_thread_count_repeats_a_run_to_the_last_digit(corpus, tmp_path):
    """--num_threads 2, twice: the same losses at every step and the same full validation, exactly (one and two
    threads may differ in the last digits: that is why the count is recorded and kept)."""
    first, second = (train_quietly(debug_argv(corpus, tmp_path / name, "--num_threads", "2", "--max_iters", "15"))
                     for name in ("first", "second"))
    assert first["history"] == second["history"] and first["full_val_loss"] == second["full_val_loss"]
    assert first["threads"] == 2


def test_timing_steps_samples_and_pictures_changes_nothing_in_the_run_and_a_long_run_says_so_first(
        corpus, tmp_path, monkeypatch):
    """The probe steps run on a copy of the model with an optimizer of its own, in eval mode, and the sample and
    picture timed for the estimate draw from generators of their own: a run whose probes and timings really ran (with
    dropout, so a drawn mask would show) trains to the same digits, and logs the same samples and the same pictures
    (laid out before step 0 instead of at its evaluation), as one whose probe did no work and that timed nothing; a
    run expected to pass SLOW_RUN_SECONDS says so before step 0, with the flags that shorten it."""
    from training.session import Session

    common = ["--max_iters", "20", "--log_interval", "1", "--dropout", "0.1", "--eval_interval", "10",
              "--sample_chars", "30", "--log_attention", "true"]
    logged = []
    monkeypatch.setattr(Log, "sample", lambda self, it, text: logged.append((it, text)))
    monkeypatch.setattr(Log, "attention",
                        lambda self, it, layer, picture: logged.append((it, layer, picture.tobytes())))
    with monkeypatch.context() as patch:
        patch.setattr(ProbeStep, "__call__", lambda self: 0.01)  # no model work
        patch.setattr(Session, "record_seconds", lambda self: 0.0)
        quiet = train_quietly(debug_argv(corpus, tmp_path / "a", *common))
    quiet_logged, logged[:] = logged[:], []
    monkeypatch.setattr(opening, "SLOW_RUN_SECONDS", 0.0)  # every run counts as long
    said, timed, record_seconds = [], [], Session.record_seconds
    monkeypatch.setattr(Session, "record_seconds", lambda self: timed.append(record_seconds(self)) or timed[-1])
    probed = train_quietly(debug_argv(corpus, tmp_path / "b", *common), said)
    notes = [m for m in said if m.startswith("note: on this CPU this run would take about")]
    assert len(notes) == 1 and "(20 steps x " in notes[0] and "--config shakespeare_char_cpu" in notes[0]
    assert len(timed) == 1 and timed[0] > 0  # the sample and a picture were timed for real, once
    assert said.index(notes[0]) < next(i for i, m in enumerate(said) if ": evaluation: " in m)  # before step 0
    assert probed["history"] == quiet["history"] and probed["full_val_loss"] == quiet["full_val_loss"]
    assert logged == quiet_logged and len(logged) == 3 * (1 + 2)  # at steps 0, 10 and 20: a sample, 2 layers


def built_run(corpus: Path, tmp_path: Path, *extra: str):
    cfg = load_config(debug_argv(corpus, tmp_path / "run", *extra), False)[0]
    prepared = prepare(resolve(str(corpus), tmp_path / "c"), tmp_path / "c", say=lambda m: None)
    return build_run(cfg, machine.setup("cpu", "float32"), prepared, say=lambda m: None)


def test_the_estimate_is_the_steps_left_at_the_steps_timed(corpus, tmp_path):
    """From the seconds of a step: the steps left, the evaluations left (a forward pass of a batch, a third of a
    step, per batch read), each evaluation's sample and pictures at the seconds timed for them, and the full
    validation; a resumed run counts the steps it has left, at the same speed (its earlier sessions' speed, measured
    on another day's machine, is not the figure)."""
    run, progress = built_run(corpus, tmp_path, "--max_iters", "100", "--eval_interval", "25")
    forward = 0.5 / 3
    val_batches = run.batches.num_val_batches()
    per_evaluation = run.cfg.eval_iters + min(run.cfg.eval_iters, val_batches)
    found = expected_seconds(run, progress, 0.5, 0.2)
    assert found.steps == 100 * 0.5 and found.evaluations == pytest.approx(5 * per_evaluation * forward)
    assert found.samples_and_pictures == pytest.approx(5 * 0.2)
    assert found.full_validation == pytest.approx(val_batches * forward)
    progress.it, progress.train_seconds = 80, 400.0  # 5 s a step in the sessions before: not the figure
    resumed = expected_seconds(run, progress, 0.5, 0.2)
    assert resumed.steps == 20 * 0.5 and evaluations_left(80, run.cfg) == 1
    assert resumed.evaluations == pytest.approx(per_evaluation * forward)
    assert resumed.samples_and_pictures == pytest.approx(0.2)


def whole_seconds(run, step: float, so_far: float, records: float = 0.0) -> float:
    """The whole command's seconds at `step` seconds a step, counted here: the steps, an evaluation at step 0 and
    every eval_interval (eval_iters batches of each split; the validation split read whole where it is no longer),
    each with its sample and pictures (records seconds), and the full validation, each batch read a third of a step."""
    cfg, val_batches = run.cfg, run.batches.num_val_batches()
    evaluations = len(range(0, cfg.max_iters + 1, cfg.eval_interval))
    batches_read = evaluations * (cfg.eval_iters + min(cfg.eval_iters, val_batches)) + val_batches
    return so_far + step * (cfg.max_iters + batches_read / 3) + evaluations * records


def estimate_said(corpus, tmp_path, preset: str, steady: list[float], threads: tuple[int, str] = (1, "asked"),
                  records: float = 0.0) -> tuple[object, list[str]]:
    run, progress = built_run(corpus, tmp_path, "--max_iters", "20", "--eval_interval", "10")
    run.cfg.config_name = preset  # as --config would set it
    run.threads = machine.Threads(*threads, {threads[0]: steady})
    run.phases.so_far = lambda: 2.0
    messages = []
    say_estimate(run, progress, Log(tmp_path, say=messages.append), records)
    return run, messages


def test_the_estimate_is_a_range_from_the_steps_timed_and_is_kept_for_the_last_line(corpus, tmp_path):
    """The whole command's time: what has passed plus the rest at the fastest and at the slowest step timed (here
    400 and 600 ms), the parts at the median step; the range is said again, beside the real time, at the end."""
    run, messages = estimate_said(corpus, tmp_path, "debug", [0.4, 0.5, 0.6])
    low, high = whole_seconds(run, 0.4, 2.0), whole_seconds(run, 0.6, 2.0)
    assert run.phases.expected == (pytest.approx(low), pytest.approx(high))
    middle = expected_seconds(run, Progress(), 0.5, 0.0)
    assert messages == [f"this run: about {low:.0f}-{high:.0f} s in all (20 steps x 400-600 ms, evaluations "
                        f"{middle.evaluations:.0f} s, the final full validation {middle.full_validation:.0f} s)"]
    assert f"(estimated before the first step: {low:.0f}-{high:.0f} s)" in run.phases.line(run.phases.report())


def test_the_estimate_counts_each_evaluations_sample_and_pictures(corpus, tmp_path):
    """The sample and attention pictures each evaluation makes (here 3 s each, at steps 0, 10 and 20, as
    Session.record_seconds timed them) are part of the whole and said (not where they would be said as "0 s"); where
    they are a long run's largest part, its note names the flags that cut them first."""
    run, messages = estimate_said(corpus, tmp_path, "debug", [0.4, 0.5, 0.6], records=3.0)
    low, high = whole_seconds(run, 0.4, 2.0, 3.0), whole_seconds(run, 0.6, 2.0, 3.0)
    assert run.phases.expected == (pytest.approx(low), pytest.approx(high))
    middle = expected_seconds(run, Progress(), 0.5, 3.0)
    assert messages == [f"this run: about {low:.0f}-{high:.0f} s in all (20 steps x 400-600 ms, evaluations "
                        f"{middle.evaluations:.0f} s, their samples and pictures 9 s, the final full validation "
                        f"{middle.full_validation:.0f} s)"]
    _, long = estimate_said(corpus, tmp_path, "shakespeare_char_cpu", [30.0], records=1000.0)
    assert ", their samples and pictures 50 min, the final full validation " in long[0]
    assert long[0].endswith("; for a shorter one: a lower --sample_chars or --log_attention false; or a lower "
                            "--max_iters")
    _, brief = estimate_said(corpus, tmp_path, "debug", [0.4, 0.5, 0.6], records=0.01)  # 0.03 s: said as "0 s"
    assert "samples and pictures" not in brief[0] and brief[0].startswith("this run: about ")


def test_a_sample_is_timed_on_a_few_characters_and_a_picture_once_laid_out(corpus, tmp_path, monkeypatch):
    """Session.record_seconds: a sample of --sample_chars characters is timed on SAMPLE_TIMED_CHARS of them and
    counted at that cost for every one (a stand-in sample here takes 5 ms a character); the pictures are laid out
    there, once, for the evaluations to reuse, and one layer's picture, drawn and encoded, counts for each layer."""
    from common import pictures
    from training import session

    run, progress = built_run(corpus, tmp_path, "--sample_chars", "400", "--log_attention", "false")
    timed = session.Session(run, progress, RunDir(tmp_path / "run"), Log(tmp_path / "run", say=print),
                            session.StopRequest(speak=False), device.Dist())
    drawn = []
    monkeypatch.setattr(session.Session, "sample", lambda self, chars: drawn.append(chars) or time.sleep(chars / 200))
    assert 400 / 200 <= timed.record_seconds() < 3 * 400 / 200 and drawn == [session.SAMPLE_TIMED_CHARS]

    run.cfg.sample_chars, run.cfg.log_attention = 0, True
    laid_out = []
    lay_out = pictures.AttentionPictures.lay_out
    monkeypatch.setattr(pictures.AttentionPictures, "lay_out",
                        lambda self, weights, layer: laid_out.append(weights.shape) or lay_out(self, weights, layer))
    monkeypatch.setattr(Log, "picture_seconds", lambda self, picture: 0.5)  # TensorBoard's encoding of each picture
    seconds = timed.record_seconds()
    assert 2 * 0.5 < seconds < 2 * 0.5 + 1.0 and laid_out == [(2, 32, 32)]  # 2 layers; 2 heads of the 32 characters
    timed.record({"train": 4.0, "val": 4.0})  # step 0's evaluation draws on that layout
    assert laid_out == [(2, 32, 32)]


def test_a_long_run_says_so_as_a_note_with_the_flags_that_shorten_it(corpus, tmp_path):
    run, messages = estimate_said(corpus, tmp_path, "shakespeare_char_gpu", [30.0, 31.0, 36.0])
    low, high = whole_seconds(run, 30.0, 2.0) / 60, whole_seconds(run, 36.0, 2.0) / 60
    assert len(messages) == 1 and messages[0].startswith(
        f"note: shakespeare_char_gpu is made for a GPU; on this CPU this run would take about {low:.0f}-{high:.0f} "
        f"min (20 steps x 30-36 s, evaluations ")
    assert messages[0].endswith("; for a shorter one: --config shakespeare_char_cpu; or a lower --max_iters; or a "
                                "lower --eval_iters or a larger --eval_interval")


@pytest.mark.parametrize("threads, named", [((2, "kept"), True), ((2, "asked"), True), ((2, "measured"), False),
                                            ((1, "kept"), False)])
def test_a_long_run_on_threads_it_did_not_measure_names_measuring_first(corpus, tmp_path, threads, named):
    """Several threads given (or kept on resume), not measured: on a busy machine one thread can be many times
    faster, so the note's first fix is --num_threads 0; a measured count, or one thread, has nothing to gain."""
    _, messages = estimate_said(corpus, tmp_path, "shakespeare_char_cpu", [30.0], threads)
    assert ("; for a shorter one: --num_threads 0, which measures the faster thread count; or " in messages[0]) == named


def test_a_large_model_is_timed_on_part_of_a_batch_and_its_time_scaled_to_the_step(corpus, tmp_path, monkeypatch):
    """A micro-batch over PROBE_FLOPS (the GPU recipe on a CPU: a minute a step) is timed on as many windows as
    PROBE_FLOPS allows (at least one), not the batch, and the time scaled by the windows of a step (here 8 a
    micro-batch, 3 micro-batches); the threads line says its times are scaled."""
    run, _ = built_run(corpus, tmp_path, "--grad_accum_steps", "3")
    assert ProbeStep(run, train.update).rows == 8
    monkeypatch.setattr(opening, "PROBE_FLOPS", 0.0)
    probe = ProbeStep(run, train.update)
    clock = iter([10.0, 10.5])  # the call's start and end: half a second for the one window
    monkeypatch.setattr(opening.time, "perf_counter", lambda: next(clock))
    assert probe.rows == 1 and probe() == 0.5 * 8 * 3
    # as many sequences as PROBE_FLOPS allows: a CPU runs a batch faster per sequence than one sequence alone
    monkeypatch.setattr(opening, "PROBE_FLOPS", 3.5 * run.flops_per_token * run.cfg.block_size)
    assert ProbeStep(run, train.update).rows == 3
    monkeypatch.setattr(opening, "PROBE_FLOPS", 0.0)
    # what the run then says of its timings names them as scaled, not as timed
    assert opening.step_timed(run) == ", scaled from 1 of its 24 sequences"  # 8 a micro-batch, 3 micro-batches
    run.threads = machine.Threads(2, "asked", {2: [12.0, 13.0]})
    said = []
    opening.say_what_runs(run, RunDir(tmp_path / "r"), Log(tmp_path, say=said.append), device.Dist())
    assert "threads: 2 (--num_threads 2); a step, scaled from 1 of its 24 sequences: 12-13 s" in said


def test_steps_that_slow_down_several_fold_are_said_once_with_the_flag():
    """Against 100 ms timed before the first step (a limit of 300 ms): a single slow log line is no news; two in a
    row are, once. The log lines come every 10 steps; as in train.py's StepLog, only a slow one calls seen()."""
    def log_lines(watch, step_times):
        notes = []
        for line, seconds in enumerate(step_times, 1):
            if seconds > watch.limit:
                notes.append(watch.seen(10 * (line - 1), 10 * line, seconds))
        return notes

    watch = SlowdownWatch(0.1, 2, "python train.py --out_dir out/x --resume")
    assert watch.limit == pytest.approx(0.3)
    notes = log_lines(watch, (0.35, 0.2, 0.4, 0.5, 0.9, 0.9))
    assert notes[:2] == [None, None] and notes[3:] == [None, None]
    assert notes[2] == ("note: steps now take 500 ms, 5.0x the 100 ms timed before the first step: other work is "
                        "likely using the CPU; fewer threads may go faster: Ctrl-C (it saves), then python train.py "
                        "--out_dir out/x --resume --num_threads 1")
    assert watch.advice == "--num_threads 1"  # for the run's stopped line: the resume command with the flag
    assert stopped_line(300, Path("out/x"), False, watch.advice).endswith(
        "Continue with: python train.py --out_dir out/x --resume --num_threads 1")
    alone = SlowdownWatch(0.1, 1, "")
    assert log_lines(alone, (1.0, 1.0))[1].endswith(
        "; this run uses one thread already") and alone.advice == ""
    # steps 25x slower: one log interval of 10 steps lasts 25 s, past SLOW_FOR: said at that first line
    sudden = SlowdownWatch(0.1, 4, "python train.py --out_dir out/y --resume")
    assert log_lines(sudden, (0.1, 2.5))[0].endswith("--resume --num_threads 2") and sudden.advice == "--num_threads 2"


def test_a_run_whose_steps_slow_down_says_so_once(corpus, tmp_path, monkeypatch):
    """Steps timed at almost nothing before the first step: every real step is several-fold slower, so the note
    comes once, at the second log line, naming the run's resume command with fewer threads."""
    monkeypatch.setattr(ProbeStep, "__call__", lambda self: 1e-7)
    said = []
    train_quietly(debug_argv(corpus, tmp_path / "run", "--num_threads", "2", "--max_iters", "6", "--log_interval",
                             "1"), said)
    notes = [m for m in said if m.startswith("note: steps now take")]
    assert len(notes) == 1 and notes[0].endswith(f"--out_dir {tmp_path / 'run'} --resume --num_threads 1")


def test_evaluate_and_sample_measure_their_threads_on_their_own_work(corpus, tmp_path, monkeypatch, capsys):
    """Each script times its own work (a batch scored, a few characters drawn) at each count and says which it
    chose; --num_threads N times nothing; a count out of range is one line, exit 2."""
    train_quietly(debug_argv(corpus, tmp_path / "run", "--max_iters", "4"))
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    calls = []
    monkeypatch.setattr(evaluate_cli, "batch_seconds", by_threads({2: 0.3, 1: 0.1}, calls))
    monkeypatch.setattr(sample_cli, "decoding_seconds", by_threads({2: 0.02, 1: 0.03}, calls))
    folder = ["--out_dir", str(tmp_path / "run")]
    assert run_cli(evaluate_cli.main, [*folder, "--data", str(corpus)]) == 0
    assert "threads: 1 of 2 cores, the faster just now (a batch: 300 ms with 2; 100 ms with 1)" in \
        capsys.readouterr().err
    assert run_cli(sample_cli.main, [*folder, "--max_new_tokens", "5"]) == 0
    assert "threads: 2 of 2 cores, the faster just now (8 characters: 20 ms with 2; 30 ms with 1)" in \
        capsys.readouterr().err and torch.get_num_threads() == 2
    calls.clear()
    assert run_cli(sample_cli.main, [*folder, "--max_new_tokens", "5", "--num_threads", "1"]) == 0
    assert "threads: 1 (--num_threads 1)" in capsys.readouterr().err and calls == []
    assert run_cli(evaluate_cli.main, [*folder, "--data", str(corpus), "--num_threads", "-1"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: --num_threads -1: must be from 0 (the faster count, measured) to 1024"


def test_the_scripts_read_the_newest_run_that_no_process_trains_in_and_say_which(corpus, tmp_path, monkeypatch,
                                                                                  capsys):
    """The README's sample command after a run: the newest finished or stopped run in out/, said with why; a newer
    run still training (its folder locked by its process) is passed over and named; with only such runs, one line."""
    train_quietly(debug_argv(corpus, tmp_path / "trained", "--max_iters", "4"))
    monkeypatch.chdir(tmp_path)
    for name in ("finished", "training"):
        shutil.copytree(tmp_path / "trained", tmp_path / "out" / name)
    os.utime(tmp_path / "out" / "finished" / "ckpt_best.safetensors", (1, 1))  # the older
    held = run_folder.RunDir(tmp_path / "out" / "training").claim(lambda m: None)
    try:
        said = []
        assert run_folder.find("", "", say=said.append) == Path("out") / "finished" / "ckpt_best.safetensors"
        assert said[0].startswith("no --out_dir given: out/finished, the newest run in out/ that has finished (saved ")
        assert f"; passed over out/training, which process {os.getpid()} (" in said[0]
        assert "is still training" in said[0]
        (tmp_path / "out" / "finished" / "summary.json").unlink()
        assert run_cli(sample_cli.main, ["--max_new_tokens", "5"]) == 0
        assert "out/finished, the newest run in out/ that has stopped" in capsys.readouterr().err
        shutil.rmtree(tmp_path / "out" / "finished")
        assert run_cli(sample_cli.main, ["--max_new_tokens", "5"]) == 2
        assert capsys.readouterr().err.startswith("error: the runs in out/ are all still training (out/training, "
                                                  "which process ")
    finally:
        held.release()
