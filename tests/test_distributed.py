"""Data-parallel training: torchrun with 2 CPU processes (gloo) matches one process on the same global batch."""
import json
import re
import subprocess
import sys

import pytest
import torch

import train
from conftest import ROOT, module_corpus, patient
from errors import run_cli
from training import checkpoint

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return module_corpus(tmp_path_factory, "ddp")


def debug_args(corpus, out_dir, *extra, dropout="0") -> list[str]:
    return ["--config", "debug", "--data", str(corpus), "--cache_dir", str(corpus.parent / "cache"),
            "--out_dir", str(out_dir), "--dropout", dropout, "--eval_interval", "4", "--log_interval", "1", *extra]


def launch(corpus, out_dir, *extra, processes=2, program=ROOT / "train.py", torchrun=None, dropout="0"):
    """train.py on the debug preset: under torchrun with `processes` processes (by default where there are 2 or more),
    else a plain `python train.py`."""
    args = debug_args(corpus, out_dir, *extra, dropout=dropout)
    if not (processes > 1 if torchrun is None else torchrun):
        command = [sys.executable, str(program), *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                   str(program), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=patient(180), cwd=ROOT)


def here(capsys, *args: str) -> subprocess.CompletedProcess:
    """train.py's main() through run_cli in this process, one process without torchrun (a new interpreter would spend
    seconds importing torch again): its exit code and what it printed, as launch() gives them."""
    capsys.readouterr()
    code = run_cli(train.main, list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["train.py", *args], code, out, err)


# 81 validation windows of 32: 41 for rank 0, 40 for rank 1, so 11 and 10 batches of 4. Unless rank 1 reads a padded
# 11th batch, rank 0's 11th batch meets rank 1's final sum in a collective of another size, and gloo ends the job.
UNEVEN_SPLIT = ("--val_fraction", "0.087")


def logged_losses(output: str) -> dict[str, list[float]]:
    """The losses a run's log lines print: each step's training loss, and each evaluation's two estimates."""
    steps = [float(re.search(r"loss ([\d.]+)", line)[1]) for line in output.splitlines()
             if re.match(r"step \d+/\d+: loss", line)]
    evaluations = [float(x) for line in output.splitlines() if ": evaluation: " in line
                   for x in re.findall(r"loss ([\d.]+)", line)]
    return {"steps": steps, "evaluations": evaluations}


def test_two_processes_match_one_with_the_same_global_batch(corpus, tmp_path, capsys):
    """2 processes x 4 sequences x 2 accumulation steps against 1 process x 4 x 4: the same windows, so the same
    weights; the logged training loss is the whole global batch's (the mean over the ranks, not rank 0's half); and
    the evaluations read the same 3 x 4 windows of each split whatever the number of processes and accumulation
    steps (under DDP 6 a rank, in batches of 4, the last padded), so their figures are the same too. Then the
    two-process run resumes with one process, keeping its tokens per step."""
    common = ("--max_iters", "8", "--batch_size", "4", "--eval_iters", "3", *UNEVEN_SPLIT)
    ddp = launch(corpus, tmp_path / "ddp", *common, "--grad_accum_steps", "2")
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    assert "global batch: 4 sequences x 2 accumulation steps x 2 processes = 512 tokens per step" in ddp.stdout
    single = here(capsys, *debug_args(corpus, tmp_path / "one", *common, "--grad_accum_steps", "4"))
    assert single.returncode == 0, single.stderr[-2000:]
    a = checkpoint.load(tmp_path / "ddp" / "ckpt_last.safetensors")["model"]
    b = checkpoint.load(tmp_path / "one" / "ckpt_last.safetensors")["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-5)
    ddp_losses, single_losses = logged_losses(ddp.stdout), logged_losses(single.stdout)
    assert len(ddp_losses["steps"]) == 8 and len(ddp_losses["evaluations"]) == 2 * 3  # steps 0, 4 and 8
    for kind in ("steps", "evaluations"):  # printed to 4 decimals
        assert ddp_losses[kind] == pytest.approx(single_losses[kind], abs=2e-4), kind
    # exactly one set of outputs, written by rank 0
    assert len(list((tmp_path / "ddp").glob("events.out.tfevents.*"))) == 1
    assert ddp.stdout.count("done: 8 steps") == 1
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["tokens_seen"] == 8 * 512
    single_summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    for figure in ("full_val_loss", "best_val_loss", "train_loss"):
        assert summary[figure] == pytest.approx(single_summary[figure], rel=1e-5), figure
    state = checkpoint.load(tmp_path / "ddp" / "ckpt_last.safetensors")
    assert state["best_val_loss"] < 3.9  # the loss fell from about ln(vocab) = 4.06

    # resume the two-process run with one process
    resumed = here(capsys, "--out_dir", str(tmp_path / "ddp"), "--resume", "--max_iters", "10")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert checkpoint.load(tmp_path / "ddp" / "ckpt_last.safetensors")["iter"] == 10
    # the same tokens per step with one process: the accumulation steps took up the difference, said in one line
    assert "resume: 1 process now, so grad_accum_steps 2 -> 4, keeping 512 tokens per step" in \
        resumed.stdout
    assert "global batch: 4 sequences x 4 accumulation steps x 1 process = 512 tokens per step" in resumed.stdout
    assert "FutureWarning" not in ddp.stderr  # DDP's buffer switch under its current name


def test_an_error_ends_the_whole_job_with_its_message(tmp_path):
    # rank 0 comes to the mistake 2 s after rank 1 (on a GPU machine starting the driver can do that): still its line
    late = tmp_path / "rank_0_late.py"
    late.write_text(f"import os, runpy, sys, time\nif os.environ['RANK'] == '0':\n    time.sleep(2)\n"
                    f"sys.argv[0], sys.path[0] = {str(ROOT / 'train.py')!r}, {str(ROOT)!r}\n"
                    f"runpy.run_path(sys.argv[0], run_name='__main__')\n")
    result = launch(tmp_path / "missing.txt", tmp_path / "run", "--max_iters", "4", program=late)
    assert result.returncode != 0
    assert "no such file or folder" in result.stderr
    # one line from rank 0, before anything of torchrun's own report, and no rank's traceback or broken connection
    ours = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "no such file or folder" in ours[0]
    assert "Traceback" not in result.stderr.split(ours[0])[0]  # nothing of anyone's before it
    assert "Connection closed" not in result.stderr and "gloo" not in result.stderr.lower()
    assert "exitcode  : 2" in result.stderr  # rank 0 ended with the user-error code (torchrun may stop rank 1 first)
    assert "stopped" not in result.stderr  # rank 1, ended by torchrun, says nothing


def step_lines(output: str) -> list[str]:
    """The log's step lines without their timings: 'step 3/8: loss 3.9452'."""
    return [line.split(",")[0] for line in output.splitlines() if line.startswith("step ")]


def test_ddp_always_builds_the_process_group_for_one_process_and_trains_as_a_plain_run(corpus, tmp_path, capsys):
    """--ddp always under torchrun with one process: the process group (gloo on a CPU) and the DDP wrapper are built,
    the run says so, and its losses, weights and dropout equal a plain run's bit for bit (one rank's reduction is
    the gradient itself). Without torchrun it is one line, exit 2."""
    common = ("--max_iters", "6", "--grad_accum_steps", "2")
    ddp = launch(corpus, tmp_path / "ddp", *common, "--ddp", "always", processes=1, torchrun=True, dropout="0.1")
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    assert "x 1 process = 512 tokens per step; DDP over gloo" in ddp.stdout
    plain = here(capsys, *debug_args(corpus, tmp_path / "plain", *common, dropout="0.1"))
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "DDP over" not in plain.stdout
    assert step_lines(ddp.stdout) == step_lines(plain.stdout) and len(step_lines(plain.stdout)) == 6 + 3
    a = checkpoint.load(tmp_path / "ddp" / "ckpt_last.safetensors")["model"]
    b = checkpoint.load(tmp_path / "plain" / "ckpt_last.safetensors")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    alone = launch(corpus, tmp_path / "alone", *common, "--ddp", "always", processes=1)
    assert alone.returncode == 2 and alone.stderr.strip().splitlines() == [
        "error: --ddp always: needs torchrun. Run torchrun --standalone --nproc_per_node 1 train.py ..."]


# train.py with every torch.compile through a stand-in backend: dynamo's capture, AOTAutograd, eager kernels, and a
# backward compiler that fails on the ranks FAIL_RANKS names, as inductor failing on the backward graph does: at the
# first .backward(), after DDP's hooks have fired for the parameters whose gradients came first.
BACKWARD_FAILS = """import os, runpy, sys
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd


def forward(graph, inputs):
    return make_boxed_func(graph.forward)


def backward(graph, inputs):
    if os.environ["RANK"] in os.environ["FAIL_RANKS"].split(","):
        raise RuntimeError("inductor exploded in the backward (stand-in)")
    return make_boxed_func(graph.forward)


real_compile = torch.compile
torch.compile = lambda module, **kwargs: real_compile(module, backend=aot_autograd(fw_compiler=forward,
                                                                                  bw_compiler=backward))
sys.argv[0], sys.path[0] = {train!r}, {root!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_backward_that_fails_to_compile_under_ddp_falls_back_on_every_rank(corpus, tmp_path, monkeypatch, capsys):
    """Compiled by blocks under DDP at grad_accum_steps 1, the backward's compilation fails at the first step on rank 1
    alone: both ranks turn compilation off (rank 0, whose own compilation worked, warns once, naming rank 1) and
    compute the step again, and the run trains on to its end with the weights of an uncompiled run (a reduction that
    DDP's hooks began and never finished would make its next forward refuse to start: 'Expected to have finished
    reduction in the prior iteration'). The rank that failed and the rank that learns of it are both on this path, so
    failing on both ranks is not run too (a second torchrun job of compiling, 15 s)."""
    program = tmp_path / "backward_fails.py"
    program.write_text(BACKWARD_FAILS.format(train=str(ROOT / "train.py"), root=str(ROOT)))
    common = ("--max_iters", "4", "--full_val", "false")
    # The uncompiled reference in one process with 2 accumulation steps: the same global batch, and the same weights
    # bit for bit (each micro-batch's gradient halved and summed is the two ranks' gradients summed and halved: a
    # halving is exact), without a second torchrun job.
    plain = here(capsys, *debug_args(corpus, tmp_path / "plain", *common, "--grad_accum_steps", "2"))
    assert plain.returncode == 0, plain.stderr[-2000:]
    monkeypatch.setenv("FAIL_RANKS", "1")
    out = tmp_path / "fails"
    run = launch(corpus, out, *common, "--compile", "true", "--compile_scope", "blocks", program=program)
    assert run.returncode == 0, run.stderr[-3000:]
    warnings = [line for line in run.stdout.splitlines() if line.startswith("warning: torch.compile failed")]
    assert warnings == ["warning: torch.compile failed (rank 1: RuntimeError: inductor exploded in the backward "
                        "(stand-in)); continuing without it (--compile false skips the attempt)"]
    assert run.stdout.count("done: 4 steps") == 1 and step_lines(run.stdout) == step_lines(plain.stdout)
    a = checkpoint.load(out / "ckpt_last.safetensors")["model"]
    b = checkpoint.load(tmp_path / "plain" / "ckpt_last.safetensors")["model"]
    assert all(torch.equal(a[name], b[name]) for name in b)
