"""CharTokenizer: one token per character; the vocabulary is the sorted set of the corpus's characters (for a
fine-tuned model: its first model's vocabulary, then the new text's other characters, sorted)."""
from __future__ import annotations

import numpy as np

from errors import UserError


def codepoints(text: str) -> np.ndarray:
    """The Unicode code points of a string as a uint32 array (vectorised ord)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every token id."""
    if vocab_size <= 1 << 8:
        return np.dtype(np.uint8)
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    return np.dtype(np.uint32)


def vocabulary_difference(first: str, second: str, names: tuple[str, str], shown: int = 6) -> str:
    """How two vocabularies differ, in a few words: up to `shown` characters found in only one of them (names: what
    each is), each written as repr writes it, so that a newline, a tab or a control character is seen and not
    printed; or that they hold the same characters in another order."""
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
        self._table: np.ndarray | None = None  # code point -> id, built on first encode_array()
        self._known: np.ndarray | None = None  # code point -> whether it is in the vocabulary, built with it

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    def default_prompt(self, first_char: str | None = None) -> str:
        """What to start a sample from when the user gives nothing: a newline where the text has lines, else the
        character the training text starts with (a one-line text, Chinese say, may have no newline at all)."""
        for candidate in ("\n", first_char):
            if candidate and candidate in self.stoi:
                return candidate
        return self.chars[0]

    def unknown(self, text: str) -> list[str]:
        """The characters of text that are not in the vocabulary, each once, in order of appearance."""
        return list(dict.fromkeys(ch for ch in text if ch not in self.stoi))

    def encode(self, text: str) -> list[int]:
        missing = self.unknown(text)
        if missing:
            raise UserError(f"characters not in the vocabulary: {''.join(missing)!r}")
        return [self.stoi[ch] for ch in text]

    def encode_array(self, text: str) -> np.ndarray:
        """Encode a (large) string whose characters are all in the vocabulary, vectorised; a character outside it is a
        ValueError (its id would otherwise be read as 0, another character)."""
        if self._table is None:  # a gather through a table beats a dict lookup per character by ~100x
            self._table = np.zeros(0x110000, dtype=self.dtype)
            self._table[[ord(c) for c in self.chars]] = np.arange(self.vocab_size)
            self._known = np.zeros(0x110000, dtype=bool)
            self._known[[ord(c) for c in self.chars]] = True
        points = codepoints(text)
        if not self._known[points].all():
            raise ValueError(f"characters not in the vocabulary: {''.join(self.unknown(text))[:20]!r}")
        return self._table[points]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)
