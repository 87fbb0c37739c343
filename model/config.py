"""The model's settings: Architecture (its shape) and ModelConfig (plus vocab_size), each checked once."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from model.scoring import FORMS

ATTENTION_IMPLS = ("auto", "sdpa", "explicit")
POSITIONS = ("learned", "rope", "none")
ACTIVATIONS = ("gelu", "relu2")
MAX_SIZE = 2**31 - 1


def setting(default, help: str):  # a field with its train.py --help sentence
    return field(default=default, metadata={"help": help})


@dataclass
class Architecture:
    block_size: int = setting(256, "context length in characters")
    n_layer: int = setting(6, "number of transformer blocks (0: none, a bigram model)")
    n_head: int = setting(6, "attention heads per block")
    n_embd: int = setting(384, "width of the residual stream")
    dropout: float = setting(0.0, "dropout probability while training (0: off)")
    bias: bool = setting(True, "biases in Linear and LayerNorm layers")
    tie_weights: bool = setting(True, "share the token embedding with the output head")
    attention: str = setting("auto", "attention path: auto | sdpa (fused kernel) | explicit (textbook, slower)")
    attention_score: str = setting("scaled_dot", "how a query scores a key: " + " | ".join(
        f"{form.name} ({form.meaning})" for form in FORMS.values()))
    shared_qk: bool = setting(False, "queries and keys from one projection (Q = K)")
    attention_values: bool = setting(True, "a value projection (false: each head mixes its own slice of the input)")
    position: str = setting("learned", "positions: learned (a table) | rope (rotary, on q and k) | none")
    activation: str = setting("gelu", "feed-forward nonlinearity: gelu | relu2 (relu(x)²)")
    qk_norm: bool = setting(False, "RMS-normalise each head's queries and keys (QK-norm)")
    logit_softcap: float = setting(0.0, "squash the logits to cap * tanh(logits / cap) (0: off)")
    zero_proj: bool = setting(False, "start each block's c_proj at zero: each block begins as the identity")
    mlp: bool = setting(True, "each block's feed-forward network (false: attention only)")
    residual: bool = setting(True, "residual connections and the blocks' LayerNorms")

    def __post_init__(self) -> None:
        for name in ("block_size", "n_layer", "n_head", "n_embd"):
            value, least = getattr(self, name), 0 if name == "n_layer" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                rule = "a whole number, 0 or more" if least == 0 else "a positive integer"
                raise ValueError(f"{name} must be {rule}, got {value!r}")
            if value > MAX_SIZE:
                raise ValueError(f"{name} must be at most {MAX_SIZE:,}, got {value:,}")
        if self.n_embd % self.n_head != 0:
            step = self.n_head * (2 if self.position == "rope" else 1)
            fits = max(step, min(step * round(self.n_embd / step), MAX_SIZE // step * step))
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); try n_embd={fits}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not 0.0 <= self.logit_softcap < float("inf"):
            raise ValueError(f"logit_softcap must be 0 (off) or a positive number, got {self.logit_softcap!r}")
        for name, allowed in (("position", POSITIONS), ("activation", ACTIVATIONS), ("attention", ATTENTION_IMPLS),
                              ("attention_score", tuple(FORMS))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.position == "rope" and self.head_size % 2:
            raise ValueError(f"rope needs an even head_size; n_embd / n_head = {self.head_size}")
        form = FORMS[self.attention_score]
        if not form.fused and self.attention == "sdpa":
            raise ValueError(f"attention_score {form.name} has no fused kernel; use attention auto or explicit")
        if form.scores == "none" and self.qk_norm:
            raise ValueError(f"attention_score {form.name} has no queries or keys for qk_norm to normalise")
        if form.scores == "none" and self.position == "rope":
            raise ValueError(f"attention_score {form.name} has no queries or keys for rope to turn; "
                             "use position learned or none")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head


@dataclass
class ModelConfig(Architecture):
    vocab_size: int = 65  # set from the data's tokenizer

    def __post_init__(self) -> None:
        size = self.vocab_size
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_SIZE:
            raise ValueError(f"vocab_size must be a positive integer up to {MAX_SIZE:,}, got {self.vocab_size!r}")
        super().__post_init__()

    def to_dict(self) -> dict:
        return asdict(self)
