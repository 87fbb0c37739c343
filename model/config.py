"""ModelConfig: the shape of the decoder, validated when it is built."""
from __future__ import annotations

from dataclasses import asdict, dataclass

ATTENTION_IMPLS = ("auto", "sdpa", "explicit")
POSITIONS = ("learned", "rope")
ACTIVATIONS = ("gelu", "relu2")


@dataclass
class ModelConfig:
    vocab_size: int = 65
    block_size: int = 256  # the longest context the model sees (size of the position table)
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers
    tie_weights: bool = True  # the output head shares its weights with the token embedding
    attention: str = "auto"  # auto | sdpa | explicit (see model/attention.py)
    position: str = "learned"  # learned: a position embedding table; rope: rotary embeddings on q and k
    activation: str = "gelu"  # the feed-forward nonlinearity: gelu, or relu2 (relu(x) squared)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                f"try n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.position not in POSITIONS:
            raise ValueError(f"position must be one of {', '.join(POSITIONS)}, got {self.position!r}")
        if self.position == "rope" and self.head_size % 2:
            raise ValueError(f"rope needs an even head_size; n_embd / n_head = {self.head_size}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_IMPLS)}, got {self.attention!r}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)
