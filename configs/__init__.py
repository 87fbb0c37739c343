"""Run configuration: the TrainConfig schema, the presets beside it, and the command-line loader."""
from configs.loader import load_config
from configs.schema import TrainConfig

__all__ = ["TrainConfig", "load_config"]
