"""The run folder's lifecycle through the command line: one owner, nothing destroyed early, a way forward from every
state, and Ctrl-C or SIGTERM at every stage."""
import contextlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
from conftest import ROOT, module_corpus, patient
from configs import load_config
from errors import run_cli
from training import checkpoint, evaluation, session


def argv(corpus, out_dir, *extra):
    return ["--config", "debug", "--data", str(corpus), "--cache_dir", str(corpus.parent / "cache"),
            "--out_dir", str(out_dir), *extra]


LAUNCHED = []


def launch(corpus, out_dir, *extra, **popen):
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *argv(corpus, out_dir, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    LAUNCHED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def no_process_outlives_its_test():
    yield
    while LAUNCHED:  # a test that failed midway must not leave a training running
        proc = LAUNCHED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def wait_for(condition, timeout=patient(60)):
    deadline = time.time() + patient(timeout)
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def snapshot(folder):
    """Every file of a run folder and its bytes (the owner's .lock record aside)."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def restored(folder):
    """snapshot(folder) once an --overwrite was undone, less the untrained replacement's files, which were moved
    into a folder of their own (undone_overwrite_<time>: a restore moves them aside, never deletes them): each a
    checkpoint at step 0 or its TensorBoard events."""
    kept = snapshot(folder)
    apart = {path for path in kept if path.parts[0].startswith("undone_overwrite_")}
    for path in apart:
        assert path.name.startswith("events.out.tfevents.") or checkpoint.load(folder / path)["iter"] == 0, path
    return {path: data for path, data in kept.items() if path not in apart}


def cli(capsys, *args):
    code = run_cli(train.main, list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return module_corpus(tmp_path_factory, "life")


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory):
    """A finished 20-step debug run, to copy (never to change)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    cfg, _, explicit = load_config(argv(corpus, out, "--max_iters", "20", "--eval_interval", "10"), False)
    train.train(cfg, explicit, say=lambda m: None)
    return out


def copy_of(finished, tmp_path):
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.slow
def test_a_second_process_is_refused_at_once_and_the_running_one_loses_nothing(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    proc = launch(corpus, out, "--max_iters", "100000", "--eval_interval", "1")  # a checkpoint write every step
    wait_for(lambda: (out / "ckpt_last.safetensors").exists())
    for extra in ([], ["--resume"], ["--overwrite"]):
        code, _, err = cli(capsys, *argv(corpus, out, *extra))
        assert code == 2 and f"is in use by process {proc.pid}" in err and err.count("\n") == 1, err
    assert proc.poll() is None  # still training
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=patient(60))
    assert proc.returncode == 130 and "Traceback" not in stderr and "could not write" not in stderr, stderr
    assert "stopping: " in stderr and "a step under way finishes first" in stderr  # (on a busy machine, at step 0)
    assert "stopped at step" in stdout
    assert checkpoint.load(out / "ckpt_last.safetensors")["iter"] > 0 and not list(out.glob("*.tmp-*"))


def test_overwrite_checks_everything_before_touching_the_old_run(corpus, finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    before = snapshot(out)
    (tmp_path / "short.txt").write_text("too short")
    for data in (tmp_path / "typo.txt", tmp_path / "short.txt"):
        code, _, err = cli(capsys, "--config", "debug", "--data", str(data), "--out_dir", str(out), "--overwrite",
                           "--cache_dir", str(tmp_path / "cache"))
        assert code == 2 and err.count("\n") == 1
        assert snapshot(out) == before


@pytest.mark.slow
@pytest.mark.parametrize("when", ["during its step-0 evaluation", "after its step-0 checkpoints"])
def test_a_killed_overwrite_puts_the_old_run_back(corpus, finished, tmp_path, capsys, when):
    out = copy_of(finished, tmp_path)
    before = snapshot(out)
    if when == "during its step-0 evaluation":
        proc = launch(corpus, out, "--overwrite", "--eval_iters", "1000000")  # its step-0 evaluation never ends
        wait_for(lambda: (out / ".replaced" / "ckpt_last.safetensors").is_file())  # the old run is set aside
    else:  # the new run has saved its untrained step 0 (best and last) and trains on towards a far evaluation
        proc = launch(corpus, out, "--overwrite", "--max_iters", "1000000", "--eval_interval", "100000")
        wait_for(lambda: (out / ".replaced" / "ckpt_last.safetensors").is_file() and (out / "ckpt_last.safetensors").is_file())
    proc.kill()
    proc.wait()
    import sample  # the scripts say where the old run waits and how it comes back
    assert run_cli(sample.main, ["--out_dir", str(out)]) == 2
    assert (f"error: {out}: an --overwrite stopped early, and the old run waits in {out / '.replaced'}; "
            f"python train.py --out_dir {out} --resume puts it back\n") == capsys.readouterr().err
    code, out_text, err = cli(capsys, "--out_dir", str(out), "--resume", "--cache_dir", str(corpus.parent / "cache"))
    assert code == 0 and "restored the old run in" in out_text + err
    assert "finished at step 20" in out_text
    assert restored(out) == before and not (out / ".replaced").exists()


@pytest.mark.slow
def test_a_stopped_overwrite_puts_the_old_run_back_until_its_first_evaluation_after_step_0(corpus, finished, tmp_path,
                                                                                             capsys):
    """Ctrl-C soon after an --overwrite started (a mistyped command undone) gives the old run back, even once the new
    run has saved its step 0; the old run is deleted only at the new run's first evaluation after step 0, and says
    so."""
    out = copy_of(finished, tmp_path)
    before = snapshot(out)
    proc = launch(corpus, out, "--overwrite", "--max_iters", "1000000", "--eval_interval", "100000")
    wait_for(lambda: (out / ".replaced" / "ckpt_last.safetensors").is_file() and (out / "ckpt_last.safetensors").is_file())
    proc.send_signal(signal.SIGINT)
    text, err = proc.communicate(timeout=patient(60))
    assert proc.returncode == 130
    assert "stopping: putting back the run that --overwrite is replacing" in err
    assert f"the run --overwrite was replacing is back in {out}, as it was; this run's files are kept apart in " \
        f"{out}/undone_overwrite_" in text
    assert restored(out) == before and not (out / ".replaced").exists()

    code, text, err = cli(capsys, *argv(corpus, out, "--overwrite", "--max_iters", "4", "--eval_interval", "2"))
    assert code == 0, err
    assert f"--overwrite: the replaced run is deleted now; step 2 is saved in {out}" in text + err
    assert checkpoint.load(out / "ckpt_last.safetensors")["iter"] == 4 and not (out / ".replaced").exists()


def test_a_stop_before_training_began_puts_an_overwrites_old_run_back_and_says_so(corpus, finished, tmp_path, capsys,
                                                                                     monkeypatch):
    """Ctrl-C after --overwrite set the old run aside but before the loop began: the old run is back in its folder at
    once, every byte as it was, and the stop's one line says so (the next command would otherwise have restored it
    unsaid)."""
    out = copy_of(finished, tmp_path)
    before = snapshot(out)

    def interrupted(*args):  # a Ctrl-C while the run says what it runs, just before its loop
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # (the handler raises first)
    monkeypatch.setattr(train, "say_what_runs", interrupted)
    code, text, err = cli(capsys, *argv(corpus, out, "--overwrite", "--max_iters", "4"))
    assert code == 130 and "Traceback" not in err
    assert err.splitlines()[-1].startswith(
        f"stopped before training began; no checkpoint of this run was written; the run --overwrite was replacing is "
        f"back in {out}, as it was; this run's files are kept apart in {out}/undone_overwrite_"), err  # (its events)
    assert restored(out) == before and not (out / ".replaced").exists()


def test_resume_of_a_finished_run_changes_no_byte(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    before = snapshot(out)
    for extra in ([], ["--max_iters", "20"]):
        code, text, err = cli(capsys, "--out_dir", str(out), "--resume", *extra)
        assert code == 0 and "Traceback" not in err
        assert "finished at step 20" in text and "--resume --max_iters 40" in text
        assert snapshot(out) == before
    code, _, err = cli(capsys, "--out_dir", str(out), "--resume", "--max_iters", "5")  # behind its step: refused
    assert code == 2 and "is behind this run's step 20" in err and snapshot(out) == before


class StopAtStep(session.StopRequest):
    """A stop request made as step `at` is done, as by a Ctrl-C then; with `evaluated`, once its evaluation is done."""
    at, evaluated = 8, False
    requested = property(lambda self: self.progress is not None and self.progress.it >= self.at
                         and (self.progress.eval_done or not self.evaluated), lambda self, value: None)


@pytest.mark.parametrize("at", [8, 10])
def test_a_max_iters_behind_a_stopped_runs_step_is_refused_and_one_at_it_ends_the_run_there(corpus, tmp_path, capsys,
                                                                                          at):
    """A run of 30 steps stopped at step 8 (or 10, just after its evaluation), resumed with --max_iters 5, is refused
    in one line naming the step and the --max_iters that ends it there, and nothing is written (it was finished at
    that step with a summary and max_iters 30 still in its checkpoint); --max_iters at the step finishes there (step
    8 evaluated first), its checkpoint saying so, so that a plain --resume then finds it finished rather than training
    on past its summary."""
    cfg, _, explicit = load_config(argv(corpus, tmp_path / "run", "--max_iters", "30", "--eval_interval", "10"), False)
    stop = StopAtStep(speak=False)
    stop.at, stop.evaluated = at, at == 10
    assert train.train(cfg, explicit, say=lambda m: None, stop=stop)["stopped"]
    out = tmp_path / "run"
    before = snapshot(out)
    code, text, err = cli(capsys, "--out_dir", str(out), "--resume", "--max_iters", "5")
    assert code == 2 and err == (f"error: --resume: max_iters 5 is behind this run's step {at}; give --max_iters "
                                 f"{at} or more\n")
    assert snapshot(out) == before and not (out / "summary.json").exists()
    code, text, err = cli(capsys, "--out_dir", str(out), "--resume", "--max_iters", str(at))
    assert code == 0 and f"resume: max_iters changed from 30 to {at}" in text and f"done: {at} steps" in text
    assert json.loads((out / "summary.json").read_text())["iterations"] == at
    assert checkpoint.load(out / "ckpt_last.safetensors")["run_config"]["max_iters"] == at
    code, text, err = cli(capsys, "--out_dir", str(out), "--resume")
    assert code == 0 and f"finished at step {at}" in text


def test_every_folder_state_has_a_way_forward(corpus, finished, tmp_path, capsys):
    best_only = copy_of(finished, tmp_path)
    (best_only / "ckpt_last.safetensors").unlink()
    code, _, err = cli(capsys, *argv(corpus, best_only))
    assert code == 2 and "holds ckpt_best.safetensors but no ckpt_last.safetensors; pass --resume or --overwrite" in err
    code, text, _ = cli(capsys, *argv(corpus, best_only, "--resume", "--max_iters", "24"))
    assert code == 0 and "resuming" in text and "ckpt_best.safetensors" in text
    assert checkpoint.load(best_only / "ckpt_last.safetensors")["iter"] == 24

    logs_only = tmp_path / "logs_only"
    logs_only.mkdir()
    for events in finished.glob("events.out.tfevents.*"):
        shutil.copy(events, logs_only)
    events = {path.name: path.read_bytes() for path in logs_only.iterdir()}
    code, _, resume_err = cli(capsys, *argv(corpus, logs_only, "--resume"))
    assert code == 2 and "start it again without --resume" in resume_err
    # A folder holding only a stopped run's events (Ctrl-C at once, `train.py | head`) takes a new run as it is; the
    # events are kept, byte for byte, in a folder of their own.
    code, text, _ = cli(capsys, *argv(corpus, logs_only, "--max_iters", "2"))
    assert code == 0 and checkpoint.load(logs_only / "ckpt_last.safetensors")["iter"] == 2
    kept = [path for path in logs_only.iterdir() if path.name.startswith("events_before_")]
    assert len(kept) == 1 and f"moved to {kept[0]}" in text
    assert {path.name: path.read_bytes() for path in kept[0].iterdir()} == events

    code, _, err = cli(capsys, *argv(corpus, tmp_path / "nothing", "--resume"))
    assert code == 2 and "drop --resume" in err and not (tmp_path / "nothing").exists()

    # the scripts' way to train in a folder of events alone needs no --overwrite (which would delete them)
    import sample
    events_only = tmp_path / "events_only"
    events_only.mkdir()
    for events in finished.glob("events.out.tfevents.*"):
        shutil.copy(events, events_only)
    assert run_cli(sample.main, ["--out_dir", str(events_only)]) == 2
    err = capsys.readouterr().err
    assert f"train.py --out_dir {events_only}" in err and "--overwrite" not in err


def test_a_folder_of_a_runs_logs_without_its_checkpoints_names_them_and_the_way_that_works(corpus, finished, tmp_path,
                                                                                             capsys):
    """A run folder whose checkpoints were removed (its summary.json and loss.png kept): a new run there is refused in
    one line naming what is there, and the folder is left as it was, with no .lock added; --resume says to start again
    with --overwrite; the scripts' suggestion to train there carries --overwrite, and that command trains."""
    import sample
    folder = copy_of(finished, tmp_path)
    for path in folder.iterdir():
        if path.name.startswith(("ckpt_", "events.")) or path.name == ".lock":
            path.unlink()
    before = sorted(p.name for p in folder.iterdir())
    code, _, err = cli(capsys, *argv(corpus, folder))
    assert code == 2 and err == (f"error: {folder} holds a run's logs (loss.png, summary.json) but no checkpoint; "
                                 f"--overwrite replaces them, or choose another --out_dir\n")
    assert sorted(p.name for p in folder.iterdir()) == before
    code, _, err = cli(capsys, *argv(corpus, folder, "--resume"))
    assert code == 2 and err.endswith("holds only the logs of a run with no checkpoint; start it again with "
                                      "--overwrite instead of --resume\n")
    assert sorted(p.name for p in folder.iterdir()) == before
    assert run_cli(sample.main, ["--out_dir", str(folder)]) == 2
    suggested = capsys.readouterr().err.split("train first: ")[1].rstrip(")\n")
    assert suggested.endswith(f"--out_dir {folder} --overwrite")
    code, _, _ = cli(capsys, *argv(corpus, folder, "--overwrite", "--max_iters", "2"))
    assert code == 0 and checkpoint.load(folder / "ckpt_last.safetensors")["iter"] == 2


def test_an_evaluation_stopped_midway_resumes_exactly(corpus, tmp_path, monkeypatch):
    common = ("--dropout", "0.1", "--log_interval", "1", "--eval_interval", "10", "--eval_iters", "3")
    whole = train.train(*load_config(argv(corpus, tmp_path / "whole", "--max_iters", "30", *common), False)[::2],
                        say=lambda m: None)
    asks = {"n": 0}

    def stop_in_the_step_20_evaluation(stop, d, device, batch):
        asks["n"] += 1
        return asks["n"] == 2 * 6 + 4  # evaluations at steps 0 and 10 ask 6 times each; stop in the third
    monkeypatch.setattr(evaluation, "asked_to_stop", stop_in_the_step_20_evaluation)
    cfg, _, explicit = load_config(argv(corpus, tmp_path / "parts", "--max_iters", "30", *common), False)
    stopped = train.train(cfg, explicit, say=lambda m: None)
    assert stopped["stopped"] and checkpoint.load(tmp_path / "parts" / "ckpt_last.safetensors")["eval_done"] is False
    monkeypatch.undo()
    cfg, _, explicit = load_config(argv(corpus, tmp_path / "parts", "--resume", "--max_iters", "30", *common), False)
    resumed = train.train(cfg, explicit, say=lambda m: None)
    assert stopped["history"] + resumed["history"] == whole["history"]
    assert resumed["full_val_loss"] == whole["full_val_loss"] and resumed["val_loss"] == whole["val_loss"]


def test_a_stop_in_the_final_validation_is_finished_by_resume(corpus, tmp_path, monkeypatch):
    cfg, _, explicit = load_config(argv(corpus, tmp_path / "run", "--max_iters", "10"), False)
    real = session.full_validation_loss

    def stopped_midway(model, batches, rt, d, stop, progress=None):
        return real(model, batches, rt, d, lambda: True, progress)  # a stop asked for, as by a Ctrl-C during it
    monkeypatch.setattr(session, "full_validation_loss", stopped_midway)
    assert train.train(cfg, explicit, say=lambda m: None)["stopped"]
    assert not (tmp_path / "run" / "summary.json").exists()
    monkeypatch.undo()
    messages = []
    cfg, _, explicit = load_config(["--out_dir", str(tmp_path / "run"), "--resume"], False)
    summary = train.train(cfg, explicit, say=messages.append)
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["iterations"] == 10 and saved["val_loss"] == summary["val_loss"] is not None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert saved["full_val_loss"] > 0 and [e.step for e in events.Scalars("summary/full_val_loss")] == [10]
    assert any(m.startswith("done: 10 steps") for m in messages)


@pytest.mark.slow
def test_ctrl_c_in_a_long_evaluation_then_in_a_long_step(corpus, tmp_path):
    out = tmp_path / "run"
    proc = launch(corpus, out, "--eval_iters", "1000000")  # the step-0 evaluation would take hours
    wait_for(lambda: any(out.glob("events.*")))  # written just before the loop starts
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=patient(30))
    assert proc.returncode == 130 and "Traceback" not in stderr and "stopped at step 0" in stdout
    assert checkpoint.load(out / "ckpt_last.safetensors")["iter"] == 0

    # A step of a hundred million accumulated micro-batches (hours): one Ctrl-C, between two of them, undoes the step
    # and saves the state before it, without waiting hours for the step to end.
    slow = tmp_path / "slow"
    proc = launch(corpus, slow, "--grad_accum_steps", "100000000", "--max_iters", "2")
    wait_for(lambda: (slow / "ckpt_last.safetensors").exists())
    time.sleep(0.5)  # past the step boundary, into step 0's micro-batches
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=patient(30))
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert "stopped at step 0" in stdout and "stopped at once" not in stderr
    assert checkpoint.load(slow / "ckpt_last.safetensors")["iter"] == 0 and not list(slow.glob("*.tmp-*"))

    # Nothing of the undone step is left: resumed with 2 micro-batches a step, the run is the one that had 2 from the
    # start, weight for weight.
    assert cli_quiet(corpus, slow, "--resume", "--grad_accum_steps", "2", "--max_iters", "2") == 0
    straight = tmp_path / "straight"
    assert cli_quiet(corpus, straight, "--grad_accum_steps", "2", "--max_iters", "2") == 0
    resumed, uninterrupted = (checkpoint.load(folder / "ckpt_last.safetensors") for folder in (slow, straight))
    assert resumed["iter"] == uninterrupted["iter"] == 2
    for name, weight in uninterrupted["model"].items():
        assert torch.equal(resumed["model"][name], weight), name


def cli_quiet(corpus, out, *extra):
    """train.py's main in this process (a new interpreter would spend seconds importing torch), its output dropped:
    its exit code."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return run_cli(train.main, argv(corpus, out, *extra))


@pytest.mark.slow
def test_a_reader_that_goes_away_saves_the_run_first(corpus, tmp_path):
    """`python train.py 2>&1 | tee log`, then Ctrl-C: tee ends too, and the run's next line meets a closed pipe. It
    saves and ends as for a Ctrl-C: a run that died there would lose its steps since the last checkpoint."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *argv(corpus, out, "--max_iters", "100000",
                             "--eval_interval", "100000", "--log_interval", "5")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    LAUNCHED.append(proc)
    while not proc.stdout.readline().startswith("step 10/"):  # the step-0 checkpoint is written, and 10 steps more
        assert proc.poll() is None
    proc.stdout.close()  # the reader goes
    assert proc.wait(timeout=patient(60)) == 130
    saved = checkpoint.load(out / "ckpt_last.safetensors")["iter"]
    # the step at which a write first found the pipe closed: 15, or 10 if a note came sooner (steps slowed by load)
    assert saved >= 10 and saved % 5 == 0
    assert not list(out.glob("*.tmp-*"))


@pytest.mark.slow
def test_a_reader_gone_before_the_first_step_is_named_as_the_cause_of_the_stop(corpus, tmp_path):
    """`python train.py | head -2`: the reader leaves after the first lines, before training begins. The run stops
    as for a Ctrl-C (130), and its last line on stderr (still the terminal) says why, since nobody pressed a key."""
    proc = launch(corpus, tmp_path / "run", "--max_iters", "100000")
    assert proc.stdout.readline().startswith("config: debug")
    proc.stdout.close()  # the reader goes
    assert proc.wait(timeout=patient(60)) == 130
    last = proc.stderr.read().strip().splitlines()[-1]
    assert last.startswith("the output's reader has gone (a closed pipe or terminal): stop"), last


@pytest.mark.slow
def test_a_closed_terminal_saves_the_run_first_unless_nohup_ignores_it(corpus, tmp_path):
    """SIGHUP (an ssh connection that drops) stops the run at a step boundary and saves it, as Ctrl-C does, instead
    of ending the process at once, its steps since the last checkpoint lost; under nohup (SIGHUP ignored) it changes
    nothing."""
    out = tmp_path / "run"
    # SIGHUP as a terminal's process has it (the default), even where the tests themselves run under nohup: an
    # ignored signal stays ignored across exec
    proc = launch(corpus, out, "--max_iters", "100000", "--eval_interval", "100000", "--log_interval", "5",
                  preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    while not proc.stdout.readline().startswith("step 10/"):
        assert proc.poll() is None
    proc.send_signal(signal.SIGHUP)
    stdout, stderr = proc.communicate(timeout=patient(60))
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert "the terminal closed (SIGHUP): stopping: " in stderr, stderr  # the cause, which nobody typed, named
    saved = checkpoint.load(out / "ckpt_last.safetensors")["iter"]
    assert saved >= 10 and f"stopped at step {saved}" in stdout

    ignored = subprocess.Popen(["nohup", sys.executable, str(ROOT / "train.py"), *argv(corpus, tmp_path / "nohup",
                                "--max_iters", "60", "--log_interval", "5")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    LAUNCHED.append(ignored)
    while not ignored.stdout.readline().startswith("step 10/"):
        assert ignored.poll() is None
    ignored.send_signal(signal.SIGHUP)
    assert ignored.wait(timeout=patient(120)) == 0
    assert checkpoint.load(tmp_path / "nohup" / "ckpt_last.safetensors")["iter"] == 60


@pytest.mark.slow
def test_sigterm_while_preparing_removes_its_temporary_folder(tmp_path):
    corpus = tmp_path / "big.txt"
    corpus.write_text(("the quick brown fox jumps over the lazy dog; 東京 café\n" * 700_000), encoding="utf-8")
    prepared = tmp_path / "cache" / "prepared"
    proc = launch(corpus, tmp_path / "run")
    wait_for(lambda: any(prepared.glob("*.tmp-*")))
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=patient(60))
    assert proc.returncode == 130 and "stopped before training began" in stderr and "Traceback" not in stderr
    assert not list(prepared.glob("*.tmp-*"))
    # one left by a process that no longer exists is removed by the next preparation
    stale = prepared / "0123456789abcdef0123-utf-8-strict-val0.1.tmp-999999999"
    stale.mkdir(parents=True)
    (stale / "train.bin").write_bytes(b"\0" * 100)
    from data import prepare, resolve
    small = tmp_path / "small.txt"
    small.write_text("hello world\n" * 100)
    prepare(resolve(str(small), tmp_path / "cache"), tmp_path / "cache")
    assert not stale.exists()


def test_printed_commands_paste_back_with_spaces_in_the_path(corpus, tmp_path, capsys):
    out = tmp_path / "my runs" / "first try"
    code, text, _ = cli(capsys, *argv(corpus, out, "--max_iters", "4"))
    assert code == 0
    sample_line = next(line for line in text.splitlines() if line.startswith("sample it:"))
    assert shlex.split(sample_line.split(":", 1)[1])[-1] == str(out)
    code, text, _ = cli(capsys, "--out_dir", str(out), "--resume", "--max_iters", "6")
    first = text.splitlines()[0]
    assert code == 0 and "saved config" in first and "no --config given" not in first


def test_samples_in_tensorboard_are_drawn_without_dropout(corpus, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from model.generate import generate
    out = tmp_path / "run"
    cfg, _, explicit = load_config(argv(corpus, out, "--dropout", "0.5", "--max_iters", "10", "--eval_interval", "10",
                                        "--sample_chars", "30", "--full_val", "false"), False)
    train.train(cfg, explicit, say=lambda m: None)
    model, tokenizer, state = checkpoint.load_model(out / "ckpt_last.safetensors")  # eval mode: no dropout
    prompt = tokenizer.encode(tokenizer.default_prompt(state["data"]["first_char"]))
    expected = tokenizer.decode(generate(model, [prompt], 30, generator=torch.Generator().manual_seed(cfg.seed))[0])
    events = EventAccumulator(str(out))
    events.Reload()
    logged = [e for e in events.Tensors("samples/text_summary") if e.step == 10][0]
    assert logged.tensor_proto.string_val[0].decode() == "```\n" + expected + "\n```"


def test_the_default_folder_is_named_after_preset_and_the_corpus_really_used(corpus, tmp_path, capsys, monkeypatch):
    import data.corpus as corpus_module
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    monkeypatch.chdir(tmp_path)
    quick = ("--config", "debug", "--cache_dir", str(corpus.parent / "cache"), "--max_iters", "2", "--eval_iters", "1",
             "--full_val", "false")
    shutil.copy(corpus, tmp_path / "my_corpus.txt")
    (tmp_path / "my_notes").mkdir()
    shutil.copy(corpus, tmp_path / "my_notes" / "a.txt")
    for data, folder in (("my_corpus.txt", "debug-my_corpus"), ("my_notes", "debug-my_notes")):
        code, text, _ = cli(capsys, *quick, "--data", data)  # after one run, the README's next commands are not refused
        assert code == 0 and f"run folder: out/{folder};" in text \
            and (tmp_path / "out" / folder / "ckpt_last.safetensors").exists()
    bad = tmp_path / "not_shakespeare.txt"
    bad.write_text("not shakespeare")
    monkeypatch.setattr(corpus_module, "SHAKESPEARE_URL", bad.as_uri())  # offline, in effect
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the default cache: --cache_dir would rule it out
    code, text, _ = cli(capsys, *[arg for arg in quick if "cache" not in arg])
    out = tmp_path / "out" / "debug-pystdlib"
    assert code == 0 and "using the offline corpus 'pystdlib'" in text and "run folder: out/debug-pystdlib;" in text
    assert checkpoint.load(out / "ckpt_last.safetensors")["run_config"]["data"] == "pystdlib"
    events = EventAccumulator(str(out))
    events.Reload()
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"data": "pystdlib"' in config
    # the folder a command written for the online case names does not exist: the scripts point to the ones that do
    # (a bare "train first" would train again); the command they suggest names train.py by its full path, since it is
    # not under the working folder
    import sample
    assert run_cli(sample.main, ["--out_dir", "out/debug-shakespeare"]) == 2
    assert capsys.readouterr().err == (
        "error: out/debug-shakespeare: no such folder; runs with a model beside it: out/debug-my_corpus, "
        "out/debug-my_notes, out/debug-pystdlib; give one as --out_dir, or train: "
        f"python {ROOT / 'train.py'} --out_dir out/debug-shakespeare\n")


@pytest.mark.parametrize("named", [("--data", "shakespeare"), ("--cache_dir", "CACHE"), ("--resume",)])
def test_offline_only_a_new_run_on_the_default_corpus_and_cache_trains_on_pystdlib(tmp_path, capsys, monkeypatch,
                                                                                    named):
    """Tiny Shakespeare out of reach: a corpus or a cache the command names (a mistyped --cache_dir, one without the
    copy the user meant to put there), or a run to resume, is an error naming the cause and where the copy would be,
    before anything is written; only `python train.py` with neither (the previous test) swaps in pystdlib."""
    import data.corpus as corpus_module
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(corpus_module, "SHAKESPEARE_URL", (tmp_path / "nowhere.txt").as_uri())  # offline, in effect
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = tmp_path / "cahce"  # mistyped
    code, out, err = cli(capsys, "--config", "debug", *[str(cache) if arg == "CACHE" else arg for arg in named])
    where = (cache if "--cache_dir" in named else tmp_path / "xdg" / "chargpt") / "tinyshakespeare.txt"
    assert code == 2 and err.startswith("error: --data shakespeare: could not download Tiny Shakespeare (") and \
        f"), and {where} holds no copy; connect to the network, put a copy there" in err, err
    assert "pystdlib'" not in out + err and not (tmp_path / "out").exists()
    assert not (tmp_path / "xdg" / "chargpt").exists() or not list((tmp_path / "xdg" / "chargpt").glob("pystdlib*"))


def test_saved_settings_this_version_does_not_know_are_named(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    state = checkpoint.load(out / "ckpt_last.safetensors", resume=True)
    checkpoint.save({**state, "run_config": {**state["run_config"], "warmup_ratio": 0.1, "old_flag": True}},
               out / "ckpt_last.safetensors")
    code, text, _ = cli(capsys, "--out_dir", str(out), "--resume")
    assert code == 0 and "does not know, ignored: old_flag, warmup_ratio" in text and "finished at step 20" in text


def test_a_lock_its_owner_removed_as_it_let_go_is_never_taken_for_the_folder(tmp_path, monkeypatch):
    """The interleaving of two launches on one new folder: B opens the folder's lock file, then A (refused) lets go,
    removing that lock and the folder it made, then B locks the file it opened. B must not own the folder through a
    lock on a removed file (a third process would then own it too): it claims the folder anew, and the third is
    refused."""
    import os
    from common import run_folder
    from errors import UserError

    folder = tmp_path / "run"
    a = run_folder.RunDir(folder).claim(say=lambda message: None)
    opened = run_folder.open_lock(folder / run_folder.LOCK, create=False)  # B's open, before A lets go
    a.release()
    assert not folder.exists()
    real_open, handed = run_folder.open_lock, []

    def open_lock(path, create):  # B's first open is the one it made before A let go
        if not handed:
            handed.append(path)
            return opened
        return real_open(path, create)

    monkeypatch.setattr(run_folder, "open_lock", open_lock)
    b = run_folder.RunDir(folder).claim(say=lambda message: None)
    held, there = os.fstat(b._lock_fd), os.stat(folder / run_folder.LOCK)
    assert (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
    assert run_folder.holder(folder) == f"process {os.getpid()} ({run_folder.command_line()})"
    with pytest.raises(UserError, match=f"is in use by process {os.getpid()}"):
        run_folder.RunDir(folder).claim(say=lambda message: None)
    b.release()
