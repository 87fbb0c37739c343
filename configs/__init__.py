"""Settings: the presets (TOML files here), their schema (schema.py), allowed values (choices.py) and parsing."""
from configs.loader import load_config
from configs.schema import TrainConfig

__all__ = ["TrainConfig", "load_config"]
