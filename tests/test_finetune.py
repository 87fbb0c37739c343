"""train.py --init_from: a new run from a trained model's weights on new text, the vocabulary grown so that old ids
keep their meaning; better than the same steps from scratch; resumable; conflicting shapes refused in one line."""
import pytest
import torch

from conftest import play_text, train_debug
from configs import load_config
from errors import UserError
from model.generate import generate
from training import checkpoint


def texts():
    text = play_text(230000)
    first = text[:40000]
    second = text[200000:230000].replace("e", "é").replace("th", "þ") + "\n{Zürich ~ Ærø}\n"  # new characters
    return first, second


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finetune")
    first, second = texts()
    (tmp / "first.txt").write_text(first, encoding="utf-8")
    (tmp / "second.txt").write_text(second, encoding="utf-8")
    run(tmp, "first.txt", "base", "--max_iters", "150")
    return tmp


def run(tmp, data, out, *extra):
    return train_debug(tmp / data, tmp / out, "--eval_interval", "10", *extra)


def test_fine_tuning_keeps_the_old_ids_and_beats_the_same_steps_from_scratch(base):
    old = checkpoint.load(base / "base" / "ckpt_best.safetensors")
    tuned = run(base, "second.txt", "tuned", "--init_from", str(base / "base"), "--max_iters", "30")
    scratch = run(base, "second.txt", "scratch", "--max_iters", "30")
    assert tuned["full_val_loss"] < scratch["full_val_loss"] - 0.1, (tuned["full_val_loss"], scratch["full_val_loss"])
    new = checkpoint.load(base / "tuned" / "ckpt_last.safetensors")
    added = set("éþ{}~ÆøüZ") - set(old["vocab"])
    assert new["vocab"].startswith(old["vocab"]) and added <= set(new["vocab"][len(old["vocab"]):])
    assert new["run_config"]["init_from"] == str(base / "base") and new["iter"] == 30  # a new run from step 0
    model, tokenizer, _ = checkpoint.load_model(base / "tuned" / "ckpt_last.safetensors")
    prompt = tokenizer.encode("ROMEO: Zürich þé")  # old and new characters together
    out = generate(model, [prompt], 40, generator=torch.Generator().manual_seed(0))
    assert len(out[0]) == 40


def test_the_trained_rows_are_copied_and_new_rows_start_as_their_mean(base):
    from common.machine import setup
    from data import prepare, resolve
    from training.opening import build_run
    old = checkpoint.load(base / "base" / "ckpt_best.safetensors")
    cfg, _, _ = load_config(["--config", "debug", "--data", str(base / "second.txt"), "--out_dir", str(base / "x")],
                            False)
    prepared = prepare(resolve(cfg.data, base / "cache"), base / "cache", base_vocab=old["vocab"])
    run_, _ = build_run(cfg, setup("cpu", "float32"), prepared, init=old)
    rows = run_.model.wte.weight.detach()
    n = len(old["vocab"])
    assert torch.equal(rows[:n], old["model"]["wte.weight"])
    assert torch.allclose(rows[n:], old["model"]["wte.weight"].mean(0).expand(rows.size(0) - n, -1))
    assert prepared.tokenizer.chars[:n] == old["vocab"]


def test_a_fine_tuned_run_resumes_exactly(base):
    schedule = ["--lr_decay_iters", "20"]  # the same learning-rate schedule for the run stopped at 10
    straight = run(base, "second.txt", "straight", "--init_from", str(base / "base"), "--max_iters", "20", *schedule)
    run(base, "second.txt", "halves", "--init_from", str(base / "base"), "--max_iters", "10", *schedule)
    resumed = run(base, "second.txt", "halves", "--resume", "--max_iters", "20")
    assert resumed["full_val_loss"] == straight["full_val_loss"]
    assert [loss for _, loss in resumed["history"]] == [loss for step, loss in straight["history"] if step > 10]


@pytest.mark.parametrize("extra, words", [
    (["--n_layer", "3"], "n_layer 3 does not fit the model in"),
    (["--init_from", "/nowhere/run"], "/nowhere/run"),
])
def test_conflicts_and_missing_models_are_one_line(base, extra, words):
    argv = ["--init_from", str(base / "base"), *extra] if extra[0] != "--init_from" else extra
    with pytest.raises(UserError, match=words):
        run(base, "second.txt", "refused", *argv, "--max_iters", "5")


def test_a_text_too_short_for_the_models_windows_names_what_fine_tuning_can_change(base):
    """Fine-tuning keeps the model's block_size, so a text too short for its windows is refused with what such a run
    can change (a longer text; a --val_fraction, where one fits both splits; a new run without --init_from, with a
    block_size that fits), never a smaller --block_size, which it would refuse."""
    for n_chars, val_fraction in ((100, " or a larger --val_fraction"), (40, "")):  # 66 give 33 to each split at 0.5
        short = base / f"short{n_chars}.txt"
        short.write_text(texts()[1][:n_chars], encoding="utf-8")
        with pytest.raises(UserError) as refused:
            run(base, short.name, "refused", "--init_from", str(base / "base"), "--max_iters", "5")
        n_val = n_chars - int(n_chars * 0.9)
        assert str(refused.value) == (f"--init_from: the val split of {short} has {n_val} characters, fewer than "
                                      f"block_size + 1 = 33, and fine-tuning keeps the model's block_size (32); give a "
                                      f"longer text{val_fraction}, or train a new run on this text with --block_size "
                                      f"{n_val - 1} or less without --init_from")


def test_fine_tuning_starts_from_the_base_runs_settings_and_says_so(base):
    """Without --config a command takes the default (CPU) preset: Muon at 0.015, bfloat16 where the CPU has the units.
    A fine-tuning run takes the settings of the run it starts from instead (the debug preset's AdamW at 0.003 in
    float32), with what its command line sets over them: a learning rate, which its min_lr follows at the base run's
    ratio."""
    import train
    said = []
    cfg, note, explicit = load_config(["--init_from", str(base / "base"), "--data", str(base / "second.txt"),
                                       "--cache_dir", str(base / "cache"), "--out_dir", str(base / "settings"),
                                       "--max_iters", "2", "--learning_rate", "1e-3"], False)
    assert cfg.optimizer == "muon"  # the default preset's, before the base run is read
    train.train(cfg, explicit, say=said.append, note=note)
    saved = checkpoint.load(base / "settings" / "ckpt_last.safetensors")["run_config"]
    old = checkpoint.load(base / "base" / "ckpt_last.safetensors")["run_config"]
    assert old["optimizer"] == "adamw" and old["learning_rate"] == 3e-3 and old["dtype"] == "float32"
    inherited = ("optimizer", "dtype", "batch_size", "eval_interval", "warmup_iters", "sample_chars", "compile")
    assert {name: saved[name] for name in inherited} == {name: old[name] for name in inherited}
    assert saved["learning_rate"] == 1e-3 and saved["min_lr"] == pytest.approx(1e-3 * old["min_lr"] / 3e-3)
    assert saved["max_iters"] == 2 and saved["data"] == str(base / "second.txt")
    assert said[0] == f"config: the settings of the run {base / 'base'} starts from, with what this command line sets"
    assert any(line.startswith(f"fine-tuning {base / 'base' / 'ckpt_best.safetensors'} (step ") and
               "with its settings (optimizer adamw, learning_rate 0.001, dtype float32, max_iters 2)" in line
               for line in said), said
