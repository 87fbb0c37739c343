"""The default run fitted to its text: the settings a careful user picks for a corpus's size and alphabet."""
from __future__ import annotations

PRESET = "shakespeare_char_cpu"  # the default without CUDA, made for Tiny Shakespeare (1.0M training characters)
SMALL = 100_000  # training characters below which a text in a large alphabet is learned by heart within 100 steps
SEEN = 100  # a large alphabet: its letters are seen fewer times than this each, on average


def fit(n_train: int, vocab_size: int) -> dict:
    """The settings that replace the preset's for n_train training characters and vocab_size letters."""
    if n_train >= SMALL or n_train >= SEEN * vocab_size:  # the preset fits
        return {}
    return {"n_embd": 96, "dropout": 0.3, "block_size": 32}  # fewer weights, each seen with dropout, shorter context


def fitted_line(n_train: int, vocab_size: int, chosen: dict) -> str:
    """The one line that says what fit() chose and why."""
    settings = ", ".join(f"{name} {value}" for name, value in chosen.items())
    return (f"fitted to {n_train:,} training characters in {vocab_size:,} letters (few of each): {settings}; give "
            f"--config {PRESET} to train as on Tiny Shakespeare")
