"""Shared test helpers: the repository on sys.path, the shared corpus location, small models."""
import contextlib
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
sys.path.insert(0, str(ROOT))

torch.set_num_threads(1)  # small matrices: one thread is faster and repeatable on 2-core machines


@pytest.fixture
def small_text() -> str:
    """A few kilobytes of real text (Tiny Shakespeare when present, else a generated stand-in)."""
    if SHARED_TEXT.exists():
        return SHARED_TEXT.read_text(encoding="utf-8")[:20000]
    words = ["the", "king", "queen", "shall", "speak", "of", "love", "and", "war", "ROMEO:", "JULIET:"]
    gen = torch.Generator().manual_seed(0)
    picks = torch.randint(0, len(words), (4000,), generator=gen).tolist()
    return " ".join(words[i] + ("\n" if i % 7 == 0 else "") for i in picks)


@pytest.fixture
def corpus(tmp_path, small_text):
    """small_text written to a file, with the cache folder beside it."""
    path = tmp_path / "corpus.txt"
    path.write_text(small_text, encoding="utf-8")
    return path


def module_corpus(tmp_path_factory, name: str) -> Path:
    """30,000 characters of real text (or a stand-in) in a fresh folder, for the runs a test module shares."""
    tmp = tmp_path_factory.mktemp(name)
    text = SHARED_TEXT.read_text(encoding="utf-8")[:30000] if SHARED_TEXT.exists() else "to be or not to be\n" * 1500
    (tmp / "corpus.txt").write_text(text, encoding="utf-8")
    return tmp / "corpus.txt"


def train_debug(corpus: Path, out_dir: Path, *extra: str) -> dict:
    """A quiet run of the debug preset on corpus into out_dir (its token cache beside out_dir); its summary."""
    import train
    from configs import load_config

    cfg, _, explicit = load_config(["--config", "debug", "--data", str(corpus), "--cache_dir",
                                    str(out_dir.parent / "cache"), "--out_dir", str(out_dir), *extra], False)
    return train.train(cfg, explicit, say=lambda message: None)


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
