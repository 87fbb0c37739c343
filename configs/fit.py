"""The default run fitted to its text's size and alphabet."""
from __future__ import annotations

PRESET = "shakespeare_char_cpu"  # the default without CUDA, made for Tiny Shakespeare
SMALL = 100_000  # fewer training characters are soon learned by heart
SEEN = 100  # a large alphabet: its letters are seen fewer times than this each


def fit(n_train: int, vocab_size: int) -> dict:
    """The settings that replace the preset's for this text: only keys its file sets, so naming it keeps them."""
    if n_train >= SMALL:  # the preset fits
        return {}
    if n_train < SEEN * vocab_size:  # few of each letter: narrower, deeper, a shorter context, held back hard
        return {"n_embd": 96, "n_layer": 3, "dropout": 0.3, "weight_decay": 2.0, "block_size": 32}
    # soon learned by heart: narrower and deeper, held back, trained longer
    return {"n_embd": 128, "n_layer": 3, "dropout": 0.2, "weight_decay": 0.3, "max_iters": 1200}


def chosen(n_train: int, vocab_size: int, given: set[str], n_head: int) -> dict:
    """fit()'s settings less those the user gave; a width the heads do not divide stays the preset's."""
    settings = {name: value for name, value in fit(n_train, vocab_size).items() if name not in given}
    if settings.get("n_embd", 0) % n_head:
        del settings["n_embd"]
    return settings


def fitted_line(n_train: int, vocab_size: int, chosen: dict) -> str:
    """The line that says what fit() chose and why."""
    settings = ", ".join(f"{name} {value}" for name, value in chosen.items())
    why = "few of each" if n_train < SEEN * vocab_size else "a small text"
    return (f"fitted to {n_train:,} training characters in {vocab_size:,} letters ({why}): {settings}; give "
            f"--config {PRESET} to train as on Tiny Shakespeare")
