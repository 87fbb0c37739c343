"""The default run fitted to its text: the settings a careful user picks for a corpus's size and alphabet."""
from __future__ import annotations

PRESET = "shakespeare_char_cpu"  # the default without CUDA, made for Tiny Shakespeare (1.0M training characters)
LARGE = 500_000  # training characters from which the preset is kept whatever the alphabet
SMALL = 100_000  # below this a text in a large alphabet gets a narrow model, short context and strong dropout
SEEN = 100  # a letter seen fewer times than this on average is learned by heart, with its neighbours, within 300 steps


def fit(n_train: int, vocab_size: int) -> dict:
    """The settings that replace the preset's for n_train training characters and vocab_size letters."""
    if n_train >= LARGE or n_train >= SEEN * vocab_size:  # each letter seen often: the preset fits
        return {}
    if n_train < SMALL:
        return {"n_embd": 96, "dropout": 0.3, "block_size": 32}
    return {"dropout": 0.1}


def fitted_line(n_train: int, vocab_size: int, chosen: dict) -> str:
    """The one line that says what fit() chose and why."""
    settings = ", ".join(f"{name} {value}" for name, value in chosen.items())
    return (f"fitted to {n_train:,} training characters in {vocab_size:,} letters (few of each): {settings}; give "
            f"--config {PRESET} to train as on Tiny Shakespeare")
