"""scripts/bench_gpu.sh, the GPU sitting, driven on the CPU: its smoke part says FAIL when a compile falls back, it
writes no log through a link, a stop ends every process it started and removes its temp folder, the nanoGPT part
leaves the user's checkout as it was."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, patient

SCRIPT = ROOT / "scripts" / "bench_gpu.sh"


def start(*args: str, tmp_path: Path, **env: str) -> subprocess.Popen:
    """bash scripts/bench_gpu.sh ARGS in a session of its own (so that every process it starts can be found), shrunk
    (QUICK=1), its temp folders under tmp_path/tmp. Its `python` is the one running these tests (first on PATH), so
    they pass whether or not a virtual environment was activated."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    environment = {**os.environ, "QUICK": "1", "TMPDIR": str(tmp_path / "tmp"), "PATH": path, **env}
    return subprocess.Popen(["bash", str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environment, start_new_session=True)


def session_processes(session: int) -> list[int]:
    """The processes still alive in a session (zombies, already ended, left out)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session and " Z " not in (entry / "stat").read_text():
                    alive.append(int(entry.name))
            except OSError:  # ended meanwhile
                pass
    return alive


def finish(process: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Its exit code, stdout and stderr; whatever it left running is killed: a failing test leaves no orphans."""
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        for pid in session_processes(process.pid):
            os.kill(pid, signal.SIGKILL)
    return process.returncode, out, err


@pytest.fixture
def corpus(tmp_path, small_text):
    path = tmp_path / "corpus.txt"
    path.write_text(small_text, encoding="utf-8")
    return path


def test_the_gpu_sitting_script_parses_and_refuses_what_it_cannot_run(tmp_path, corpus):
    """scripts/bench_gpu.sh is run on a lent GPU, where a mistake costs minutes of it: bash reads it without a syntax
    error, and a wrong part or a missing nanoGPT checkout stops it at once with one line and exit 2, before any run."""
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "NANOGPT"}
    for part, words in (("bogus", "the part is smoke, smoke2, smoke3, tests, speed, runs, recipe, tune, nanogpt or "
                                  "all, not 'bogus'"),
                        ("nanogpt", "set NANOGPT to a checkout of karpathy/nanoGPT")):
        done = subprocess.run(["bash", str(SCRIPT), part, str(corpus), str(tmp_path / "logs")], capture_output=True,
                              text=True, env=env, timeout=patient(60))
        assert done.returncode == 2 and done.stderr.startswith(f"error: {words}")
        assert done.stderr.count("\n") == 1 and not (tmp_path / "logs").exists()
    usage = subprocess.run(["bash", str(SCRIPT), "tests"], capture_output=True, text=True, timeout=patient(60))
    assert usage.returncode == 2 and usage.stderr.startswith("usage: ")


def test_a_log_or_log_folder_that_is_a_link_is_refused_and_nothing_is_written_through_it(tmp_path, corpus):
    """A log named by a symbolic link would be written wherever it points (tee follows links): the script refuses a
    linked log file or log folder in one line, exit 2, before anything runs, and the linked-to file is unchanged."""
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_bytes(b"someone's file\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "smoke.log").symlink_to(elsewhere)
    (tmp_path / "folder").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "folder")
    for logdir, words in ((logs, f"the log {logs}/smoke.log is a symbolic link"),
                          (tmp_path / "linked", f"the log folder {tmp_path}/linked is a symbolic link")):
        code, out, err = finish(start("smoke", str(corpus), str(logdir), tmp_path=tmp_path), timeout=patient(60))
        assert code == 2 and err.startswith(f"error: {words}") and err.count("\n") == 1, err
    assert elsewhere.read_bytes() == b"someone's file\n" and list((tmp_path / "folder").iterdir()) == []
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_a_stop_ends_every_process_of_the_sitting_and_removes_its_temp_folder(tmp_path, corpus, sig, code, name):
    """SIGTERM (or Ctrl-C) during a step: every process the script started ends, its temp folder is removed, and no
    step goes on running or saying PASS or FAIL after the stop (as a part left running in a subshell would, printing
    FAIL for steps it never ran and leaving its temp folder behind)."""
    process = start("smoke", str(corpus), str(tmp_path / "logs"), tmp_path=tmp_path)
    log = tmp_path / "logs" / "smoke.log"
    deadline = time.monotonic() + patient(120)
    while not (log.exists() and "$ python train.py" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # the run's python has started
    assert len(session_processes(process.pid)) > 2  # bash, its part's subshell, the step's python, ...
    process.send_signal(sig)
    returncode, out, err = finish(process, timeout=patient(60))
    assert returncode == code and err.strip().endswith(f"stopped by {name}; the logs so far are in {tmp_path}/logs")
    assert list((tmp_path / "tmp").iterdir()) == []
    said = log.read_text()
    time.sleep(2)
    assert log.read_text() == said and "PASS" not in said and "FAIL" not in said and "FAIL" not in out


def test_the_nanogpt_part_works_on_a_copy_of_the_checkout_and_changes_nothing_in_it(tmp_path, corpus):
    """The nanoGPT part writes the corpus and prepare.py's token files into a copy of the checkout: the user's
    checkout keeps every file byte for byte (its own input.txt too) and gains none."""
    checkout = tmp_path / "nanoGPT"
    data = checkout / "data" / "shakespeare_char"
    (checkout / "config").mkdir(parents=True)
    data.mkdir(parents=True)
    (checkout / "train.py").write_text("import os, sys\nprint('stand-in train.py in', os.getcwd(), sys.argv[1:])\n")
    (checkout / "model.py").write_text("# stand-in\n")
    (checkout / "configurator.py").write_text("# stand-in\n")
    (checkout / "config" / "train_shakespeare_char.py").write_text("dataset = 'shakespeare_char'\n")
    (data / "prepare.py").write_text("open('train.bin', 'wb').write(open('input.txt', 'rb').read())\n")
    (data / "input.txt").write_text("the user's own copy of the text\n")
    (data / "readme.md").write_text("kept\n")

    def files() -> dict:
        return {path.relative_to(checkout): path.read_bytes() for path in sorted(checkout.rglob("*")) if path.is_file()}
    before = files()
    code, out, err = finish(start("nanogpt", str(corpus), str(tmp_path / "logs"), tmp_path=tmp_path,
                                  NANOGPT=str(checkout)), timeout=patient(120))
    assert files() == before
    ran = [line for line in out.splitlines() if line.startswith("stand-in train.py in ")]
    assert len(ran) == 1 and str(checkout) not in ran[0] and "nanogpt-code" in ran[0], out
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.smoke_compile
def test_the_quick_smoke_compiles_and_a_compiler_that_fails_is_a_fail_line(tmp_path, corpus):
    """QUICK=1 smoke compiles the preset's run and the decoding step with inductor on the CPU. With a C++ compiler
    that always fails (inductor runs $CXX; a fresh compile cache, so that no cached kernel spares it), both fall back,
    which is FAIL for each (not the exit code: a fallback exits 0), and the part exits 1. With the real compiler every
    line is PASS and it exits 0."""
    broken = tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'no compiler here (stand-in)' >&2\nexit 1\n")
    broken.chmod(0o755)
    code, out, err = finish(start("smoke", str(corpus), str(tmp_path / "broken"), tmp_path=tmp_path, CXX=str(broken),
                                  TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")), timeout=patient(600))
    verdicts = [line for line in out.splitlines() if line.startswith(("PASS ", "FAIL "))]
    assert code == 1, out + err
    assert "FAIL GPU preset, compiled, end to end (fell back: torch.compile failed)" in verdicts, out
    assert "FAIL sampling compiled: a padded batch, host syncs counted (exit 1)" in verdicts, out
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # under the usual temp folder, not ours
    code, out, err = finish(start("smoke", str(corpus), str(tmp_path / "working"), tmp_path=tmp_path,
                                  TORCHINDUCTOR_CACHE_DIR=default_cache_dir()), timeout=patient(600))
    verdicts = [line for line in out.splitlines() if line.startswith(("PASS ", "FAIL "))]
    assert code == 0 and not any(line.startswith("FAIL") for line in verdicts), out + err
    assert len(set(verdicts)) == 5 and "smoke: 5 passed, 0 failed\n" in out


@pytest.mark.smoke_verdicts
def test_a_python_warning_that_reaches_the_screen_is_a_fail_line_naming_it(tmp_path, corpus):
    """A smoke step whose output has a Python warning at a line's start, as torch prints one, is FAIL with the warning
    named, and the part exits 1; the steps whose commands do not warn still PASS. QUICK=1 smoke3's train.py runs are
    made to warn by a stand-in sitecustomize (first on PYTHONPATH, warning in train.py alone); its sample.py steps
    are not."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys, warnings\nif sys.argv[0].endswith('train.py'):\n"
                                           "    warnings.warn('a stand-in for a warning of torch', UserWarning)\n")
    python_path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    code, out, err = finish(start("smoke3", str(corpus), str(tmp_path / "logs"), tmp_path=tmp_path,
                                  PYTHONPATH=python_path), timeout=patient(600))
    verdicts = sorted({line for line in out.splitlines() if line.startswith(("PASS ", "FAIL "))})
    trains = [line for line in verdicts if line.startswith(("FAIL train", "FAIL resume"))]
    assert code == 1, out + err
    assert len(trains) == 3 and all(line.endswith(": UserWarning: a stand-in for a warning of torch)") and
                                    "(a warning reached the user: " in line for line in trains), verdicts
    assert [line for line in verdicts if line not in trains] and \
        all(line.startswith("PASS sample.py") for line in verdicts if line not in trains), verdicts
