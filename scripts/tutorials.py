"""python scripts/tutorials.py [000 001 002 003 004]: the worked examples of the five self-attention tutorials this
project grew from, recomputed step by step with this project's attention code, each step printed with its formula."""
from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from errors import ArgumentParser, UserError, exit_without_teardown, run_cli  # noqa: E402
from model.textbook import Head, masked_softmax, valid_key_mask  # noqa: E402
from model.scoring import additive_scores, attend, dot_product_scores  # noqa: E402

# A step: a short name (the tests look steps up by it), the formula or sentence it illustrates, and its value.
Step = tuple[str, str, object]


def causal(n: int) -> torch.Tensor:
    return torch.tril(torch.ones(n, n, dtype=torch.bool))


# ---- 000: averaging the past three ways, a head without and with values, the 1/√d scale ---------------------------
def tutorial_000() -> list[Step]:
    torch.manual_seed(1337)
    B, T, C = 2, 8, 2
    x = torch.rand(B, T, C)
    loop = torch.stack([torch.stack([x[b, :t + 1].mean(0) for t in range(T)]) for b in range(B)])
    tril = torch.tril(torch.ones(T, T))
    averaging = tril / tril.sum(1, keepdim=True)
    by_softmax = F.softmax(torch.zeros(T, T).masked_fill(tril == 0, float("-inf")), dim=-1)
    steps: list[Step] = [
        ("x", "x: 2 sequences of 8 tokens, 2 numbers each (x[0] shown)", x[0]),
        ("loop", "mean of x[0..t], one position at a time (x[0] shown)", loop[0]),
        ("averaging", "the same as a matrix: tril(ones) with each row divided by its sum", averaging),
        ("softmax_average", "and as softmax(zeros with the future set to -inf): the same matrix", by_softmax),
        ("averaging_gap", "max |loop - averaging @ x|, max |loop - softmax_average @ x|",
         torch.tensor([(loop - averaging @ x).abs().max(), (loop - by_softmax @ x).abs().max()])),
    ]
    # A head that learns whom to average: keys and queries from x; first without values (weights @ x).
    torch.manual_seed(1337)
    C, head_size = 32, 16
    x = torch.rand(4, T, C)
    w_k, w_q, w_v = (torch.randn(C, head_size) / math.sqrt(C) for _ in range(3))
    k, q, v = x @ w_k, x @ w_q, x @ w_v
    no_values, weights = attend(dot_product_scores(q, k), x, causal(T))
    steps += [("kq_weights", "softmax(q·kᵀ/√16, future masked): learned weights instead of a plain average "
                             "(sequence 0)", weights[0]),
              ("no_values_shape", "without values the output is weights @ x: as wide as x (32)",
               torch.tensor(no_values.shape))]
    # The scale: q·k of unit-variance vectors has variance head_size; dividing by √head_size brings it back to 1.
    torch.manual_seed(1337)
    qn, kn = torch.randn(64, T, head_size), torch.randn(64, T, head_size)
    raw = qn @ kn.transpose(-2, -1)
    steps.append(("variance", "var(q), var(k), var(q·k), var(q·k/√16): the product's variance is about 16",
                  torch.stack([qn.var(), kn.var(), raw.var(), (raw / math.sqrt(head_size)).var()])))
    # 000 scales the output (weights @ v * head_size**-0.5) instead of the scores; that is a different thing.
    right, right_weights = attend(dot_product_scores(q, k, scaled=True), v, causal(T))
    wrong_weights = F.softmax((q @ k.transpose(-2, -1)).masked_fill(~causal(T), float("-inf")), dim=-1)
    wrong = wrong_weights @ v * head_size ** -0.5
    head = Head(C, head_size, T, bias=False)
    with torch.no_grad():
        for layer, w in ((head.key, w_k), (head.query, w_q), (head.value, w_v)):
            layer.weight.copy_(w.T)
    steps += [
        ("scale_gap", "max |softmax(q·kᵀ/√d) v - softmax(q·kᵀ) v / √d|: scaling after the softmax is not the same",
         (right - wrong).abs().max()),
        ("head_gap", "max |softmax(q·kᵀ/√d) v - this project's Head(x)|: the model scales before the softmax",
         (right - head(x)).abs().max().detach()),
        ("sharpest", "largest weight in the last row, scaled before vs not scaled: the unscaled softmax is sharper",
         torch.stack([right_weights[0, -1].max(), wrong_weights[0, -1].max()])),
    ]
    return steps


# ---- 001: "Life is short, eat dessert first" ------------------------------------------------------------------------
def tutorial_001() -> list[Step]:
    sentence = "Life is short, eat dessert first"
    words = sentence.replace(",", "").split()
    vocabulary = {word: i for i, word in enumerate(sorted(words))}
    ids = torch.tensor([vocabulary[w] for w in words])
    torch.manual_seed(123)
    x = torch.nn.Embedding(50_000, 3)(ids).detach()  # a 50,000-word table, 3 numbers per word
    torch.manual_seed(123)
    w_q, w_k, w_v = torch.rand(3, 2), torch.rand(3, 2), torch.rand(3, 4)  # d_q = d_k = 2, d_v = 4
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    omega_2 = q[1] @ k.T  # query 2 against every key
    alpha_2 = F.softmax(omega_2 / math.sqrt(2), dim=0)
    z, weights = attend(dot_product_scores(q, k), v)  # every query at once (no mask: 001 attends both ways)
    torch.manual_seed(123)  # four heads, each with d_v = 1, side by side
    heads = []
    for _ in range(4):
        wq_h, wk_h, wv_h = torch.rand(3, 2), torch.rand(3, 2), torch.rand(3, 1)
        heads.append(attend(dot_product_scores(x @ wq_h, x @ wk_h), x @ wv_h)[0])
    torch.manual_seed(123)  # cross-attention: queries from the sentence, keys and values from 8 other inputs
    wq_c, wk_c, wv_c = torch.rand(3, 2), torch.rand(3, 2), torch.rand(3, 4)
    other = torch.rand(8, 3)
    cross, _ = attend(dot_product_scores(x @ wq_c, other @ wk_c), other @ wv_c)
    masked_simple = weights * causal(6)  # causal masking after the softmax, then renormalised...
    renormalised = masked_simple / masked_simple.sum(1, keepdim=True)
    _, causal_weights = attend(dot_product_scores(q, k), v, causal(6))  # ...equals masking before it
    return [
        ("vocabulary", "the sorted words, numbered: " + str(vocabulary), ids),
        ("embedding", "x = Embedding(50000, 3)(ids), seed 123: one row per word", x),
        ("W_q", "W_q (3 x 2), seed 123", w_q), ("W_k", "W_k (3 x 2)", w_k), ("W_v", "W_v (3 x 4): d_v may differ", w_v),
        ("q_2", "q_2 = x_2 @ W_q", q[1]), ("keys", "k = x @ W_k", k), ("values", "v = x @ W_v", v),
        ("omega_24", "ω_24 = q_2 · k_4 (the 2nd word's query, the 5th word's key)", omega_2[4]),
        ("omega_2", "ω_2 = q_2 @ kᵀ", omega_2),
        ("alpha_2", "α_2 = softmax(ω_2 / √d_k), d_k = 2", alpha_2),
        ("z_2", "z_2 = α_2 @ v: the 2nd word's context vector (4 numbers, as wide as v)", alpha_2 @ v),
        ("Z", "Z = softmax(q kᵀ / √d_k) v for every word at once", z),
        ("multi_head", "4 heads with d_v = 1, concatenated: [head_1(x) | ... | head_4(x)]", torch.cat(heads, -1)),
        ("cross", "cross-attention: queries from the 6 words, keys and values from 8 other inputs (6 x 4)", cross),
        ("renormalised", "weights * tril, each row divided by its sum", renormalised),
        ("causal", "softmax with the future set to -inf before it: the same", causal_weights),
    ]


# ---- 002: masked softmax with valid lengths; additive and scaled dot-product attention ----------------------------
def tutorial_002() -> list[Step]:
    mask = valid_key_mask(torch.tensor([1, 2, 3]), 4, padding="right")
    torch.manual_seed(0)
    scores = torch.rand(2, 2, 4)
    # The tutorial pads on the right (real tokens first). This project's sampler pads prompts on the left.
    per_row = masked_softmax(scores, torch.tensor([2, 3]), padding="right")
    per_query = masked_softmax(scores, torch.tensor([[1, 3], [2, 4]]), padding="right")
    left = masked_softmax(scores, torch.tensor([2, 3]), padding="left")
    # The additive-attention example: 2 batches, 1 query of width 20, 10 identical keys of width 2, 8 hidden units.
    torch.manual_seed(0)
    queries, keys = torch.normal(0, 1, (2, 1, 20)), torch.ones(2, 10, 2)
    values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
    valid_lens = torch.tensor([2, 6])
    w_q, w_k, w_v = torch.randn(20, 8) / math.sqrt(20), torch.randn(2, 8) / math.sqrt(2), torch.randn(8)
    keep = valid_key_mask(valid_lens, 10, padding="right")[:, None, :]  # (2, 1, 10)
    additive, additive_weights = attend(additive_scores(queries @ w_q, keys @ w_k, w_v), values, keep)
    dot_queries = torch.normal(0, 1, (2, 1, 2))  # the dot product needs queries as wide as the keys
    dot, _ = attend(dot_product_scores(dot_queries, keys), values, keep)
    return [
        ("sequence_mask", "valid lengths [1, 2, 3] over 4 slots, padding on the right: True = a real token", mask),
        ("scores", "scores: torch.rand(2, 2, 4), seed 0", scores),
        ("per_row", "masked_softmax(scores, [2, 3], padding='right'): one length per batch row", per_row),
        ("per_query", "masked_softmax(scores, [[1, 3], [2, 4]], padding='right'): one length per query", per_query),
        ("left", "masked_softmax(scores, [2, 3], padding='left'): the sampler's convention keeps the LAST keys", left),
        ("additive_weights", "additive: softmax(w_vᵀ tanh(q W_q + k W_k)) over the valid keys; identical keys, "
                             "so equal weights", additive_weights[:, 0]),
        ("additive", "additive attention output: the mean of the first 2, and of the first 6, value rows", additive),
        ("dot_product", "scaled dot-product on the same keys and values: the same output", dot),
    ]


# ---- 003: how the softmax's input shapes its output and its gradient; why divide by √d_k ---------------------------
def tutorial_003() -> list[Step]:
    a = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    y3 = torch.stack([F.softmax(torch.stack([v, v, 2 * v]), dim=0)[2] for v in a])
    jacobian_max = torch.stack([
        torch.autograd.functional.jacobian(lambda s: F.softmax(s, dim=0), torch.stack([v, v, 2 * v])).abs().max()
        for v in a])
    torch.manual_seed(0)
    T, d = 16, 512
    q, k, v = torch.randn(T, d), torch.randn(T, d), torch.randn(T, d)

    def through_softmax(scaled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient that reaches the softmax's input (the median over rows of each row's norm), and how peaked
        the weights are (the mean largest weight per row)."""
        scores = dot_product_scores(q, k, scaled=scaled).requires_grad_(True)
        out, weights = attend(scores, v, causal(T))
        out.square().sum().backward()  # any loss of the output will do; its gradient must pass the softmax
        rows = slice(1, None)  # row 0 has a single key to look at: its weight is 1 either way
        return scores.grad[rows].norm(dim=-1).median(), weights.max(-1).values[rows].mean().detach()

    (scaled_grad, scaled_peak), (raw_grad, raw_peak) = through_softmax(True), through_softmax(False)
    return [
        ("y3", "softmax([a, a, 2a])[2] for a = 1, 10, 100: large inputs put nearly all the weight on the largest",
         y3),
        ("jacobian_max", "largest |∂softmax/∂input| for the same inputs: the gradient vanishes as the input grows",
         jacobian_max),
        ("score_std", f"std of q·k for random unit-variance q, k of size {d}: scaled by 1/√d, then unscaled",
         torch.stack([dot_product_scores(q, k).std(), dot_product_scores(q, k, scaled=False).std()])),
        ("peak", "mean largest attention weight per row (rows 2..16): scaled, then unscaled (1 = one-hot)",
         torch.stack([scaled_peak, raw_peak])),
        ("gradient_norms", "median over rows of |∂loss/∂scores|, the gradient that gets through the softmax: "
                           "scaled, then unscaled",
         torch.stack([scaled_grad, raw_grad])),
    ]


# ---- 004: the blog's three tokens, computed exactly -----------------------------------------------------------------
def tutorial_004() -> list[Step]:
    x = torch.tensor([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=torch.float32)
    w_k = torch.tensor([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=torch.float32)
    w_q = torch.tensor([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=torch.float32)
    w_v = torch.tensor([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=torch.float32)
    k, q, v = x @ w_k, x @ w_q, x @ w_v
    scores_1 = q[0] @ k.T
    rounded = torch.tensor([0.0, 0.5, 0.5])  # what the blog writes for softmax([2, 4, 4])
    weights_1 = F.softmax(scores_1, dim=0)
    scaled_1 = F.softmax(scores_1 / math.sqrt(3), dim=0)
    return [
        ("keys", "k = x @ W_k", k), ("queries", "q = x @ W_q", q), ("values", "v = x @ W_v", v),
        ("scores_1", "token 1's scores q_1 · k_j", scores_1),
        ("blog_output_1", "the blog rounds softmax([2, 4, 4]) to [0, 0.5, 0.5], and gets", rounded @ v),
        ("weights_1", "softmax([2, 4, 4]) exactly", weights_1),
        ("output_1", "token 1's output, exactly: weights_1 @ v", weights_1 @ v),
        ("scaled_weights_1", "with the 1/√d the blog leaves out (d = 3): softmax([2, 4, 4] / √3)", scaled_1),
        ("scaled_output_1", "and token 1's output then", scaled_1 @ v),
        ("all_outputs", "every token at once: softmax(q kᵀ / √3) v", attend(dot_product_scores(q, k), v)[0]),
    ]


TUTORIALS = {
    "000": ("the maths of self-attention: averaging the past, keys and queries, values, the 1/√d scale", tutorial_000),
    "001": ("a worked example: 'Life is short, eat dessert first'", tutorial_001),
    "002": ("scoring functions: masked softmax with valid lengths, additive and dot-product attention", tutorial_002),
    "003": ("the softmax's input, its gradient, and why q·k is divided by √d_k", tutorial_003),
    "004": ("the blog's three-token example, without its rounding", tutorial_004),
}


def show(value) -> str:
    if not isinstance(value, torch.Tensor):
        return f"  {value}"
    value = value.detach()
    if value.dim() == 0:
        return f"  {value.item():.4f}"
    if value.dim() == 1:
        value = value[None]
    if value.dim() > 2:
        return "\n".join(show(part) for part in value)
    if value.dtype == torch.bool:
        return "\n".join("  [" + "  ".join(f"{str(v):>5}" for v in row) + " ]" for row in value.tolist())
    return "\n".join("  [" + "  ".join(f"{v:8.4f}" if math.isfinite(v) else f"{'-inf':>8}" for v in row) + " ]"
                     for row in value.tolist())


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description="Recompute the tutorials' worked examples step by step.")
    parser.add_argument("tutorial", nargs="*", metavar="NNN", help=f"which ones ({', '.join(TUTORIALS)}; default: all)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.tutorial if n not in TUTORIALS]
    if unknown:
        raise UserError(f"no tutorial {unknown[0]}; choose from {', '.join(TUTORIALS)}")
    for number in args.tutorial or TUTORIALS:
        title, steps = TUTORIALS[number]
        print(f"=== tutorial {number}: {title}\n")
        for _, formula, value in steps():
            print(f"{formula}:\n{show(value)}\n")
    return 0


if __name__ == "__main__":
    exit_without_teardown(run_cli(main))
