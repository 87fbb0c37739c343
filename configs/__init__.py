"""Settings: the presets (TOML files here), the schema (schema.py), every setting's allowed values (choices.py, which
imports nothing of the project, so the model's own settings can check against it too) and command-line parsing."""
from __future__ import annotations

__all__ = ["TrainConfig", "load_config"]


def __getattr__(name: str):
    """TrainConfig and load_config, imported on first use: model/config.py reads configs.choices, and the schema
    reads model/config.py, so importing this package must not import the schema at once."""
    if name == "TrainConfig":
        from configs.schema import TrainConfig
        return TrainConfig
    if name == "load_config":
        from configs.loader import load_config
        return load_config
    raise AttributeError(f"module 'configs' has no attribute {name!r}")
