"""The default run fitted to its text: the settings a careful user picks for a corpus's size and alphabet."""
from __future__ import annotations

PRESET = "shakespeare_char_cpu"  # the default without CUDA, made for Tiny Shakespeare (1.0M training characters)
LARGE = 500_000  # training characters from which that preset is kept as it is
SMALL = 100_000  # below this a text is small: a narrow model, short context, strong dropout


def fit(n_train: int, vocab_size: int) -> dict:
    """The settings that replace the preset's for n_train training characters and vocab_size letters."""
    if n_train >= LARGE:
        return {}
    if n_train >= SMALL:  # mid-size: the preset's model, with some dropout against learning the text by heart
        return {"dropout": 0.1}
    # A small text is seen many times over: dropout and a narrow model keep it from being learned by heart.
    # A large alphabet spreads it thin (few examples of each letter): narrower still.
    n_embd = 64 if n_train / vocab_size < 50 else 96
    return {"n_embd": n_embd, "dropout": 0.3, "block_size": 32, "max_iters": 600, "eval_interval": 60}


def fitted_line(n_train: int, vocab_size: int, chosen: dict) -> str:
    """The one line that says what fit() chose and why."""
    settings = ", ".join(f"{name} {value}" for name, value in chosen.items())
    return (f"fitted to {n_train:,} training characters, {vocab_size:,} letters: {settings}; give --config {PRESET} "
            f"to train as on Tiny Shakespeare")
