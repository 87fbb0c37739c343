"""The input side: find a corpus, tokenize it into cached token files, serve (B, T) batches (and the windows that
score a text)."""
from data.corpus import Corpus, default_cache_dir, resolve
from data.loader import Batches
from data.prepare import Prepared, prepare
from data.tokenizer import CharTokenizer

__all__ = ["Batches", "CharTokenizer", "Corpus", "Prepared", "default_cache_dir", "prepare", "resolve"]
