"""configs/fit.py: the default run fitted to its text's size and alphabet, said in one line; what the user sets wins."""
import train
from configs import load_config
from configs.fit import chosen, fit, fitted_line
from training import checkpoint

SMALL_TEXT = {"n_embd": 96, "n_layer": 3, "dropout": 0.3, "weight_decay": 2.0, "block_size": 32}
SMALL_ENGLISH = {"n_embd": 128, "n_layer": 3, "dropout": 0.2, "weight_decay": 0.3, "max_iters": 1200}


def test_the_rule_keeps_the_preset_for_100_000_characters_or_more_and_fits_a_smaller_text():
    """Sizes in, settings out: Tiny Shakespeare and any text of 100,000 training characters or more keep the preset; a
    smaller one whose letters are seen fewer than 100 times each gets a narrower, deeper model, strong dropout and weight
    decay and a shorter context; any other smaller one gets a narrower, deeper model, dropout, weight decay and four
    times the steps. A setting the user gave stays, and so does a width the heads do not divide."""
    assert fit(1_003_854, 65) == {} and fit(251_436, 3_414) == {}  # Tiny Shakespeare; a mid-size Chinese-English text
    assert fit(26_619, 2_579) == SMALL_TEXT  # Tang poems
    assert fit(36_029, 79) == SMALL_ENGLISH  # a small English text
    assert fit(99_999, 1_000) == SMALL_TEXT and fit(99_999, 999) == SMALL_ENGLISH and fit(100_000, 5_000) == {}
    assert chosen(26_619, 2_579, {"dropout"}, 4) == {k: v for k, v in SMALL_TEXT.items() if k != "dropout"}
    assert "n_embd" not in chosen(26_619, 2_579, set(), 5)  # 5 heads do not divide 96: the preset's width stays
    assert fitted_line(26_619, 2_579, SMALL_TEXT) == (
        "fitted to 26,619 training characters in 2,579 letters (few of each): n_embd 96, n_layer 3, dropout 0.3, "
        "weight_decay 2.0, block_size 32; give --config shakespeare_char_cpu to train as on Tiny Shakespeare")
    assert fitted_line(36_029, 79, SMALL_ENGLISH) == (
        "fitted to 36,029 training characters in 79 letters (a small text): n_embd 128, n_layer 3, dropout 0.2, "
        "weight_decay 0.3, max_iters 1200; give --config shakespeare_char_cpu to train as on Tiny Shakespeare")


def test_the_fit_changes_only_what_the_preset_file_sets_so_naming_the_preset_keeps_it_whole():
    """--config shakespeare_char_cpu makes each key of the preset's file the user's own; every key the fit can choose is
    one of them, so naming the preset trains as it says on any text."""
    _, _, explicit = load_config(["--config", "shakespeare_char_cpu"], False)
    for n_train, letters in ((26_619, 2_579), (36_029, 79), (99_999, 999)):
        assert fit(n_train, letters) and set(fit(n_train, letters)) <= explicit


def fitted_lines(said: list[str]) -> list[str]:
    return [line for line in said if line.startswith("fitted")]


def run(tmp_path, *args, said=None):
    cfg, _, explicit = load_config(["--cache_dir", str(tmp_path / "cache"), "--out_dir", str(tmp_path / "run"),
                                    "--max_iters", "2", "--eval_iters", "1", "--sample_chars", "0", "--num_threads", "1",
                                    "--log_attention", "false", "--full_val", "false", *args], False)
    train.train(cfg, explicit, say=(said if said is not None else []).append)
    return checkpoint.load(tmp_path / "run" / "ckpt_last.safetensors")


def fitted_run(tmp_path, text, rule: dict, flag: str, value) -> None:
    """A default run on the text with --flag value says the rule's other settings in one line and trains with them,
    the flag's value in place of the rule's."""
    said = []
    state = run(tmp_path, "--data", str(text), f"--{flag}", str(value), said=said)
    chosen = {name: setting for name, setting in rule.items() if name != flag}
    assert fitted_lines(said) == [fitted_line(state["data"]["n_train"], state["data"]["vocab_size"], chosen)]
    assert {name: state["run_config"][name] for name in rule} == {**chosen, flag: value}


def test_a_default_run_on_a_small_text_is_fitted_says_so_and_a_flag_or_preset_wins(tmp_path):
    """Without --config a small text in a large alphabet trains as fitted, said in one line; a flag wins over its
    field; a resume keeps its settings (no refit); --config shakespeare_char_cpu trains as the preset says."""
    text = tmp_path / "poems.txt"
    text.write_text("".join(chr(0x4E00 + (i * 7919) % 300) for i in range(3000)), encoding="utf-8")
    fitted_run(tmp_path, text, SMALL_TEXT, "dropout", 0.25)
    said = []
    state = run(tmp_path, "--resume", "--max_iters", "3", said=said)
    assert not fitted_lines(said) and state["iter"] == 3
    assert state["run_config"]["dropout"] == 0.25  # a refit would make it 0.3
    said.clear()
    state = run(tmp_path, "--data", str(text), "--config", "shakespeare_char_cpu", "--overwrite", said=said)
    assert not fitted_lines(said)
    assert (state["run_config"]["n_embd"], state["run_config"]["block_size"]) == (160, 64)


def test_a_small_text_in_a_small_alphabet_takes_the_fit_and_a_flag_still_wins(tmp_path):
    """A default run on a small text whose letters are seen often takes the fit's model, dropout and weight decay, said
    in one line; the --max_iters given wins over the fit's."""
    text = tmp_path / "notes.txt"
    text.write_text("the cat sat on the mat. " * 200, encoding="utf-8")
    fitted_run(tmp_path, text, SMALL_ENGLISH, "max_iters", 2)
    said = []
    state = run(tmp_path, "--data", str(text), "--config", "shakespeare_char_cpu", "--overwrite", said=said)
    assert not fitted_lines(said)
    saved = state["run_config"]
    assert (saved["n_embd"], saved["n_layer"], saved["dropout"], saved["weight_decay"]) == (160, 2, 0.0, 0.1)
