"""python scripts/tutorials.py [000 001 002 003 004] [--png DIR]: the worked examples of the five self-attention
tutorials this project grew from, recomputed step by step with this project's attention code, each step printed with
its formula and what to see in it; with --png, every attention matrix it prints is also drawn into DIR."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from errors import ArgumentParser, UserError, exit_without_teardown, run_cli  # noqa: E402
from model.textbook import Head, masked_softmax, valid_key_mask  # noqa: E402
from model.scoring import additive_scores, attend, dot_product_scores  # noqa: E402

class Picture(NamedTuple):
    """How --png draws a printed matrix: the tutorial's symbols as its title and axis names, a label per row and
    column (positions counted from 1), and the masked cells, hatched grey, unlike any weight."""
    title: str
    rows: list[str]
    columns: list[str]
    row_axis: str
    column_axis: str
    masked: torch.Tensor | None = None  # True where masked out (-inf before the softmax, or padding); value's shape
    kind: str = "weights"  # weights (0 to 1) | mask (True/False) | gradient (signed, one fixed scale)
    panels: tuple[str, ...] = ()  # the panels' titles where the value has a leading batch axis
    masked_means: str = "masked: its score was set to -inf before the softmax, so its weight is 0"


class Step(NamedTuple):
    """One printed step: a short name (the tests look steps up by it), the formula or sentence it illustrates, its
    value, a sentence saying what to see in that value, and how --png draws it (None: a value that is not an attention
    matrix, not drawn)."""
    name: str
    formula: str
    value: object
    see: str
    picture: Picture | None = None


# The tutorial's own printed a (tutorial 000, "softmax is sensitive to scale"): its numbers, so its softmax can be
# matched although its x cannot.
TUTORIAL_000_A = [-0.4427, 0.8926, -0.7062, -0.7538, 1.3745, -0.1691, -1.4154, -0.6329]


def causal(n: int) -> torch.Tensor:
    return torch.tril(torch.ones(n, n, dtype=torch.bool))


def counted(n: int, word: str = "") -> list[str]:
    """Labels 1..n (positions are counted from 1 here, as on the attention page), each after word if one is given."""
    return [f"{word}{i}" for i in range(1, n + 1)]


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
        Step("x", "x: 2 sequences of 8 tokens, 2 numbers each (x[0] shown)", x[0],
             "random numbers in [0, 1), one row per token: only their shape matters for what follows"),
        Step("loop", "mean of x[0..t], one position at a time (x[0] shown)", loop[0],
             "row 1 is x's row 1, row 2 the mean of x's rows 1-2, ..., row 8 the mean of all 8 rows"),
        Step("averaging", "the same as a matrix: tril(ones) with each row divided by its sum", averaging,
             "row t holds t equal weights 1/t, then zeros (the future): row 1 is [1, 0, ...], row 8 is all 0.125",
             Picture("wei = tril(ones) / row sums", counted(T), counted(T), "token t (query)", "token s (key)",
                     ~causal(T))),
        Step("softmax_average", "and as softmax(zeros with the future set to -inf): the same matrix", by_softmax,
             "the same numbers as the matrix above: equal scores give equal weights, and exp(-inf) gives 0",
             Picture("wei = softmax(zeros, future = -inf)", counted(T), counted(T), "token t (query)",
                     "token s (key)", ~causal(T))),
        Step("averaging_gap", "max |loop - averaging @ x|, max |loop - softmax_average @ x|",
             torch.tensor([(loop - averaging @ x).abs().max(), (loop - by_softmax @ x).abs().max()]),
             "both 0 up to float32 rounding (1e-7 or less): the loop, the matrix and the softmax are one average"),
    ]
    # A head that learns whom to average: keys and queries from x; first without values (weights @ x).
    torch.manual_seed(1337)
    C, head_size = 32, 16
    x = torch.rand(4, T, C)
    w_k, w_q, w_v = (torch.randn(C, head_size) / math.sqrt(C) for _ in range(3))
    k, q, v = x @ w_k, x @ w_q, x @ w_v
    no_values, weights = attend(dot_product_scores(q, k), x, causal(T))
    steps += [Step("kq_weights", "softmax(q·kᵀ/√16, future masked): learned weights instead of a plain average "
                                 "(sequence 0)", weights[0],
                   "still zeros above the diagonal and rows summing to 1, but no longer equal: the products of "
                   "queries and keys choose whom each token averages",
                   Picture("wei = softmax(q·kᵀ / √16, future = -inf), sequence 1", counted(T), counted(T),
                           "token t (query)", "token s (key)", ~causal(T))),
              Step("no_values_shape", "without values the output is weights @ x: as wide as x (32)",
                   torch.tensor(no_values.shape),
                   "4 sequences, 8 tokens, 32 numbers each: the width of x, not the head size 16, since nothing "
                   "projected x")]
    # The scale: q·k of unit-variance vectors has variance head_size; dividing by √head_size brings it back to 1.
    torch.manual_seed(1337)
    qn, kn = torch.randn(64, T, head_size), torch.randn(64, T, head_size)
    raw = qn @ kn.transpose(-2, -1)
    steps.append(Step("variance", "var(q), var(k), var(q·k), var(q·k/√16): the product's variance is about 16",
                      torch.stack([qn.var(), kn.var(), raw.var(), (raw / math.sqrt(head_size)).var()]),
                      "q and k near 1, q·k near 16 (a sum of 16 products of variance 1), and near 1 again after "
                      "dividing by √16"))
    # Softmax is sensitive to scale: the tutorial's own a, then the same numbers times 10.
    a = torch.tensor(TUTORIAL_000_A)
    steps += [
        Step("a", "a: the tutorial's 8 printed numbers (its own draw, so its softmax can be matched)", a,
             "the 5th number, 1.3745, is the largest; the 2nd, 0.8926, comes next"),
        Step("softmax_a", "softmax(a)", F.softmax(a, dim=-1),
             "every entry keeps some weight; the largest input takes 0.4110 and the 2nd 0.2538, as in the tutorial"),
        Step("softmax_10a", "softmax(a * 10): the same order, ten times the spread", F.softmax(a * 10, dim=-1),
             "now the largest takes 0.9920 and the rest almost nothing: large scores make the softmax one-hot, "
             "which is what unscaled q·k does at a large head size"),
    ]
    # 000 scales the output (weights @ v * head_size**-0.5) instead of the scores; that is a different thing.
    right, right_weights = attend(dot_product_scores(q, k, scaled=True), v, causal(T))
    wrong_weights = F.softmax((q @ k.transpose(-2, -1)).masked_fill(~causal(T), float("-inf")), dim=-1)
    wrong = wrong_weights @ v * head_size ** -0.5
    head = Head(C, head_size, T, bias=False)
    with torch.no_grad():
        for layer, w in ((head.key, w_k), (head.query, w_q), (head.value, w_v)):
            layer.weight.copy_(w.T)
    steps += [
        Step("scale_gap", "max |softmax(q·kᵀ/√d) v - softmax(q·kᵀ) v / √d|: scaling after the softmax is not "
                          "the same", (right - wrong).abs().max(),
             "far from 0: the tutorial's last cell (the output times 1/√d) gives other outputs than the formula"),
        Step("head_gap", "max |softmax(q·kᵀ/√d) v - this project's Head(x)|: the model scales before the softmax",
             (right - head(x)).abs().max().detach(), "0: this project's Head computes the formula as written"),
        Step("sharpest", "largest weight in the last row, scaled before vs not scaled: the unscaled softmax is "
                         "sharper", torch.stack([right_weights[0, -1].max(), wrong_weights[0, -1].max()]),
             "the second (unscaled) is larger: without 1/√d one key takes more of the row"),
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
    cross, cross_weights = attend(dot_product_scores(x @ wq_c, other @ wk_c), other @ wv_c)
    masked_simple = weights * causal(6)  # causal masking after the softmax, then renormalised...
    renormalised = masked_simple / masked_simple.sum(1, keepdim=True)
    _, causal_weights = attend(dot_product_scores(q, k), v, causal(6))  # ...equals masking before it
    return [
        Step("vocabulary", "the sorted words, numbered: " + str(vocabulary), ids,
             "the sentence's words as ids, in order: 'Life' is 0, 'is' 4, 'short' 5, 'eat' 2, 'dessert' 1, 'first' 3"),
        Step("embedding", "x = Embedding(50000, 3)(ids), seed 123: one row per word", x,
             "6 rows of 3 numbers, the tutorial's own (same seed): row 1 is 'Life', row 2 'is'"),
        Step("W_q", "W_q (3 x 2), seed 123", w_q, "3 rows (the embedding's width) by 2 (d_q): the tutorial's numbers"),
        Step("W_k", "W_k (3 x 2)", w_k, "as wide as W_q: a query and a key must have the same width to be multiplied"),
        Step("W_v", "W_v (3 x 4): d_v may differ", w_v,
             "4 columns: each word's value, and so its output, has 4 numbers"),
        Step("q_2", "q_2 = x_2 @ W_q", q[1], "the 2nd word's ('is') query: 2 numbers"),
        Step("keys", "k = x @ W_k", k, "one key per word, row by row: 6 x 2"),
        Step("values", "v = x @ W_v", v, "one value per word: 6 x 4, what each word hands over once chosen"),
        Step("omega_24", "ω_24 = q_2 · k_4 (the 2nd word's query, the 5th word's key)", omega_2[4],
             "'is' against 'dessert'; the tutorial's subscripts mix two counts (its code's keys[4] counts from 0)"),
        Step("omega_2", "ω_2 = q_2 @ kᵀ", omega_2,
             "one score per word; the 5th is ω_24 above, and the largest, 3.4707, is 'is' against itself"),
        Step("alpha_2", "α_2 = softmax(ω_2 / √d_k), d_k = 2", alpha_2,
             "the same order as ω_2, now summing to 1: 'is' takes 0.6870 of its context from itself",
             Picture("α_2 = softmax(ω_2 / √d_k)", ["q_2 (is)"], words, "query", "key (word)")),
        Step("z_2", "z_2 = α_2 @ v: the 2nd word's context vector (4 numbers, as wide as v)", alpha_2 @ v,
             "a mix of the 6 rows of v, mostly the 2nd (weight 0.6870)"),
        Step("Z", "Z = softmax(q kᵀ / √d_k) v for every word at once", z,
             "row 2 is z_2 above: one matrix product gives every word's context vector"),
        Step("multi_head", "4 heads with d_v = 1, concatenated: [head_1(x) | ... | head_4(x)]", torch.cat(heads, -1),
             "one column per head, each from its own W_q, W_k, W_v: the heads sit side by side"),
        Step("cross_weights", "cross-attention weights: softmax(q kᵀ / √d_k), queries from the 6 words, keys from "
                              "8 other inputs", cross_weights,
             "6 rows by 8 columns: the matrix need not be square; each row (a word) sums to 1 over the other input",
             Picture("cross-attention: softmax(q kᵀ / √d_k)", words, counted(8, "input "), "query (word)",
                     "key (the second input)")),
        Step("cross", "cross-attention: queries from the 6 words, keys and values from 8 other inputs (6 x 4)", cross,
             "one row per word of the sentence, although keys and values came from 8 other inputs"),
        Step("renormalised", "weights * tril, each row divided by its sum", renormalised,
             "zeros above the diagonal (the future), and each row sums to 1 again",
             Picture("masked_simple / row sums (masked after the softmax)", words, words, "query (word)",
                     "key (word)", ~causal(6),
                     masked_means="masked: its weight was set to 0 after the softmax, then each row renormalised")),
        Step("causal", "softmax with the future set to -inf before it: the same", causal_weights,
             "the same numbers as above: masking with -inf before the softmax = zeroing after it and renormalising",
             Picture("softmax(ω / √d_k, future = -inf) (masked before the softmax)", words, words, "query (word)",
                     "key (word)", ~causal(6))),
    ]


# ---- 002: masked softmax with valid lengths; additive and scaled dot-product attention ----------------------------
def padded(title: str, valid_lens: torch.Tensor, padding: str) -> Picture:
    """The picture of masked_softmax's (2 batches, 2 queries, 4 keys) weights, the padding keys masked."""
    keep = valid_key_mask(valid_lens, 4, padding=padding)
    return Picture(title, counted(2), counted(4), "query", "key", ~keep,
                   panels=tuple(f"batch {b + 1}, valid_lens {valid_lens[b].tolist()}" for b in range(2)),
                   masked_means="padding: its score was set to -inf before the softmax, so its weight is 0")


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
        Step("sequence_mask", "valid lengths [1, 2, 3] over 4 slots, padding on the right: True = a real token", mask,
             "row i keeps its first i slots (True) and marks the rest as padding (False)",
             Picture("sequence_mask(valid_len = [1, 2, 3])", ["valid_len 1", "valid_len 2", "valid_len 3"],
                     counted(4), "row", "slot", ~mask, kind="mask", masked_means="padding (False)")),
        Step("scores", "scores: torch.rand(2, 2, 4), seed 0", scores,
             "2 batches of 2 queries by 4 keys, random: this script's draw, not the tutorial's"),
        Step("per_row", "masked_softmax(scores, [2, 3], padding='right'): one length per batch row", per_row,
             "batch 1's rows weigh only keys 1-2, batch 2's only keys 1-3; each row still sums to 1",
             padded("masked_softmax(X, valid_lens = [2, 3])", torch.tensor([[2, 2], [3, 3]]), "right")),
        Step("per_query", "masked_softmax(scores, [[1, 3], [2, 4]], padding='right'): one length per query",
             per_query, "each query its own length: the first has a single key, so its weight there is exactly 1",
             padded("masked_softmax(X, valid_lens = [[1, 3], [2, 4]])", torch.tensor([[1, 3], [2, 4]]), "right")),
        Step("left", "masked_softmax(scores, [2, 3], padding='left'): the sampler's convention keeps the LAST keys",
             left, "the same lengths counted from the end: the zeros (padding) come first",
             padded("masked_softmax(X, valid_lens = [2, 3], padding on the left)", torch.tensor([[2, 2], [3, 3]]),
                    "left")),
        Step("additive_weights", "additive: softmax(w_vᵀ tanh(q W_q + k W_k)) over the valid keys; identical keys, "
                                 "so equal weights", additive_weights[:, 0],
             "0.5 on each of the first 2 keys in batch 1, 1/6 on each of the first 6 in batch 2, 0 on the padding",
             Picture("additive attention weights, valid_lens = [2, 6]", ["batch 1", "batch 2"], counted(10),
                     "the query of", "key", ~keep[:, 0],
                     masked_means="padding: its score was set to -inf before the softmax, so its weight is 0")),
        Step("additive", "additive attention output: the mean of the first 2, and of the first 6, value rows", additive,
             "[2, 3, 4, 5] and [10, 11, 12, 13], the tutorial's output: equal weights average the valid value rows"),
        Step("dot_product", "scaled dot-product on the same keys and values: the same output", dot,
             "the same numbers: identical keys score alike under any scoring function, so only the lengths matter"),
    ]


# ---- 003: how the softmax's input shapes its output and its gradient; why divide by √d_k ---------------------------
def tutorial_003() -> list[Step]:
    a = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    inputs = [torch.stack([v, v, 2 * v]) for v in a]
    y3 = torch.stack([F.softmax(x, dim=0)[2] for x in inputs])
    jacobians = [torch.autograd.functional.jacobian(lambda s: F.softmax(s, dim=0), x) for x in inputs]
    closed_form = [torch.diag(y) - torch.outer(y, y) for y in (F.softmax(x, dim=0) for x in inputs)]
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
    seeing = {1: "entries of 0.04 to 0.24: a change in any input moves every output",
              10: "entries of 1e-4 and less: the gradient has nearly vanished",
              100: "entries of 1e-44 and 0: no gradient reaches the input at all"}
    return [
        Step("y3", "softmax([a, a, 2a])[2] for a = 1, 10, 100: large inputs put nearly all the weight on the largest",
             y3, "the largest input's share grows from 0.5761 to 0.9999 to 1.0000: the output becomes one-hot"),
        *(Step(f"jacobian_{int(v)}", f"∂softmax(x)_i/∂x_j for x = [{int(v)}, {int(v)}, {2 * int(v)}] "
                                     "(row i, column j)",
               jacobian, seeing[int(v)],
               Picture(f"∂y_i/∂x_j, y = softmax(x), x = [{int(v)}, {int(v)}, {2 * int(v)}]", counted(3, "y_"),
                       counted(3, "x_"), "output", "input", kind="gradient"))
          for v, jacobian in zip(a.tolist(), jacobians)),
        Step("jacobian_formula", "max |∂y/∂x - (diag(y) - y yᵀ)| over the three: the tutorial's closed form",
             torch.stack([(j - c).abs().max() for j, c in zip(jacobians, closed_form)]).max(),
             "0: autograd's Jacobian is the tutorial's diag(y) - yᵀy, which is 0 wherever y is one-hot"),
        Step("score_std", f"std of q·k for random unit-variance q, k of size {d}: scaled by 1/√d, then unscaled",
             torch.stack([dot_product_scores(q, k).std(), dot_product_scores(q, k, scaled=False).std()]),
             "this script's own experiment (seed 0): about 1 scaled, about √512 = 22.6 unscaled"),
        Step("peak", "mean largest attention weight per row (rows 2..16): scaled, then unscaled (1 = one-hot)",
             torch.stack([scaled_peak, raw_peak]),
             "unscaled, each row puts nearly all its weight on one key, as softmax([a, a, 2a]) did for a large a"),
        Step("gradient_norms", "median over rows of |∂loss/∂scores|, the gradient that gets through the softmax: "
                               "scaled, then unscaled",
             torch.stack([scaled_grad, raw_grad]),
             "the unscaled gradient is about 2000 times smaller: the one-hot rows' Jacobians are nearly 0"),
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
        Step("keys", "k = x @ W_k", k, "one key per token (3 x 3), integers since x and W_k are"),
        Step("queries", "q = x @ W_q", q, "one query per token: token 1's is [1, 0, 2]"),
        Step("values", "v = x @ W_v", v, "one value per token: what the weights will mix"),
        Step("scores_1", "token 1's scores q_1 · k_j", scores_1,
             "[2, 4, 4]: token 1's query matches tokens 2 and 3 equally, and better than itself"),
        Step("blog_output_1", "the blog rounds softmax([2, 4, 4]) to [0, 0.5, 0.5], and gets", rounded @ v,
             "[2.0, 7.0, 1.5], the blog's figure, from rounded weights"),
        Step("weights_1", "softmax([2, 4, 4]) exactly", weights_1,
             "0.0634 is not 0: token 1 still takes a little from itself",
             Picture("softmax(q_1 · kᵀ), no scale", ["token 1"], counted(3, "token "), "query", "key")),
        Step("output_1", "token 1's output, exactly: weights_1 @ v", weights_1 @ v,
             "near the blog's [2.0, 7.0, 1.5] but not equal: its rounding moved every number"),
        Step("scaled_weights_1", "with the 1/√d the blog leaves out (d = 3): softmax([2, 4, 4] / √3)", scaled_1,
             "flatter than without the scale: dividing by √3 gives token 1 more of its own value",
             Picture("softmax(q_1 · kᵀ / √3)", ["token 1"], counted(3, "token "), "query", "key")),
        Step("scaled_output_1", "and token 1's output then", scaled_1 @ v, "token 1's output as the formula has it"),
        Step("all_outputs", "every token at once: softmax(q kᵀ / √3) v", attend(dot_product_scores(q, k), v)[0],
             "row 1 is the scaled output above; rows 2 and 3 are tokens 2 and 3 computed the same way"),
    ]


TUTORIALS = {
    "000": ("the maths of self-attention: averaging the past, keys and queries, values, the 1/√d scale",
            tutorial_000),
    "001": ("a worked example: 'Life is short, eat dessert first'", tutorial_001),
    "002": ("scoring functions: masked softmax with valid lengths, additive and dot-product attention", tutorial_002),
    "003": ("the softmax's input, its gradient, and why q·k is divided by √d_k", tutorial_003),
    "004": ("the blog's three-token example, without its rounding", tutorial_004),
}
# Where a tutorial drew random numbers without a seed, its figures cannot be repeated: one line says so (the tests
# check the figures named here against the script's own).
UNSEEDED = {
    "000": "note: tutorial 000 set no seed, so its x (x[0][0] = 0.0687 there) and what is computed from x cannot be "
           "matched; this script seeds torch.manual_seed(1337) (x[0][0] = 0.0783 here). What does not depend on the "
           "draw matches: the three averages agree, var(q·k) is about 16, and softmax(a), softmax(10a) use its a",
    "002": "note: tutorial 002 drew its scores with torch.rand and no seed, so its masked softmax (0.4497 0.5503 "
           "there) cannot be matched; this script seeds torch.manual_seed(0). What does not depend on the draw "
           "matches: zeros past each valid length, 1.0000 for a length of 1, outputs [2, 3, 4, 5], [10, 11, 12, 13]",
}


def show(value) -> str:
    """A value as the script prints it: 4 decimals (scientific where every entry is below 0.001, so a small
    gradient does not read as 0), integers as integers, booleans as True/False, -inf as -inf."""
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
    if not value.is_floating_point():  # ids, lengths, shapes
        width = max(len(str(v)) for v in value.flatten().tolist())
        return "\n".join("  [ " + "  ".join(f"{v:>{width}d}" for v in row) + " ]" for row in value.tolist())
    finite = value[value.isfinite()].abs()
    small = finite.numel() > 0 and 0 < finite.max() < 1e-3

    def number(v: float) -> str:
        if not math.isfinite(v):
            return f"{'-inf':>{12 if small else 8}}"
        return f"{v:12.4e}" if small else f"{v:8.4f}"
    return "\n".join("  [" + "  ".join(number(v) for v in row) + " ]" for row in value.tolist())


# ---- --png: each attention matrix drawn as a heatmap -------------------------------------------------------------
MASKED_FILL, MASKED_HATCH = "#d9d9d9", "#8c8c8c"  # light grey, hatched: no colour of the weights' scale
GRADIENT_RANGE = 0.25  # one scale for every Jacobian (its largest entry at x = [1, 1, 2] is 0.24): small looks small


def figure_of(step: Step):
    """step's value as a heatmap per panel, each cell's number written in it, the masked cells hatched grey."""
    from matplotlib.patches import Patch, Rectangle

    from training.pictures import plt

    picture = step.picture
    value = step.value.detach().double().reshape(-1, len(picture.rows), len(picture.columns))  # (panels, rows, cols)
    masked = (torch.zeros(value.shape, dtype=torch.bool) if picture.masked is None
              else picture.masked.reshape(value.shape))
    n_panels, n_rows, n_cols = value.shape
    cell = 0.62  # inches per cell: room for a number in each
    width = max(6.0, n_panels * (n_cols * cell + 1.4) + 1.6)
    fig, axes = plt.subplots(1, n_panels, figsize=(width, n_rows * cell + 2.2), dpi=100, squeeze=False,
                             layout="constrained")
    if picture.kind == "gradient":
        cmap, low, high, bar_label = ("RdBu_r", -GRADIENT_RANGE, GRADIENT_RANGE,
                                      "∂y_i/∂x_j (one scale for all three)")
    else:
        cmap, low, high, bar_label = "viridis", 0.0, 1.0, "attention weight"
    image = None
    for panel, ax in enumerate(axes[0]):
        shown = value[panel].float().numpy() if picture.kind != "mask" else (~masked[panel]).float().numpy()
        image = ax.imshow(shown, cmap=cmap, vmin=low, vmax=high)
        for i in range(n_rows):
            for j in range(n_cols):
                if masked[panel, i, j]:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=MASKED_FILL, edgecolor=MASKED_HATCH,
                                           hatch="///", linewidth=0))
                    if picture.kind == "mask":
                        ax.text(j, i, "False", ha="center", va="center", fontsize=8)
                    continue
                v = float(value[panel, i, j])
                if picture.kind == "mask":
                    label, dark = "True", False
                elif picture.kind == "gradient":
                    label = f"{v:.2f}" if v == 0 or abs(v) >= 0.005 else f"{v:.1e}"
                    dark = abs(v) > 0.6 * GRADIENT_RANGE
                else:
                    label, dark = f"{v:.2f}", v < 0.5
                ax.text(j, i, label, ha="center", va="center", fontsize=8 if len(label) <= 5 else 6.5,
                        color="white" if dark else "black")
        ax.set_xticks(range(n_cols), picture.columns, rotation=45 if max(map(len, picture.columns)) > 3 else 0,
                      ha="right" if max(map(len, picture.columns)) > 3 else "center", fontsize=8)
        ax.set_yticks(range(n_rows), picture.rows, fontsize=8)
        ax.set_xlabel(picture.column_axis, fontsize=9)
        ax.set_ylabel(picture.row_axis, fontsize=9)
        if picture.panels:
            ax.set_title(picture.panels[panel], fontsize=9)
    fig.suptitle(picture.title, fontsize=11)
    if picture.kind != "mask":
        fig.colorbar(image, ax=axes[0].tolist(), label=bar_label, shrink=0.9)
    if masked.any():
        fig.legend(handles=[Patch(facecolor=MASKED_FILL, edgecolor=MASKED_HATCH, hatch="///",
                                  label=picture.masked_means)], loc="outside lower center", fontsize=8, frameon=False)
    return fig


def draw(step: Step, path: Path) -> None:
    """figure_of(step) written to path (whole or not at all)."""
    from training.pictures import plt, save_figure

    fig = figure_of(step)
    save_figure(fig, path, "--png")
    plt.close(fig)


def picture_folder(folder: str) -> Path:
    """--png's folder, made if missing; one line where it cannot be."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise UserError(f"--png {folder} is a file; give a folder for the pictures")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--png {folder}: cannot create the folder ({err.strerror or err}); choose another place") \
            from None
    return path


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description="Recompute the tutorials' worked examples step by step.")
    parser.add_argument("tutorial", nargs="*", metavar="NNN", help=f"which ones ({', '.join(TUTORIALS)}; default: all)")
    parser.add_argument("--png", metavar="DIR", default="",
                        help="also draw every attention matrix printed, one picture each, into this folder "
                             "(NNN-step.png; default: no pictures)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.tutorial if n not in TUTORIALS]
    if unknown:
        raise UserError(f"no tutorial {unknown[0]}; choose from {', '.join(TUTORIALS)}")
    folder = picture_folder(args.png) if args.png else None
    print("Tokens, rows and columns are counted from 1 here, as on the attention page and in the walkthrough; a "
          "tutorial's own\nsubscripts (001's ω_24) are kept as it writes them.\n")
    for number in args.tutorial or TUTORIALS:
        title, steps = TUTORIALS[number]
        print(f"=== tutorial {number}: {title}\n")
        if number in UNSEEDED:
            print(UNSEEDED[number] + "\n")
        for step in steps():
            print(f"{step.formula}:\n{show(step.value)}\n  what to see: {step.see}")
            if folder is not None and step.picture is not None:
                path = folder / f"{number}-{step.name}.png"
                draw(step, path)
                print(f"  picture: {path}")
            print()
    return 0


if __name__ == "__main__":
    exit_without_teardown(run_cli(main))
