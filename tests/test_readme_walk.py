"""The README from top to bottom, as a newcomer runs it: every command in order, in a fresh copy of the repository
with an empty cache, shortened where it trains; none may fail, print a traceback, or refuse what came before it."""
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import README_COMMANDS, ROOT, SHARED_TEXT, patient

# What each kind of command gets appended (or replaced) to run in seconds; the order and the rest are the README's.
SHORT_TRAINING = ["--max_iters", "4", "--eval_interval", "4", "--eval_iters", "2"]
SMALL_MODEL = ["--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--batch_size", "4"]
SKIPPED = {
    "pip install -r requirements.txt": "CI installs it into a fresh virtual environment before the suite",
    "python -m pytest": "this is the suite",
    "torchrun": "needs GPUs; tests/test_distributed.py runs torchrun on the CPU",
}


def shortened(words: list[str]) -> list[str]:
    script = next(w for w in words if w.endswith(".py"))
    if script == "train.py" and "--help" not in words:
        extra = SHORT_TRAINING + (SMALL_MODEL if "shakespeare_char" in words else [])
        if "--resume" in words:
            extra = ["--max_iters", "6"]  # the README's resume continues the finished quick start further
        return words + extra
    if script == "scripts/bench.py":
        extra = ["--iters", "2", "--warmup", "1"] + (["--rounds", "1", "--n_layer", "1"] if "--compare" in words
                                                    else ["--sample_tokens", "20", "--prepare_mb", "1"])
        return words + extra
    if script == "scripts/bench_run.py":  # (two threads beside a busy core: no full validation, which takes a minute)
        return words + SHORT_TRAINING + SMALL_MODEL + (["--full_val", "false"] if "--busy" in words else [])
    if script == "scripts/bench_sample.py":
        return words + ["--new_tokens", "20", "--n_layer", "2", "--n_head", "2", "--n_embd", "64"]
    if script == "scripts/ladder.py":
        return words + ["--max_iters", "2", "--rungs", "bigram,default"]
    if script == "scripts/bench_page.py":
        return words + ["--passes", "2"]
    if script == "scripts/bench_prepare.py":
        return words[:words.index("--mb")] + ["--mb", "2"]
    return words


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensorboard_runs(words: list[str], repo, env) -> str:
    """Start TensorBoard as the README says (on a free local port) and read its run list."""
    port = free_port()
    server = subprocess.Popen(words + ["--host", "127.0.0.1", "--port", str(port)], cwd=repo, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + patient(60)
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as response:
                    return response.read().decode()
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError(f"tensorboard did not start: {server.stderr.read() if server.poll() else ''}")
                time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(timeout=patient(30))


pytestmark = pytest.mark.readme_walk  # about a minute: .ci/run runs it on its own (see pytest.ini)


@pytest.fixture
def fresh_clone(tmp_path):
    """The repository's files (committed or not, but not ignored) in a new git repository, plus a user's texts."""
    repo = tmp_path / "chargpt"
    # Which files: git's answer in a checkout; in a plain copy, that of an empty repository over the copy's files,
    # which reads the same .gitignore
    where = [] if (ROOT / ".git").exists() else ["--git-dir", str(tmp_path / "lister"), "--work-tree", str(ROOT)]
    if where:
        subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "lister")], check=True)
    listed = subprocess.run(["git", *where, "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    text = SHARED_TEXT.read_text(encoding="utf-8")[:40000] if SHARED_TEXT.exists() else "to be or not to be\n" * 2000
    (repo / "my_corpus.txt").write_text(text, encoding="utf-8")
    (repo / "my_notes").mkdir()
    (repo / "my_notes" / "a.txt").write_text(text[:20000], encoding="utf-8")
    (repo / "my_notes" / "b.md").write_text(text[20000:], encoding="utf-8")
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *command], cwd=repo, check=True)
    return repo


def test_the_readme_runs_in_order_from_a_fresh_clone(fresh_clone, tmp_path):
    repo = fresh_clone
    # The README's figures and folder names are a CPU's (with CUDA the default preset is another): the walk is a
    # CPU user's on any machine.
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""}
    if SHARED_TEXT.exists():  # the download, served from the shared copy (same bytes, so the checksum holds)
        env["CHARGPT_SHAKESPEARE_URL"] = SHARED_TEXT.as_uri()
        corpus = "shakespeare"
    else:  # offline: the README says the quick start trains on pystdlib and where its folder is
        env["CHARGPT_SHAKESPEARE_URL"] = "http://127.0.0.1:9/unreachable"
        corpus = "pystdlib"
    commands = [c for c in README_COMMANDS if c]
    ran = []
    for command in commands:
        if any(command.startswith(prefix) for prefix in SKIPPED):
            continue
        if "bench_page.py" in command and not (shutil.which("chromium") or shutil.which("chromium-browser")):
            continue  # it runs the page in Chromium, and says so in one line where there is none
        command = command.replace("shakespeare_char_cpu-shakespeare", f"shakespeare_char_cpu-{corpus}")
        words = shlex.split(command)
        if corpus == "pystdlib":  # offline, a --data shakespeare typed in a command is refused, as the README says,
            # and so is a benchmark's default, and a preset's named with --config (shakespeare: only a train.py that
            # names no corpus falls back, saying so)
            command = command.replace('"ROMEO:', '"def ').replace("--data shakespeare", "--data pystdlib")
            words = shlex.split(command)
            if (words[1] in ("scripts/bench.py", "scripts/bench_run.py") or "--config" in words) \
                    and "--data" not in words:
                words += ["--data", "pystdlib"]
        if words[0] == "tensorboard":
            runs = tensorboard_runs(words, repo, env)
            assert runs.count(f"shakespeare_char_cpu-{corpus}") == 1, runs  # one entry per run
            ran.append(command)
            continue
        assert words[0] == "python", command
        done = subprocess.run([sys.executable, *shortened(words)[1:]], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=patient(300))
        said = done.stdout + done.stderr
        assert done.returncode == 0, f"{command}\n{said[-3000:]}"
        assert "Traceback" not in said and "already holds" not in said and "warning" not in said.lower(), \
            f"{command}\n{said[-3000:]}"
        ran.append(command)
    assert len(ran) >= 14, ran
    assert (repo / "attention.png").stat().st_size > 0 and (repo / "curves.png").stat().st_size > 0
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True)
    assert status.stdout == "", f"the README's commands left files git would add:\n{status.stdout}"
    for folder in (f"shakespeare_char_cpu-{corpus}", "shakespeare_char_cpu-my_corpus", "shakespeare_char_cpu-my_notes",
                   f"shakespeare_char-{corpus}"):
        assert (repo / "out" / folder / "summary.json").is_file(), folder


def test_the_first_screen_runs_as_written_without_a_network(fresh_clone, tmp_path):
    """The README's first code block, copied as written on a machine that cannot reach Tiny Shakespeare: training
    falls back to pystdlib (shortened here, its only change), and the sample command, exactly as written, writes text
    from that run."""
    first_block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    commands = [line.strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands[0] == "pip install -r requirements.txt" and len(commands) == 3, commands
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": "",
           "CHARGPT_SHAKESPEARE_URL": "http://127.0.0.1:9/unreachable"}
    said = []
    for command in commands[1:]:
        words = shlex.split(command)
        if words[1] == "train.py":
            words += SHORT_TRAINING + SMALL_MODEL
        done = subprocess.run([sys.executable, *words[1:]], cwd=fresh_clone, env=env, capture_output=True, text=True,
                              timeout=patient(300))
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{command}\n{done.stderr[-3000:]}"
        said.append(done.stdout + done.stderr)
    assert "using the offline corpus 'pystdlib'" in said[0]
    assert (fresh_clone / "out" / "shakespeare_char_cpu-pystdlib" / "ckpt_best.safetensors").is_file()
    assert "shakespeare_char_cpu-pystdlib" in said[1] and said[1].count("ROMEO:") >= 1
