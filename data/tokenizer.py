"""CharTokenizer: one token per character; the vocabulary is the corpus's characters, sorted (when fine-tuning: the
first model's, then the new ones)."""
from __future__ import annotations

import numpy as np

from errors import UserError


def codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def token_dtype(vocab_size: int) -> np.dtype:  # the smallest that holds every id
    return np.min_scalar_type(vocab_size - 1)


def vocabulary_difference(first: str, second: str, names: tuple[str, str], shown: int = 6) -> str:
    """How two vocabularies differ: up to `shown` characters only in one of them, as repr writes them."""
    apart = [[ch for ch in a if ch not in others] for a, others in ((first, set(second)), (second, set(first)))]
    if not any(apart):
        return "the same characters in another order"
    return ", ".join(f"only in {name}: " + " ".join(repr(ch) for ch in chars[:shown])
                     + (f" and {len(chars) - shown} more" if len(chars) > shown else "")
                     for name, chars in zip(names, apart) if chars)


class CharTokenizer:
    def __init__(self, chars: str):
        if len(set(chars)) != len(chars):
            raise ValueError("the vocabulary must not repeat a character")
        self.chars = chars
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self._table: np.ndarray | None = None  # code point -> id, -1 where none

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    def default_prompt(self, first_char: str | None = None) -> str:
        """A sample's start when none is given: a newline where the text has one, else first_char or the first."""
        return next((start for start in ("\n", first_char) if start and start in self.stoi), self.chars[0])

    def unknown(self, text: str) -> list[str]:
        """The characters of text not in the vocabulary, each once, in order."""
        return list(dict.fromkeys(ch for ch in text if ch not in self.stoi))

    def encode(self, text: str) -> list[int]:
        if missing := self.unknown(text):
            raise UserError(f"characters not in the vocabulary: {''.join(missing)!r}")
        return [self.stoi[ch] for ch in text]

    def encode_array(self, text: str) -> np.ndarray:
        """encode() for a large text, through a table; an unknown character is a ValueError."""
        if self._table is None:
            self._table = np.full(0x110000, -1, dtype=np.int32)
            self._table[codepoints(self.chars)] = np.arange(self.vocab_size)
        ids = self._table[codepoints(text)]
        if (ids < 0).any():
            raise ValueError(f"characters not in the vocabulary: {''.join(self.unknown(text))[:20]!r}")
        return ids.astype(self.dtype)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)
