"""--wandb: a run logs to Weights & Biases beside TensorBoard, in offline mode here (nothing leaves the machine): the
same scalars at the same steps, the samples, and the final figures; without the wandb package --wandb is one line
before anything is written, and a run that does not ask never imports it. Skipped where wandb is not installed."""
import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT, module_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return module_corpus(tmp_path_factory, "wandb")


def quick(corpus, out, *extra):
    return ["--config", "debug", "--data", str(corpus), "--cache_dir", str(corpus.parent / "cache"), "--out_dir",
            str(out), "--max_iters", "10", "--eval_interval", "5", "--log_interval", "5", "--sample_chars", "20",
            *extra]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed (it is optional)")
def test_a_run_logs_to_wandb_what_it_logs_to_tensorboard(corpus, tmp_path, monkeypatch):
    import wandb
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import train
    from configs import load_config

    monkeypatch.setenv("WANDB_MODE", "offline")
    logged, started = {}, []
    real_init = wandb.init

    def init(**kwargs):  # the real run, offline, whose log() calls are also kept here
        run = real_init(**kwargs)
        started.append(kwargs)
        real_log = run.log

        def log(values, step=None, **rest):
            for tag, value in values.items():
                logged.setdefault(tag, {})[step] = value
            return real_log(values, step=step, **rest)
        monkeypatch.setattr(run, "log", log)
        return run

    monkeypatch.setattr(wandb, "init", init)
    out = tmp_path / "run"
    cfg, _, explicit = load_config(quick(corpus, out, "--wandb", "--wandb_project", "tests"), False)
    summary = train.train(cfg, explicit, say=lambda message: None)
    assert [(s["project"], s["name"], s["group"], s["config"]["max_iters"]) for s in started] == [
        ("tests", "run", "run", 10)]
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))  # wandb's own record, in the run folder
    events = EventAccumulator(str(out))
    events.Reload()
    for tag in ("loss/train", "loss/val", "loss/train_eval", "optim/lr", "perf/tokens_per_sec",
                "summary/full_val_loss"):
        assert {e.step: e.value for e in events.Scalars(tag)} == pytest.approx(logged[tag], rel=1e-6), tag
    assert logged["summary/full_val_loss"][10] == pytest.approx(summary["full_val_loss"])
    assert set(logged["samples"]) == {0, 5, 10} and all(isinstance(t, str) for t in logged["samples"].values())


@pytest.mark.slow
def test_wandb_asked_for_where_it_is_missing_is_one_line_and_never_imported_otherwise(corpus, tmp_path):
    """In a fresh interpreter where importing wandb fails: --wandb is refused before any folder is made, and a run
    without it never imports wandb."""
    program = ("import atexit, importlib.util, runpy, sys\n"
               "find = importlib.util.find_spec\n"  # the package is not found, as where it is not installed
               "importlib.util.find_spec = lambda name, *rest: None if name == 'wandb' else find(name, *rest)\n"
               "atexit.register(lambda: print('wandb imported' if 'wandb' in sys.modules else 'wandb not imported'))\n"
               f"sys.argv[0], sys.path[0] = {str(ROOT / 'train.py')!r}, {str(ROOT)!r}\n"
               "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    (tmp_path / "no_wandb.py").write_text(program)
    asked = subprocess.run([sys.executable, str(tmp_path / "no_wandb.py"), *quick(corpus, tmp_path / "asked",
                                                                                   "--wandb")],
                           capture_output=True, text=True, timeout=120)
    assert asked.returncode == 2 and asked.stderr.strip().splitlines() == [
        "error: --wandb: the wandb package is not installed. Install it (pip install wandb)"], \
        asked.stderr
    assert not (tmp_path / "asked").exists()
    plain = subprocess.run([sys.executable, str(tmp_path / "no_wandb.py"), *quick(corpus, tmp_path / "plain")],
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert plain.stdout.strip().endswith("wandb not imported")
