"""Robustness: kill -9, Ctrl-C and SIGTERM, NaN, a full disk, hostile checkpoints and random input."""
import contextlib
import io
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train
from training.checkpoint import Progress
from conftest import ROOT, patient
from configs import load_config
from data import prepare, resolve
from errors import Interrupted, UserError, run_cli
from model.gpt import GPT
from training import checkpoint
import sample as sample_cli


def train_argv(corpus, out_dir, *extra):
    return [sys.executable, str(ROOT / "train.py"), "--config", "debug", "--data", str(corpus),
            "--cache_dir", str(corpus.parent / "cache"), "--out_dir", str(out_dir), *extra]


def resume_here(corpus, out_dir, *extra) -> tuple[int, str]:
    """A resume that only has to finish: train.py's main in this process (a new interpreter would spend seconds
    importing torch again); its exit code and what it wrote on stderr."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = run_cli(train.main, train_argv(corpus, out_dir, "--resume", *extra)[2:])
    return code, err.getvalue()


def wait_for(path, timeout=patient(60)):
    deadline = time.time() + patient(timeout)
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_ctrl_c_while_python_loads_torch_is_one_line(corpus, tmp_path):
    """Ctrl-C while `python train.py` imports torch (a second or more; sent once torch's libraries are in the
    process's memory map, where Linux shows it): exit 130 and the one line that nothing was written, not a
    KeyboardInterrupt traceback from inside torch; no run folder."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *train_argv(corpus, out)[2:]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    maps, deadline = Path(f"/proc/{proc.pid}/maps"), time.time() + patient(30)
    while maps.exists() and proc.poll() is None and time.time() < deadline:
        with contextlib.suppress(OSError):
            if "/torch/" in maps.read_text():  # (a fixed wait of 0.2 s fell before the command's own first line
                break                          # on a busy machine: that is Python's start, not the command's)
        time.sleep(0.01)
    if not maps.exists():  # (no /proc: a fifth of a second in, as a user's quick Ctrl-C)
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=patient(60))
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert [line for line in (stdout + stderr).splitlines() if line.strip()] == [
        "stopped before training began; no checkpoint of this run was written"]
    assert not out.exists()


LOADING = ["train.py", *(f"scripts/{name}.py" for name in ("sample", "evaluate", "attention_html", "attention_map",
                                                            "attention_walkthrough", "plot_run", "tutorials", "ladder",
                                                            "export", "prepare"))]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_while_a_command_loads_its_libraries_is_one_line_and_130(tmp_path, sig):
    """A Ctrl-C, SIGTERM or SIGHUP that comes while a command imports torch (a second or more: here a stand-in torch
    that sends it at its import, found first on PYTHONPATH) ends every command with exit 130 and one line, not the
    import's KeyboardInterrupt traceback, nor (SIGTERM, SIGHUP) an end without a word."""
    (tmp_path / "torch.py").write_text(f"import os, sys, time\nos.kill(os.getpid(), {int(sig)})\ntime.sleep(5)\n"
                                       f"sys.exit('the stop went unanswered')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def as_from_a_terminal():  # (a test run in the background, or under nohup, hands its ignored signals down)
        for each in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(each, signal.SIG_DFL)
    for command in LOADING:
        done = subprocess.run([sys.executable, str(ROOT / command), "--help"], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=patient(60), preexec_fn=as_from_a_terminal)
        line = ("stopped before training began; no checkpoint of this run was written" if command == "train.py"
                else "interrupted")
        assert (done.returncode, done.stdout, done.stderr) == (130, "", line + "\n"), (command, done.stderr[-500:])


def test_ctrl_c_while_a_resume_opens_names_the_checkpoint_and_the_command_that_continues(corpus, tmp_path, monkeypatch):
    """A Ctrl-C while a resume is being opened (its checkpoint read, the device not yet set up): exit 130 and one line
    saying that the checkpoint it resumes is untouched, with the command that continues it; the checkpoint is as it
    was, byte for byte."""
    import training.opening
    from training.report import resume_command
    out = tmp_path / "run"
    assert run_cli(train.main, train_argv(corpus, out, "--max_iters", "10")[2:]) == 0
    before = (out / "ckpt_last.safetensors").read_bytes()
    setup = training.opening.setup

    def interrupted_setup(*args, **kwargs):  # the user's Ctrl-C, arriving while the run is opened
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the handler runs in this thread between bytecodes
        return setup(*args, **kwargs)
    monkeypatch.setattr(training.opening, "setup", interrupted_setup)
    code, err = resume_here(corpus, out, "--max_iters", "20")
    assert code == 130, err
    assert err.strip().splitlines()[-1] == (f"stopped before training began; {out / 'ckpt_last.safetensors'} (step 10) is "
                                            f"untouched. Continue with: {resume_command(out)}")
    assert "--resume" in resume_command(out) and (out / "ckpt_last.safetensors").read_bytes() == before


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 130)])
def test_interrupt_saves_and_explains_how_to_resume(corpus, tmp_path, sig, code):
    """Ctrl-C or SIGTERM mid-run: exit 130, ckpt_last.safetensors saved at a step, the resume command said; a SIGTERM, which
    nobody typed at this terminal, is named in the acknowledgement."""
    out = tmp_path / "run"
    proc = subprocess.Popen(train_argv(corpus, out, "--max_iters", "100000", "--eval_interval", "50"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(out / "ckpt_last.safetensors")
    time.sleep(0.5)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=patient(60))
    assert proc.returncode == code, stderr
    assert "--resume" in stdout and "Traceback" not in stderr + stdout
    named = "SIGTERM (a request to end the process): stopping: " in stderr
    assert named == (sig == signal.SIGTERM) and "stopping: " in stderr, stderr
    state = checkpoint.load(out / "ckpt_last.safetensors")
    assert 0 < state["iter"] < 100000
    assert any(out.glob("events.out.tfevents.*"))
    code, err = resume_here(corpus, out, "--max_iters", str(state["iter"] + 5))
    assert code == 0, err
    assert checkpoint.load(out / "ckpt_last.safetensors")["iter"] == state["iter"] + 5


@pytest.mark.slow
def test_kill_9_at_any_moment_never_loses_the_last_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    target = 150
    rng = random.Random(0)
    for attempt in range(3):
        resume = ["--resume"] if (out / "ckpt_last.safetensors").exists() else ["--overwrite"]
        proc = subprocess.Popen(train_argv(corpus, out, "--max_iters", str(target), "--eval_interval", "1", *resume),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(out / "ckpt_last.safetensors")
        time.sleep(rng.uniform(0.05, 0.6))  # checkpoints are written every step: this lands in or near a write
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = checkpoint.load(out / "ckpt_last.safetensors")  # always loads: never a half-written file
        assert state["iter"] <= target
    code, err = resume_here(corpus, out, "--max_iters", str(target), "--eval_interval", "50")
    assert code == 0, err
    final = checkpoint.load(out / "ckpt_last.safetensors")
    assert final["iter"] == target and not list(out.glob("*.tmp-*"))


def test_nan_steps_are_skipped_then_the_run_stops_keeping_good_weights(corpus, tmp_path, monkeypatch):
    forward = GPT.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None, **kwargs):
        logits, loss = forward(self, idx, targets, **kwargs)
        if targets is not None and torch.is_grad_enabled() and self.training:  # training steps, not the speed probe
            calls["n"] += 1
            if calls["n"] in (3,) or calls["n"] >= 12:  # one stray NaN, later a run of them
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", poisoned)
    cfg, _, explicit = load_config(["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "c"),
                                    "--out_dir", str(tmp_path / "run"), "--eval_interval", "5",
                                    "--max_nonfinite_steps", "3"], False)
    with pytest.raises(UserError, match="3 steps in a row had a non-finite loss"):
        train.train(cfg, explicit, say=lambda m: None)
    state = checkpoint.load(tmp_path / "run" / "ckpt_last.safetensors")
    assert state["iter"] == 10  # the last evaluation before the NaNs began at step 11
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    good = {"model": {"w": torch.ones(3)}, "model_config": {}, "run_config": {}, "vocab": "ab", "iter": 1}
    checkpoint.save(good, path)
    before = path.read_bytes()

    def disk_full(f, tensors, metadata):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_safetensors", disk_full)
    with pytest.raises(UserError, match="No space left on device.*previous checkpoint is untouched"):
        checkpoint.save({**good, "iter": 2}, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["ckpt.safetensors"]
    monkeypatch.undo()
    with pytest.raises(UserError, match="holds NaN or inf"):
        checkpoint.save({**good, "model": {"w": torch.tensor([float("nan")])}}, path)
    assert path.read_bytes() == before


def test_a_malicious_checkpoint_never_runs_code(tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    torch.save({"format": 1, "model": Exploit()}, evil)
    with pytest.raises(UserError, match="old format.*convert_checkpoint.py"):  # nothing is unpickled
        checkpoint.load(evil)
    assert not marker.exists()


def test_fuzzed_corpora_either_prepare_or_fail_cleanly(tmp_path):
    rng = random.Random(1234)
    for case in range(40):
        path = tmp_path / f"fuzz{case}.txt"
        kind = case % 4
        if kind == 0:
            path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 3000))))
        elif kind == 1:
            path.write_text("".join(chr(rng.choice([rng.randrange(32, 0xD800), rng.randrange(0xE000, 0x110000)]))
                                    for _ in range(rng.randrange(1, 2000))), encoding="utf-8")
        elif kind == 2:
            path.write_text("x" * rng.randrange(100_000, 2_000_000), encoding="utf-8")  # one huge line
        else:
            path.write_bytes(rng.choice([b"", b"\n", b"\xff\xfe", b"a\x00b", "é".encode("latin-1")]))
        try:
            prepared = prepare(resolve(str(path), tmp_path / "cache"), tmp_path / "cache")
        except UserError as err:
            assert "\n" not in str(err)
        else:
            assert prepared.meta["n_train"] + prepared.meta["n_val"] == prepared.meta["n_chars"] > 0


def test_fuzzed_prompts_either_encode_or_fail_cleanly():
    from data import CharTokenizer
    tokenizer = CharTokenizer("\n !,.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
    rng = random.Random(99)
    for _ in range(200):
        prompt = "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(0, 40)))
        for policy in ("error", "skip"):
            try:
                encoded = sample_cli.encode_prompts([prompt], tokenizer, policy)
            except UserError as err:
                assert "\n" not in str(err)
            else:
                assert tokenizer.decode(encoded[0]) == "".join(c for c in prompt if c in tokenizer.stoi)


def test_a_stop_during_the_final_validation_says_what_it_ends(capfd):
    """Once the steps are over, a Ctrl-C ends the final validation: it says so, not that it will finish a step."""
    with train.StopRequest() as stop:
        stop.training(Progress(it=10), agree_every=1)
        stop.ending = "ending the final validation; step 10 is saved already"
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
    said = capfd.readouterr().err
    assert stop.requested and "stopping: ending the final validation; step 10 is saved already" in said
    assert "is done; a step under way" not in said


def test_the_stop_note_and_the_stop_line_name_the_last_finished_step(capfd, tmp_path):
    """A Ctrl-C after step 54 names step 54 as done and says that a step under way finishes first (step 55: so the
    closing line's step, the one ckpt_last.safetensors holds, may be one more) while an evaluation stops between batches."""
    from training.report import stopped_line
    with train.StopRequest() as stop:
        stop.training(Progress(it=54), agree_every=1)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
    said = capfd.readouterr().err
    assert ("stopping: step 54 is done; a step under way finishes first (an evaluation stops between batches), then "
            "saving ckpt_last.safetensors (press Ctrl-C again to stop at once)") in said
    assert stopped_line(55, tmp_path, in_final_validation=False).startswith(
        f"stopped at step 55; saved {tmp_path / 'ckpt_last.safetensors'}.")


@pytest.mark.parametrize("step, undo, words", [
    (54, True, "stopping: step 54 is done; a step under way is undone, or finishes if in its last micro-batch (an "
               "evaluation stops between batches), then saving ckpt_last.safetensors"),
    (0, False, "stopping: no step is done yet; a step under way finishes first (an evaluation stops between batches)"),
])
def test_the_stop_note_says_what_happens_to_a_step_of_several_micro_batches_and_before_any_step(capfd, step, undo,
                                                                                                 words):
    """With --grad_accum_steps above 1 a stop between micro-batches undoes the step under way (train.py's
    forward_backward), so the note cannot promise that it finishes; before step 1 no step is 'done'."""
    with train.StopRequest() as stop:
        stop.training(Progress(it=step), agree_every=1, undo=undo)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
    assert words in capfd.readouterr().err


def test_a_doubled_signal_is_one_stop_request_and_a_later_one_stops_at_once(monkeypatch):
    """Under torchrun a Ctrl-C arrives twice within milliseconds (terminal + torchrun's forwarding): still one request
    to stop at the step boundary. Another signal after the grace time interrupts at once, naming the checkpoint left
    and the command that continues from it."""
    monkeypatch.setattr(train.StopRequest, "GRACE_SECONDS", 0.5)
    with train.StopRequest() as stop:
        stop.training(Progress(it=7), agree_every=1)  # the first signal asks for a stop at the step boundary
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs in this thread between bytecodes
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert stop.requested
        time.sleep(0.5)
        stop.saved, stop.resume = "the last checkpoint, out/x/ckpt_last.safetensors (step 7), is intact", "python train.py ..."
        with pytest.raises(KeyboardInterrupt, match=r"^stopped at once; the last checkpoint, out/x/ckpt_last.safetensors "
                                                    r"\(step 7\), is intact. Continue with: python train.py \.\.\.$"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are given back


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full, a file every write to fails")
def test_output_held_in_the_buffer_that_cannot_be_written_is_one_line_and_exit_2():
    """A command whose output, a few bytes held in the buffer of a redirected stdout, is written only after its main
    has returned, onto a full disk (/dev/full): one line and exit code 2, not exit 0 with the output lost unsaid (the
    flush at exit would swallow the error)."""
    program = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from errors import run_cli
sys.exit(run_cli(lambda argv: print("a small sample")))
"""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-c", program], stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                              timeout=patient(60))
    assert (done.returncode, done.stderr) == (2, "error: could not read or write (No space left on device); check "
                                                 "the path, its permissions and the free disk space\n")


def test_output_piped_into_a_reader_that_leaves_ends_quietly_with_141():
    """`python scripts/sample.py ... | head -2`: when the reader closes the pipe, the command ends with the status a
    shell expects of such a writer (128 + SIGPIPE) and says nothing, instead of 'could not read or write'."""
    program = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from errors import run_cli
def main(argv):
    for i in range(10**7):
        print("line", i)
sys.exit(run_cli(main))
"""
    writer = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdout.readline() == b"line 0\n"
    writer.stdout.close()  # the reader leaves
    assert writer.wait(timeout=patient(60)) == 141
    assert writer.stderr.read() == b""


@pytest.mark.parametrize("error, code", [(UserError("bad input"), 2), (Interrupted("stopped at once"), 130)])
def test_the_last_line_into_a_pipe_whose_reader_has_gone_keeps_the_exit_code(monkeypatch, error, code):
    """`train.py ... 2>&1 | head`, then a stop: stderr's reader has gone too, so the closing line cannot be written;
    the exit code is still the one for the error or the stop (2, 130), not Python's 1 from a failed write."""
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stderr", stream)

    def main(argv):
        raise error
    try:
        assert run_cli(main, []) == code
        stream.flush()  # what the interpreter does at exit: a write error there would make the exit code 1
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def test_a_suggested_command_names_the_script_as_it_can_be_typed_where_the_user_is(monkeypatch, tmp_path):
    """errors.python_command: in the project's folder the script's path from there ('python train.py'); in its
    scripts/ folder 'python sample.py'; anywhere else, or in a working folder that was deleted, the full path, as the
    shell reads it."""
    from errors import python_command
    monkeypatch.chdir(ROOT)
    assert (python_command("train.py"), python_command("scripts/sample.py")) == (
        "python train.py", "python scripts/sample.py")
    monkeypatch.chdir(ROOT / "scripts")
    assert (python_command("train.py"), python_command("scripts/sample.py")) == (
        f"python {shlex.quote(str(ROOT / 'train.py'))}", "python sample.py")
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert python_command("train.py") == f"python {shlex.quote(str(ROOT / 'train.py'))}"
