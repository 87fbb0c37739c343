"""python scripts/attention_walkthrough.py: one head of causal self-attention, step by step, on tutorial 004's three
tokens and weights (python scripts/tutorials.py 004 computes that blog's own, unmasked, example)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from errors import ArgumentParser, exit_without_teardown, run_cli  # noqa: E402
from model.textbook import Head  # noqa: E402

# Tutorial 004's example: three tokens of 4 numbers, small integer weights (4 x 3),
# so every step can be checked by hand.
X = [[1.0, 0.0, 1.0, 0.0],
     [0.0, 2.0, 0.0, 2.0],
     [1.0, 1.0, 1.0, 1.0]]
W_QUERY = [[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]]
W_KEY = [[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]]
W_VALUE = [[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]]


def build_head() -> Head:
    head = Head(n_embd=4, head_size=3, block_size=3, bias=False)
    with torch.no_grad():  # nn.Linear computes x @ W.T, so the weights go in transposed: q = x @ W_QUERY
        head.query.weight.copy_(torch.tensor(W_QUERY, dtype=torch.float32).T)
        head.key.weight.copy_(torch.tensor(W_KEY, dtype=torch.float32).T)
        head.value.weight.copy_(torch.tensor(W_VALUE, dtype=torch.float32).T)
    return head.eval()


def walkthrough() -> list[tuple[str, torch.Tensor]]:
    """Every intermediate of one head, computed with the project's own Head module's layers and buffer."""
    head = build_head()
    x = torch.tensor(X)
    q, k, v = head.query(x), head.key(x), head.value(x)
    scores = q @ k.T
    scaled = scores / math.sqrt(k.size(-1))
    mask = head.tril[:3, :3]
    masked = scaled.masked_fill(mask == 0, float("-inf"))
    weights = torch.softmax(masked, dim=-1)
    out = weights @ v
    assert torch.allclose(out, head(x[None])[0])  # the step-by-step numbers are what the module computes
    return [("x (3 tokens x 4 numbers)", x), ("q = x @ W_query", q), ("k = x @ W_key", k), ("v = x @ W_value", v),
            ("scores = q @ k^T", scores), ("scaled = scores / sqrt(head_size=3)", scaled),
            ("causal mask (tril: 1 = may look)", mask), ("masked scores (future = -inf)", masked),
            ("weights = softmax(masked, over each row)", weights), ("output = weights @ v", out)]


def show(name: str, tensor: torch.Tensor) -> str:
    rows = ["  [" + "  ".join(f"{value:8.4f}" if math.isfinite(value) else f"{'-inf':>8}" for value in row) + " ]"
            for row in tensor.tolist()]
    return "\n".join([f"{name}:", *rows])


def main(argv: list[str] | None = None) -> int:
    # no options; --help says what it does
    ArgumentParser(description=__doc__.split(":", 1)[1].strip()).parse_args(argv)
    print("One head of causal self-attention, step by step. Tokens are counted from 1, as on the attention page and "
          "in\ntutorials.py: row 1 of each matrix is token 1, and in the weights column s is token s.\n")
    for name, tensor in walkthrough():
        print(show(name, tensor) + "\n")
    print("Row t of the weights says how much token t takes from tokens 1..t: each row sums to 1, and the\n"
          "zeros above the diagonal are the future it may not see. The output mixes the values by those weights.")
    return 0


if __name__ == "__main__":
    exit_without_teardown(run_cli(main))
