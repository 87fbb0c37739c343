"""Shared test helpers: the repository on sys.path, a made-up play as the corpus, the Tiny Shakespeare location (for the
few checks of its published figures, skipped without it), the README's commands, quiet debug runs, a watch on
host reads, one thread for every test, and bounds on waits that a busy machine does not break."""
import contextlib
import importlib
import io
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "scripts"))  # the scripts' main() functions, run in this process by run_script()
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The guide, then the reference pages it links to, in the order a reader following it would run their commands.
DOCS = ("docs/training.md", "docs/sampling.md", "docs/attention.md", "docs/speed.md", "docs/code.md")
PAGES = {"README.md": README, **{page: (ROOT / page).read_text(encoding="utf-8") for page in DOCS}}
# Their shell commands in order, one a line, comments cut off (read by their checks and their walk).
README_COMMANDS = [line.split("#")[0].strip() for text in PAGES.values()
                   for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)
                   for line in block.splitlines() if line.strip()]

torch.set_num_threads(1)  # small matrices: one thread is faster and repeatable on 2-core machines
# A suite started in the background of a shell (`python -m pytest &`) inherits Ctrl-C ignored, and so would every
# command it starts: the tests that press Ctrl-C would then fail. Ctrl-C is given back its usual meaning.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def one_thread():
    """Every test starts at one thread, whatever count a run or a script measured and set in this process before."""
    torch.set_num_threads(1)


def patient(seconds: float) -> float:
    """A bound on a wait (a subprocess, a line, a file) that a quiet machine meets in `seconds`: it only ends a hang,
    so it is four times that, and more on a machine busier than its cores (twice the 1-minute load average per
    core), where everything takes longer, so that a test does not fail there for want of time."""
    load_per_core = os.getloadavg()[0] / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 0.0
    return seconds * max(4.0, 2.0 * load_per_core)


SPEAKERS = ("First Citizen", "Second Citizen", "ROMEO", "JULIET", "MENENIUS", "KING HENRY", "QUEEN MARGARET", "All")
WORDS = ("the king queen shall speak of love and war before we proceed any further hear me you are all resolved rather "
         "to die than famish what light through yonder window breaks but soft i say my lord good night sweet prince "
         "come away be or not that is question thou art thy heart doth fair well now no yet so this gentle friends "
         "citizens hath said o").split()


def set_attention_path(model, path: str) -> None:
    """Every attention layer of a GPT on one path: "explicit" (q·kᵀ/√d, mask, softmax, weighted sum) or "sdpa"."""
    for block in model.blocks:
        block.attn.path = path


def num_val_windows(batches) -> int:
    """How many validation windows Batches.val_windows() yields on its rank (padding left out), counted anew."""
    n = len(batches.data["val"])
    return len(range(batches.rank * batches.block_size, n - batches.block_size,
                     batches.world_size * batches.block_size))


def play_text(n_chars: int, seed: int = 0) -> str:
    """n_chars of a made-up play, the same every time: speeches by named speakers, each of one to three lines from a
    stock of 80 (so a line's start tells its end: more context helps, as in real text), capitals and punctuation.
    The suite's corpus, so that it needs no file from outside the repository."""
    pick = random.Random(seed)
    stock = []
    for _ in range(80):
        line = " ".join(pick.choice(WORDS) for _ in range(pick.randint(4, 9)))
        stock.append(line[0].upper() + line[1:] + pick.choice(".,!?;:"))
    parts, size = [], 0
    while size < n_chars:
        lines = [pick.choice(stock) for _ in range(pick.randint(1, 3))]
        parts.append(f"{pick.choice(SPEAKERS)}:\n" + "\n".join(lines) + "\n\n")
        size += len(parts[-1])
    return "".join(parts)[:n_chars]


@pytest.fixture
def small_text() -> str:
    """20,000 characters of the made-up play."""
    return play_text(20000)


@pytest.fixture
def corpus(tmp_path, small_text):
    """small_text written to a file, with the cache folder beside it."""
    path = tmp_path / "corpus.txt"
    path.write_text(small_text, encoding="utf-8")
    return path


def module_corpus(tmp_path_factory, name: str) -> Path:
    """30,000 characters of the made-up play in a fresh folder, for the runs a test module shares."""
    tmp = tmp_path_factory.mktemp(name)
    (tmp / "corpus.txt").write_text(play_text(30000), encoding="utf-8")
    return tmp / "corpus.txt"


def train_debug(corpus: Path, out_dir: Path, *extra: str) -> dict:
    """A quiet run of the debug preset on corpus into out_dir (its token cache beside out_dir); its summary."""
    import train
    from configs import load_config

    cfg, _, explicit = load_config(["--config", "debug", "--data", str(corpus), "--cache_dir",
                                    str(out_dir.parent / "cache"), "--out_dir", str(out_dir), *extra], False)
    return train.train(cfg, explicit, say=lambda message: None)


def checkpoint_parts(path: Path) -> tuple[dict, dict]:
    """(tensors, settings) of a checkpoint file as stored, read with safetensors alone: for damaged copies."""
    import json
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, json.loads(f.metadata()["chargpt"])


def write_checkpoint(path: Path, tensors: dict, settings: dict) -> Path:
    """A checkpoint file of exactly these tensors and settings, however wrong they are."""
    import json
    from safetensors.torch import save
    path.write_bytes(save(tensors, metadata={"chargpt": json.dumps(settings)}))
    return path


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    """A script's main() through run_cli, as its command runs it, in this process (a new interpreter would spend
    seconds importing torch again): its exit code and what it printed."""
    from errors import run_cli

    main = importlib.import_module(name.removesuffix(".py")).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(main, list(args))
    return subprocess.CompletedProcess([name, *args], code, out.getvalue(), err.getvalue())


@pytest.fixture
def script():
    """script("plot_run.py", *args) -> run_script's CompletedProcess."""
    return run_script


@pytest.fixture
def host_reads(monkeypatch):
    """with host_reads() as reads: ... -> reads lists every value read from a tensor into Python (item, tolist,
    bool, int, float, numpy), which on a GPU is a wait for the device."""
    from torch.utils._python_dispatch import TorchDispatchMode

    @contextlib.contextmanager
    def watch():
        reads: list[str] = []

        class Scalars(TorchDispatchMode):  # item(), bool(), int(), float(): aten.item (inference mode) or below it
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default):
                    reads.append(str(func))
                return func(*args, **(kwargs or {}))

        with monkeypatch.context() as patch:
            for name in ("tolist", "numpy"):  # these read the memory directly on a CPU
                original = getattr(torch.Tensor, name)

                def read(self, *args, _name=name, _original=original, **kwargs):
                    reads.append(_name)
                    return _original(self, *args, **kwargs)
                patch.setattr(torch.Tensor, name, read)
            with Scalars():
                yield reads
    return watch
