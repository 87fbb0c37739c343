"""The decoder-only transformer: its settings, attention (the textbook form and the model's), the decoder, and
sampling. The optimizers are training/optim.py's."""
from model.config import ModelConfig
from model.gpt import GPT

__all__ = ["GPT", "ModelConfig"]
