"""A run ends on the model it reports: its best checkpoint, fully validated, named in the done line and summary.json,
used by the scripts; --patience stops a run that no longer improves, and resuming it has nothing left to do."""
import json
import shlex

import pytest
import torch
import torch.nn.functional as F

from conftest import train_debug
from common.run_folder import find
from errors import run_cli
from training import checkpoint
from training.checkpoint import load_model


@pytest.fixture
def overfitting_corpus(tmp_path):
    """Training text that alternates a and b strictly; validation text that doubles them (aabb...). The model first
    learns that a and b are common (validation improves), then that they alternate (validation gets worse)."""
    train = ("ab" * 20 + "xy") * 60
    path = tmp_path / "corpus.txt"
    path.write_text(train + "aabb" * (len(train) // 36), encoding="utf-8")  # 90% / 10%
    return path


def full_validation(ckpt, text: str) -> float:
    """The mean cross-entropy over every non-overlapping block_size window of the last 10% of text, by hand."""
    model, tokenizer, _ = load_model(ckpt)
    val = torch.tensor(tokenizer.encode(text[int(len(text) * 0.9):]))
    T = model.config.block_size
    starts = range(0, len(val) - T, T)
    x = torch.stack([val[s:s + T] for s in starts])
    y = torch.stack([val[s + 1:s + T + 1] for s in starts])
    with torch.no_grad():
        logits, _ = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()


def test_an_overfit_run_hands_over_its_best_model_and_says_which(overfitting_corpus, tmp_path):
    said = []
    out = tmp_path / "run"
    import train
    from configs import load_config
    cfg, _, explicit = load_config(["--config", "debug", "--data", str(overfitting_corpus), "--cache_dir",
                                    str(tmp_path / "cache"), "--out_dir", str(out), "--max_iters", "40",
                                    "--eval_interval", "5", "--patience", "0"], False)
    summary = train.train(cfg, explicit, say=said.append)
    best, last = checkpoint.load(out / "ckpt_best.safetensors"), checkpoint.load(out / "ckpt_last.safetensors")
    assert summary["iterations"] == last["iter"] == 40 and not summary["stopped_early"]
    assert summary["model_step"] == best["iter"] < 40 and summary["model_checkpoint"] == "ckpt_best.safetensors"
    assert summary["best_val_loss"] == best["best_val_loss"] < summary["val_loss"]  # the last step measured worse
    text = overfitting_corpus.read_text(encoding="utf-8")
    by_hand = {name: full_validation(out / name, text) for name in ("ckpt_best.safetensors", "ckpt_last.safetensors")}
    assert summary["full_val_loss"] == pytest.approx(by_hand["ckpt_best.safetensors"], rel=1e-5)
    assert by_hand["ckpt_best.safetensors"] < by_hand["ckpt_last.safetensors"]  # the two models differ, and the better one is handed over
    assert find(str(out), "") == out / "ckpt_best.safetensors"  # what sample.py, evaluate.py and the pictures read
    line = next(line for line in said if line.startswith("the run's model:"))
    assert f"step {best['iter']}, its best (ckpt_best.safetensors)" in line and f"{summary['full_val_loss']:.4f}" in line
    assert f"the last step's val {summary['val_loss']:.4f}" in line
    assert json.loads((out / "summary.json").read_text())["model_step"] == best["iter"]
    early = [line for line in said if line.startswith("note: the model is from early")]
    assert early == ([f"note: the model is from early in the run (step {best['iter']} of 40): later steps learned the "
                      f"text by heart; try --dropout 0.2 or --n_embd 16"] if best["iter"] < 40 / 3 else [])


def test_sample_prints_each_checkpoints_own_step_and_validation_loss(overfitting_corpus, tmp_path, script):
    """sample.py's first line gives the checkpoint's own step and the validation loss measured at that step (the
    run's evaluations, as its loss history records them), for the best and the last model alike."""
    out = tmp_path / "run"
    train_debug(overfitting_corpus, out, "--max_iters", "40", "--eval_interval", "5", "--patience", "0")
    history = {step: val for step, _, val in checkpoint.load(out / "ckpt_last.safetensors")["losses"]["eval"]}
    for name in ("ckpt_best.safetensors", "ckpt_last.safetensors"):
        step = checkpoint.load(out / name)["iter"]
        said = script("sample.py", "--ckpt", str(out / name), "--max_new_tokens", "1", "--num_threads", "1").stderr
        assert said.startswith(f"{out / name}: step {step}, validation loss {history[step]:.4f}, trained on "), said
    assert history[40] != min(history.values())  # the last model's figure is not the best's


def test_a_checkpoint_saved_between_evaluations_says_no_loss_was_measured_there():
    """A checkpoint whose step had no evaluation (a stop between them) gives no other step's loss as its own."""
    import sample
    assert sample.own_loss({"eval_done": False, "last_eval": {"train": 1.0, "val": 2.0}}) == \
        ", no validation loss measured at this step"
    assert sample.own_loss({"eval_done": True, "last_eval": {"train": 1.0, "val": 2.0}}) == ", validation loss 2.0000"


def folder_bytes(folder):
    """Every file but the lock (which names its latest owner)."""
    return {p.name: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_patience_stops_the_run_and_resuming_it_has_nothing_to_do(overfitting_corpus, tmp_path):
    out = tmp_path / "run"
    summary = train_debug(overfitting_corpus, out, "--max_iters", "200", "--eval_interval", "5", "--patience", "3")
    assert summary["stopped_early"] and summary["iterations"] == summary["model_step"] + 3 * 5 < 200
    assert checkpoint.load(out / "ckpt_last.safetensors")["iter"] == summary["iterations"]
    before = folder_bytes(out)
    assert train_debug(overfitting_corpus, out, "--resume") == {"finished": True}
    assert folder_bytes(out) == before  # nothing touched
    more = train_debug(overfitting_corpus, out, "--resume", "--patience", "0", "--max_iters",
                       str(summary["iterations"] + 5))
    assert more["iterations"] == summary["iterations"] + 5 and not more["stopped_early"]


def test_a_damaged_best_checkpoint_hands_over_the_last_model_and_says_so(overfitting_corpus, tmp_path):
    out = tmp_path / "run"
    train_debug(overfitting_corpus, out, "--max_iters", "30", "--eval_interval", "5", "--patience", "0")
    damaged = (out / "ckpt_best.safetensors").read_bytes()[:1000]  # cut short
    (out / "ckpt_best.safetensors").write_bytes(damaged)
    said = []
    import train
    from configs import load_config
    cfg, _, explicit = load_config(["--out_dir", str(out), "--resume", "--max_iters", "40"], False)
    summary = train.train(cfg, explicit, say=said.append)  # validation only rises from here: no new best
    assert summary["model_checkpoint"] == "ckpt_last.safetensors" and summary["model_step"] == summary["iterations"] == 40
    text = overfitting_corpus.read_text(encoding="utf-8")
    assert summary["full_val_loss"] == pytest.approx(full_validation(out / "ckpt_last.safetensors", text), rel=1e-5)
    assert any(line.startswith("warning: ") and "ckpt_best.safetensors is not a readable checkpoint" in line for line in said)
    line = next(line for line in said if line.startswith("the run's model:"))
    assert f"its last (ckpt_last.safetensors; no readable ckpt_best.safetensors): val {summary['val_loss']:.4f}" in line
    assert (out / "ckpt_best.safetensors").read_bytes() == damaged  # the user's file is left as it was
    # the command the run suggests reads the model it handed over, not the damaged file --out_dir would pick
    words = shlex.split(next(line for line in said if line.startswith("sample it: ")).removeprefix("sample it: "))
    args = words[next(i for i, word in enumerate(words) if word.endswith("sample.py")) + 1:]
    assert args == ["--ckpt", str(out / "ckpt_last.safetensors")]
    import sample
    assert run_cli(sample.main, [*args, "--max_new_tokens", "5", "--num_threads", "1"]) == 0


def test_a_model_from_the_first_third_of_the_run_is_said_to_be_early_with_what_to_try():
    """The last lines say when the model handed over is from the run's first third, with flags that fit the run."""
    from configs import load_config
    from training.report import done_lines
    summary = {"iterations": 300, "model_step": 30, "train_seconds": 1.0, "stopped_early": False, "val_loss": 7.2186,
               "full_val_loss": 5.46, "full_val_bits_per_char": 7.877, "model_checkpoint": "ckpt_best.safetensors",
               "best_val_loss": 5.4599}
    cfg = load_config([], False)[0]
    assert done_lines(summary, cfg, 9)[-1] == ("note: the model is from early in the run (step 30 of 300): later steps "
                                               "learned the text by heart; try --dropout 0.2 or --n_embd 80")
    fitted = load_config(["--dropout", "0.3", "--n_embd", "96"], False)[0]
    assert done_lines(summary, fitted, 9)[-1].endswith("try --dropout 0.4 or --n_embd 48")
    assert not done_lines({**summary, "model_step": 100}, cfg, 7)[-1].startswith("note:")  # a third in: not early
