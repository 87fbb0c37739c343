"""The decoder-only transformer: config, attention, model, optimizer and sampling."""
from model.config import ModelConfig
from model.gpt import GPT

__all__ = ["GPT", "ModelConfig"]
