"""python scripts/tutorials.py [000 001 002 003 004] [--lang en|zh] [--png DIR]: the five tutorials' worked examples,
recomputed with this project's attention code; --png also draws each attention matrix into DIR."""
from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from typing import Callable, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import quiet_while_loading  # noqa: E402

loaded = quiet_while_loading(__name__)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from errors import ArgumentParser, UserError, output_folder, run_cli  # noqa: E402
from model.scoring import additive_scores, attend, dot_product_scores  # noqa: E402
from model.textbook import Head, masked_softmax, valid_key_mask  # noqa: E402
loaded()

Say = Callable[[str, str], str]  # say(english, chinese): the words in the language asked for


def speaker(lang: str) -> Say:
    return (lambda english, chinese: chinese) if lang == "zh" else (lambda english, chinese: english)


ENGLISH = speaker("en")
LANG_HELP = "the language of the words around the numbers: English or Chinese (中文)"


class Picture(NamedTuple):
    """How --png draws a step."""
    rows: list[str]
    columns: list[str]
    row_axis: str
    column_axis: str
    masked: torch.Tensor | None = None  # True where masked out
    kind: str = "weights"  # weights | mask | gradient (signed, one fixed scale) | curve
    panels: tuple[str, ...] = ()  # one title per leading batch entry
    masked_means: str = ""  # the legend of the masked cells
    line: torch.Tensor | None = None  # kind "curve": (2, n) points drawn as a line under the value's points
    title: str = ""  # "": the step's formula


class Step(NamedTuple):
    """One printed step; cell is the tutorial's notebook cell it reproduces ("" where none does)."""
    name: str
    formula: str
    value: torch.Tensor
    see: str
    picture: Picture | None = None
    cell: str = ""


def causal(n: int) -> torch.Tensor:
    return torch.tril(torch.ones(n, n, dtype=torch.bool))


def counted(n: int, word: str = "") -> list[str]:
    return [f"{word}{i}" for i in range(1, n + 1)]


def future(say: Say) -> str:
    return say("masked: its score was set to -inf before the softmax, so its weight is 0",
               "被掩码遮住：softmax 之前它的注意力分数设为 -inf，权重因此为 0")


def causal_picture(n: int, say: Say, title: str = "") -> Picture:
    return Picture(counted(n), counted(n), say("token t (query)", "token t（查询）"),
                   say("token s (key)", "token s（键）"), ~causal(n), masked_means=future(say), title=title)


def head_with(w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, block_size: int) -> Head:
    """The textbook Head computing q = x @ w_q, k = x @ w_k, v = x @ w_v (nn.Linear holds each transposed)."""
    head = Head(*w_q.shape, block_size, bias=False)
    with torch.no_grad():
        for layer, w in ((head.query, w_q), (head.key, w_k), (head.value, w_v)):
            layer.weight.copy_(w.T)
    return head


def tutorial_000(say: Say = ENGLISH) -> list[Step]:
    torch.manual_seed(1337)
    B, T, C = 2, 8, 2
    x = torch.rand(B, T, C)
    loop = torch.stack([torch.stack([x[b, :t + 1].mean(0) for t in range(T)]) for b in range(B)])
    tril = torch.tril(torch.ones(T, T))
    averaging = tril / tril.sum(1, keepdim=True)
    by_softmax = F.softmax(torch.zeros(T, T).masked_fill(tril == 0, float("-inf")), dim=-1)
    # A head that learns whom to average, first without values (weights @ its input).
    torch.manual_seed(1337)
    C, head_size = 32, 16
    x_head = torch.rand(4, T, C)
    w_k, w_q, w_v = (torch.randn(C, head_size) / math.sqrt(C) for _ in range(3))
    k, q, v = x_head @ w_k, x_head @ w_q, x_head @ w_v
    scores = dot_product_scores(q, k, scaled=False)
    no_values, weights = attend(scores, x_head, causal(T))
    with_values, _ = attend(scores, v, causal(T))
    right, right_weights = attend(dot_product_scores(q, k, scaled=True), v, causal(T))
    torch.manual_seed(1337)
    qn, kn = torch.randn(64, T, head_size), torch.randn(64, T, head_size)
    raw = qn @ kn.transpose(-2, -1)
    a = torch.tensor([-0.4427, 0.8926, -0.7062, -0.7538, 1.3745, -0.1691, -1.4154, -0.6329])
    return [
        Step("x", say("x: 2 sequences of 8 tokens of 2 numbers; sequence 1 (x[0])",
                      "x：2 个序列，各 8 个 token，每个 2 维；这里是第 1 个序列 x[0]"), x[0],
             say("random, one row per token: only the shape matters", "随机数，每个 token 一行；要紧的只是它的形状"),
             cell="In [5]-[6]"),
        Step("loop", say("xbow: the mean of tokens 1..t of sequence 1, by a loop",
                         "xbow：用循环求第 1 个序列中 token 1..t 的平均"), loop[0],
             say("row t: the mean of x's rows 1..t", "第 t 行是 x 前 t 行的平均"), cell="In [10]-[12]"),
        Step("averaging", "wei = tril(ones(8, 8)) / " + say("row sums", "行和"), averaging,
             say("the same average as a matrix: row t holds t weights of 1/t, then zeros (the future)",
                 "把同样的平均写成矩阵：第 t 行是 t 个 1/t，后面是 0（未来）"),
             causal_picture(T, say), cell="In [17]"),
        Step("softmax_average", say("wei = softmax(zeros, the future -inf)", "wei = softmax(全 0，未来为 -inf)"),
             by_softmax, say("the same matrix: equal scores, equal weights; exp(-inf) = 0",
                             "还是同一个矩阵：注意力分数相等，权重就相等；exp(-inf) = 0"),
             causal_picture(T, say), cell="In [21]"),
        Step("averaging_gap", "max |xbow - wei @ x| (xbow2, xbow3)",
             torch.tensor([(loop - averaging @ x).abs().max(), (loop - by_softmax @ x).abs().max()]),
             say("0 up to float32 rounding: one average three ways", "都是 0（只差 float32 舍入）：三种做法，同一个平均"),
             cell="In [18]-[19], [23]-[24]"),
        Step("kq_scores", say("wei[0] = q @ kᵀ, not scaled yet", "wei[0] = q @ kᵀ，还没有缩放"), scores[0],
             say("raw scores, the future too: not weights yet (the page's S)",
                 "原始的注意力分数，未来的也在：还不是权重（页面上的 S）"), cell="In [31]-[32]"),
        Step("kq_weights", say("wei = softmax(wei, the future -inf), no 1/√16 (its 3.3 adds it)",
                               "wei = softmax(wei，未来为 -inf)，没有 1/√16（教程 3.3 节才加）"),
             weights[0], say("rows sum to 1, but q·k now chooses the weights", "每行之和仍为 1，但权重由 q·k 决定"),
             causal_picture(T, say, "wei = softmax(q·kᵀ, future = -inf), sequence 1, no scale"), cell="In [33]"),
        Step("no_values_shape", say("out = wei @ x, no values", "out = wei @ x，不用值"), torch.tensor(no_values.shape),
             say("32 numbers, as x: nothing projected x", "每个 token 32 维，和 x 一样：x 没有经过投影"), cell="In [34]"),
        Step("values_shape", "out = wei @ v, v = x @ W_v", torch.tensor(with_values.shape),
             say("16 numbers, the head's: each token gives its value, not itself",
                 "16 维，即头的维度：每个 token 给出的是值 v，不是 x 本身"), cell="In [36]-[37]"),
        Step("variance", say("var(q), var(k), var(wei = q·k), var(q·k/√16)",
                             "var(q)、var(k)、var(wei = q·k)、var(q·k/√16)"),
             torch.stack([qn.var(), kn.var(), raw.var(), (raw / math.sqrt(head_size)).var()]),
             say("about 1, 1, 16 (a sum of 16 products), 1", "约为 1、1、16（16 个乘积之和）、1"), cell="In [39]-[42]"),
        Step("a", say("a: the tutorial's 8 printed numbers", "a：教程打印出的 8 个数"), a,
             say("the 5th is the largest, the 2nd next", "第 5 个最大，第 2 个次之"), cell="In [44]"),
        Step("softmax_a", "b = softmax(a)", F.softmax(a, dim=-1),
             say("every entry keeps some weight", "每一项都分到一些权重"), cell="In [45]"),
        Step("softmax_10a", "b = softmax(a * 10)", F.softmax(a * 10, dim=-1),
             say("the largest takes 0.9920: large scores make the softmax nearly one-hot",
                 "最大的一项拿到 0.9920：注意力分数一大，softmax 就接近 one-hot"), cell="In [46]"),
        Step("scale_gap", "max |softmax(q·kᵀ/√d) v - softmax(q·kᵀ) v / √d|",
             (right - with_values * head_size ** -0.5).abs().max(),
             say("far from 0: the tutorial's out = wei @ v * head_size**-0.5 scales the output, not the scores",
                 "远不为 0：教程的 out = wei @ v * head_size**-0.5 缩放的是输出，不是注意力分数"), cell="In [48]"),
        Step("head_gap", "max |softmax(q·kᵀ/√d) v - Head(x)|",
             (right - head_with(w_q, w_k, w_v, T)(x_head)).abs().max().detach(),
             say("0: this project's Head scales before the softmax", "0：本项目的 Head 在 softmax 之前缩放")),
        Step("sharpest", say("the last row's largest weight, scaled and not", "最后一行的最大权重，缩放、不缩放"),
             torch.stack([right_weights[0, -1].max(), weights[0, -1].max()]),
             say("unscaled, one key takes more", "不缩放时权重更集中在一个键上")),
    ]


def tutorial_001(say: Say = ENGLISH) -> list[Step]:
    sentence = "Life is short, eat dessert first"
    words = sentence.replace(",", "").split()
    vocabulary = {word: i for i, word in enumerate(sorted(words))}
    ids = torch.tensor([vocabulary[w] for w in words])
    torch.manual_seed(123)
    x = torch.nn.Embedding(50_000, 3)(ids).detach()
    torch.manual_seed(123)
    w_q, w_k, w_v = torch.rand(3, 2), torch.rand(3, 2), torch.rand(3, 4)  # d_q = d_k = 2, d_v = 4
    other = torch.rand(8, 3)  # for cross-attention: the tutorial reseeds, draws these weights again, then this
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    omega = q @ k.T
    omega_2 = omega[1]
    alpha_2 = F.softmax(omega_2 / math.sqrt(2), dim=0)
    z, weights = attend(dot_product_scores(q, k), v)  # every query at once (no mask: 001 attends both ways)
    torch.manual_seed(123)
    heads = []
    for _ in range(4):
        wq_h, wk_h, wv_h = torch.rand(3, 2), torch.rand(3, 2), torch.rand(3, 1)
        heads.append(attend(dot_product_scores(x @ wq_h, x @ wk_h), x @ wv_h)[0])
    cross, cross_weights = attend(dot_product_scores(q, other @ w_k), other @ w_v)  # keys and values from other
    mask_simple = torch.tril(torch.ones(6, 6))  # 1. and 0., as the tutorial prints it
    masked_simple = weights * mask_simple
    renormalised = masked_simple / masked_simple.sum(1, keepdim=True)
    _, causal_weights = attend(dot_product_scores(q, k), v, causal(6))
    word_query, word_key = say("query (word)", "查询（词）"), say("key (word)", "键（词）")

    after = say("masked: its weight was set to 0 after the softmax", "被掩码遮住：softmax 之后权重置 0")

    def by_word(means: str | None = None) -> Picture:  # word by word, the future masked where means is
        return Picture(words, words, word_query, word_key, None if means is None else ~causal(6),
                       masked_means=means or "")
    return [
        Step("vocabulary", f"dc = {vocabulary}; sentence_int", ids,
             say("the sentence's words as their numbers in the sorted dc", "句中每个词换成它在排好序的 dc 里的编号"),
             cell="In [1]-[2]"),
        Step("embedding", "x = embedded_sentence = Embedding(50000, 3)(ids)" + say(", seed 123", "，种子 123"), x,
             say("a row x⁽ⁱ⁾ of 3 per word: the tutorial's numbers", "每个词一行 x⁽ⁱ⁾，3 维：和教程的数相同"), cell="In [4]"),
        Step("W_q", "W_q (W_query, 3 x 2)", w_q, say("3 rows (the embedding) by d_q = 2", "3 行（嵌入的维度）、2 列（d_q）"),
             cell="In [5]"),
        Step("W_k", "W_k (W_key, 3 x 2)", w_k, say("d_k = d_q, so that q·k exists", "d_k = d_q，查询和键才能做点积"),
             cell="In [5]"),
        Step("W_v", "W_v (W_value, 3 x 4)", w_v, say("d_v = 4 may differ: the output has 4 numbers",
                                                    "d_v 可以和 d_k 不同：这里是 4，上下文向量就是 4 维"), cell="In [5]"),
        Step("q_2", "query_2 = x⁽²⁾ @ W_q", q[1], say("the query of 'is'", "第 2 个词 'is' 的查询"), cell="In [7]"),
        Step("keys", "keys = x @ W_k", k, say("one key per word", "每个词一个键"), cell="In [8]"),
        Step("values", "values = x @ W_v", v, say("one value per word, to be mixed", "每个词一个值，之后按权重相加"),
             cell="In [8]"),
        Step("omega_24", "ω_24 = query_2 · keys[4]", omega_2[4],
             say("'is' against 'dessert', the 5th word: keys[4] counts from 0",
                 "'is' 对第 5 个词 'dessert'：keys[4] 的下标从 0 数起"), cell="In [11]"),
        Step("omega_2", say("ω_2 = query_2 @ keysᵀ: the unnormalised attention weights",
                            "ω_2 = query_2 @ keysᵀ：非归一化的注意力权重"), omega_2,
             say("the largest is 'is' against itself", "最大的是 'is' 对它自己"), cell="In [13]"),
        Step("alpha_2", "α_2 = attention_weights_2 = softmax(ω_2 / √d_k), d_k = 2", alpha_2,
             say("ω_2's order, summing to 1", "大小顺序和 ω_2 相同，但和为 1"),
             Picture(["q_2 (is)"], words, say("query", "查询"), word_key),
             cell="In [14]"),
        Step("z_2", "z⁽²⁾ = context_vector_2 = α_2 @ values", alpha_2 @ v,
             say("the context vector of 'is': mostly v's 2nd row", "'is' 的上下文向量：主要来自 v 的第 2 行"),
             cell="In [15]"),
        Step("Z", "context_vec = softmax(attn_scores / √d_k) @ values", z,
             say("every word at once; row 2 is z⁽²⁾", "一次算出所有词的上下文向量；第 2 行就是 z⁽²⁾"),
             cell="In [18]-[19]"),
        Step("multi_head", "[head_1(x) | ... | head_4(x)], d_v = 1", torch.cat(heads, -1),
             say("4 heads side by side, one column each", "4 个头拼接，每个头一列"), cell="In [24]-[25]"),
        Step("cross_weights", say("cross-attention weights softmax(q kᵀ / √d_k)", "交叉注意力的权重 softmax(q kᵀ / √d_k)"),
             cross_weights, say("keys from 8 other inputs: 6 x 8, not square", "键来自另外 8 个输入：6 行 8 列，不是方阵"),
             Picture(words, counted(8, say("input ", "输入 ")), word_query, say("key (the second input)", "键（第二个输入）")),
             cell="In [26]-[28]"),
        Step("cross", "context_vectors", cross, say("one row per word of the sentence", "句子的每个词一行"),
             cell="In [28]"),
        Step("scores", "attn_scores = queries @ keysᵀ", omega,
             say("every ω; row 2 is ω_2; no mask yet", "全部的 ω，第 2 行就是 ω_2；还没有加掩码"), cell="In [29]"),
        Step("weights", "attn_weights = softmax(attn_scores / √d_k)", weights,
             say("every α; row 2 is α_2", "全部的 α，第 2 行就是 α_2；每个词也看后面的词"),
             by_word(), cell="In [30]"),
        Step("mask_simple", "mask_simple = tril(ones(6, 6))", mask_simple,
             say("1 where a word may look, 0 at later words", "能看的位置是 1，后面的词是 0"), cell="In [32]"),
        Step("masked_simple", "masked_simple = attn_weights * mask_simple", masked_simple,
             say("zeroed after the softmax: rows no longer sum to 1", "softmax 之后置 0：各行之和不再是 1"),
             by_word(after), cell="In [33]"),
        Step("renormalised", "masked_simple_norm = masked_simple / " + say("row sums", "行和"), renormalised,
             say("rows sum to 1 again", "每行之和又是 1"),
             by_word(after),
             cell="In [34]"),
        Step("causal", say("softmax(ω / √d_k, the future -inf), as this project masks",
                           "softmax(ω / √d_k，未来为 -inf)，本项目的掩码做法"), causal_weights,
             say("the same: -inf before = zero after, renormalised", "结果相同：softmax 前填 -inf，和 softmax 后置 0 再归一化一样"),
             by_word(future(say))),
    ]


def padding_means(say: Say) -> str:
    return say("padding: its score was set to -inf before the softmax, so its weight is 0",
               "填充：softmax 之前它的注意力分数设为 -inf，权重因此为 0")


def padded(valid_lens: torch.Tensor, padding: str, say: Say) -> Picture:
    return Picture(counted(2), counted(4), say("query", "查询"), say("key", "键"),
                   ~valid_key_mask(valid_lens, 4, padding=padding),
                   panels=tuple(say(f"batch {b + 1}, valid_lens {valid_lens[b].tolist()}",
                                    f"第 {b + 1} 批，valid_lens {valid_lens[b].tolist()}") for b in range(2)),
                   masked_means=padding_means(say))


def tutorial_002(say: Say = ENGLISH) -> list[Step]:
    mask = valid_key_mask(torch.tensor([1, 2, 3]), 4, padding="right")
    torch.manual_seed(0)
    scores = torch.rand(2, 2, 4)
    per_row = masked_softmax(scores, torch.tensor([2, 3]), padding="right")
    lens_13_24 = torch.tensor([[1, 3], [2, 4]])
    per_query = masked_softmax(scores, lens_13_24, padding="right")
    left = masked_softmax(scores, torch.tensor([2, 3]), padding="left")
    lens_23 = torch.tensor([[2, 2], [3, 3]])
    with_1e6 = F.softmax(scores.masked_fill(~valid_key_mask(lens_23, 4, padding="right"), -1e6), dim=-1)
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
        Step("sequence_mask", "sequence_mask(valid_lens = [1, 2, 3])" + say(", 4 slots", "，共 4 个位置"), mask,
             say("row i: i real slots (True), then padding (False)", "第 i 行前 i 个位置有效（True），其余是填充（False）"),
             Picture(counted(3, "valid_len "),
                     counted(4), say("row", "行"), say("slot", "位置"), ~mask, kind="mask",
                     masked_means=say("padding (False)", "填充（False）")), cell="In [2]"),
        Step("scores", "X = torch.rand(2, 2, 4)" + say(", seed 0", "，种子 0"), scores,
             say("the scores: 2 batches of 2 queries by 4 keys", "注意力分数：2 批，每批 2 个查询、4 个键")),
        Step("per_row", "masked_softmax(X, [2, 3], padding='right')", per_row,
             say("one length per batch: batch 1 weighs keys 1-2, batch 2 keys 1-3",
                 "每批一个有效长度：第 1 批只看键 1-2，第 2 批只看键 1-3"),
             padded(lens_23, "right", say), cell="In [7]"),
        Step("minus_1e6_gap", "max |masked_softmax (-inf) - sequence_mask(X, valid_lens, -1e6)|",
             (per_row - with_1e6).abs().max(),
             say("0: exp(-1e6) is 0 in float32 too; -inf means 'never' at any scale",
                 "0：float32 里 exp(-1e6) 也是 0；而 -inf 不论分数多大都表示“不看”"), cell="In [3]"),
        Step("per_query", "masked_softmax(X, [[1, 3], [2, 4]], padding='right')", per_query,
             say("one length per query; a single key gets weight 1", "每个查询一个有效长度；只有一个键时权重正好是 1"),
             padded(lens_13_24, "right", say), cell="In [8]"),
        Step("left", "masked_softmax(X, [2, 3], padding='left')", left,
             say("the sampler keeps the LAST keys: padding first", "采样器的做法：保留最后几个键，填充在前面"),
             padded(lens_23, "left", say)),
        Step("additive_weights", say("additive attention: softmax(w_vᵀ tanh(W_q q + W_k k))",
                                     "加性注意力：softmax(w_vᵀ tanh(W_q q + W_k k))"), additive_weights[:, 0],
             say("identical keys, equal weights: 1/2, then 1/6", "键都一样，权重就相等：第 1 批各 1/2，第 2 批各 1/6"),
             Picture([say("batch 1", "第 1 批"), say("batch 2", "第 2 批")], counted(10), say("the query of", "查询所在的批"),
                     say("key", "键"), ~keep[:, 0], masked_means=padding_means(say)), cell="In [9]-[10]"),
        Step("additive", "AdditiveAttention", additive,
             say("the mean of the first 2, and 6, values, as the tutorial prints", "前 2 个、前 6 个值的平均，与教程相同"),
             cell="In [10]"),
        Step("dot_product", say("DotProductAttention, its cell never run", "DotProductAttention，教程里这个单元格没运行过"),
             dot, say("the same: identical keys score alike", "结果相同：键都一样，注意力分数也一样"), cell="In [None]"),
    ]


def y3_of(a: torch.Tensor) -> torch.Tensor:
    return F.softmax(torch.stack([a, a, 2 * a], dim=-1), dim=-1)[:, 2]


def tutorial_003(say: Say = ENGLISH) -> list[Step]:
    a = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    inputs = torch.stack([a, a, 2 * a], dim=-1)
    jacobians = [torch.autograd.functional.jacobian(lambda s: F.softmax(s, dim=0), x) for x in inputs]
    closed_form = [torch.diag(y) - torch.outer(y, y) for y in F.softmax(inputs, dim=-1)]
    curve_a = torch.tensor([0.0, 0.5, 1, 2, 3, 5, 10, 20, 50, 100], dtype=torch.float64)
    fine_a = torch.linspace(0, 100, 401, dtype=torch.float64)
    torch.manual_seed(0)
    T, d = 16, 512
    q, k, v = torch.randn(T, d), torch.randn(T, d), torch.randn(T, d)

    def through_softmax(scaled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The median norm of the gradient reaching each row's scores, and the mean largest weight per row."""
        scores = dot_product_scores(q, k, scaled=scaled).requires_grad_(True)
        out, weights = attend(scores, v, causal(T))
        out.square().sum().backward()  # any loss of the output will do; its gradient must pass the softmax
        rows = slice(1, None)  # row 1 has a single key: its weight is 1 either way
        return scores.grad[rows].norm(dim=-1).median(), weights.max(-1).values[rows].mean().detach()

    (scaled_grad, scaled_peak), (raw_grad, raw_peak) = through_softmax(True), through_softmax(False)
    seeing = {1: say("0.04 to 0.24: any input moves every output", "0.04 到 0.24：任何一个输入变化，所有输出都会变"),
              10: say("1e-4 and less: the gradient nearly vanished", "不超过 1e-4：梯度几乎消失"),
              100: say("1e-44 and less, or 0: no gradient at all", "不超过 1e-44，甚至是 0：梯度完全传不回去")}
    return [
        Step("y3", "y₃ = softmax([a, a, 2a])₃, a = 1, 10, 100", y3_of(a),
             say("large inputs make the output one-hot", "输入越大，输出越接近 one-hot")),
        Step("y3_curve", say("a and y₃: the tutorial's curve", "a 和 y₃（教程画的曲线）"),
             torch.stack([curve_a, y3_of(curve_a)]),
             say("0.9 by a = 3: it saturates early", "a = 3 时已到 0.9：很早就饱和了"),
             Picture([], [], "y₃", "a", kind="curve", line=torch.stack([fine_a, y3_of(fine_a)]),
                     title=say("y₃ = softmax([a, a, 2a])₃ against a", "y₃ = softmax([a, a, 2a])₃ 随 a 的变化"))),
        *(Step(f"jacobian_{v}", f"∂y_i/∂x_j, y = softmax(x), x = [{v}, {v}, {2 * v}]", jacobian, seeing[v],
               Picture(counted(3, "y_"), counted(3, "x_"),
                       say("output", "输出"), say("input", "输入"), kind="gradient"))
          for v, jacobian in zip((1, 10, 100), jacobians)),
        Step("jacobian_formula", "max |∂y/∂x - (diag(y) - y yᵀ)|",
             torch.stack([(j - c).abs().max() for j, c in zip(jacobians, closed_form)]).max(),
             say("0: autograd agrees with the tutorial's closed form", "0：autograd 的结果就是教程推导的公式")),
        Step("score_std", say(f"std of q·k, d_k = {d}: scaled, unscaled", f"q·k 的标准差（d_k = {d}），缩放、不缩放"),
             torch.stack([dot_product_scores(q, k).std(), dot_product_scores(q, k, scaled=False).std()]),
             say("about 1, and √512 = 22.6", "约为 1 和 √512 = 22.6")),
        Step("peak", say("mean largest weight per row: scaled, unscaled", "每行最大权重的平均，缩放、不缩放"),
             torch.stack([scaled_peak, raw_peak]),
             say("unscaled, nearly one-hot rows", "不缩放时，每行几乎只看一个键")),
        Step("gradient_norms", say("median |∂loss/∂scores| per row: scaled, unscaled",
                                   "每行 |∂loss/∂scores| 的中位数，缩放、不缩放"), torch.stack([scaled_grad, raw_grad]),
             say("unscaled, about 2000 times smaller: the gradient vanishes", "不缩放时小了约 2000 倍：梯度消失")),
    ]


def blog_004() -> tuple[torch.Tensor, ...]:
    """004's three embedded tokens a¹, a², a³ and its W_q, W_k, W_v (4 x 3): small integers, checked by hand."""
    return tuple(torch.tensor(rows, dtype=torch.float32) for rows in (
        [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], [[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]],
        [[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], [[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]]))


def tutorial_004(say: Say = ENGLISH) -> list[Step]:
    x, w_q, w_k, w_v = blog_004()
    k, q, v = x @ w_k, x @ w_q, x @ w_v
    scores_1 = q[0] @ k.T
    rounded = torch.tensor([0.0, 0.5, 0.5])
    weights_1 = F.softmax(scores_1, dim=0)
    scaled_1 = F.softmax(scores_1 / math.sqrt(3), dim=0)

    def row_1(title: str) -> Picture:
        return Picture(["token 1"], counted(3, "token "), say("query", "查询"), say("key", "键"), title=title)
    return [
        Step("x", say("a¹, a², a³: the blog's three inputs, already embedded", "a¹、a²、a³：博客的三个输入，已经嵌入，各 4 维"),
             x, say("small integers: every step can be checked by hand", "都是小整数，每一步都能手算验证")),
        Step("W_q", say("W_q, the query weights (4 x 3)", "W_q，查询的权重（4 x 3）"), w_q,
             say("each input becomes a query of 3 numbers", "4 行（输入的维度）、3 列（d）：每个输入变成 3 维的查询")),
        Step("W_k", say("W_k, the key weights (4 x 3)", "W_k，键的权重（4 x 3）"), w_k,
             say("the same shape as W_q, so that q·k exists", "形状和 W_q 相同，查询和键才能做点积")),
        Step("W_v", say("W_v, the value weights (4 x 3)", "W_v，值的权重（4 x 3）"), w_v,
             say("each token's value has 3 numbers", "每个 token 的值是 3 维")),
        Step("keys", say("kⁱ = aⁱ W_k, every token's key", "kⁱ = aⁱ W_k，每个 token 的键"), k,
             say("one key per token (3 x 3)", "每个 token 一个键（3 x 3），都是整数")),
        Step("queries", "qⁱ = aⁱ W_q", q, say("token 1's query is [1, 0, 2]", "每个 token 一个查询：token 1 的是 [1, 0, 2]")),
        Step("values", "vⁱ = aⁱ W_v", v, say("one value per token: what the weights mix", "每个 token 一个值：输出就是它们的加权和")),
        Step("scores_1", say("token 1's scores q¹ · kʲ (the blog's α₁,ⱼ without its / √d)",
                             "token 1 的注意力分数 q¹ · kʲ（博客的 α₁,ⱼ，但没有除以 √d）"), scores_1,
             say("[2, 4, 4]: tokens 2 and 3 match equally, better than token 1 itself",
                 "[2, 4, 4]：token 2 和 3 匹配得一样好，都比 token 1 自己好")),
        Step("blog_output_1", say("b¹ as the blog computes it: α̂₁ = softmax([2, 4, 4]) rounded to [0, 0.5, 0.5]",
                                  "博客算出的 b¹：它把 α̂₁ = softmax([2, 4, 4]) 舍入成 [0, 0.5, 0.5]"),
             rounded @ v, say("[2.0, 7.0, 1.5], the blog's figure", "[2.0, 7.0, 1.5]，即博客的结果")),
        Step("weights_1", say("α̂₁ = softmax([2, 4, 4]) exactly", "α̂₁ = softmax([2, 4, 4]) 的精确值"), weights_1,
             say("0.0634 is not 0", "0.0634 不是 0：token 1 仍然从自己那里取一点"),
             row_1("α̂₁ = softmax(q¹ · kᵀ), no scale")),
        Step("output_1", say("b¹ = Σⱼ α̂₁,ⱼ vʲ exactly", "b¹ = Σⱼ α̂₁,ⱼ vʲ 的精确值"), weights_1 @ v,
             say("near [2.0, 7.0, 1.5], not equal: the rounding moved every number",
                 "接近 [2.0, 7.0, 1.5] 但不相等：舍入改变了每一个数")),
        Step("scaled_weights_1", say("with the 1/√d its formula has and its numbers leave out (d = 3): α̂₁ = "
                                     "softmax([2, 4, 4] / √3)", "加上博客公式里有、算例里却漏掉的 1/√d（d = 3）："
                                     "α̂₁ = softmax([2, 4, 4] / √3)"), scaled_1,
             say("flatter: token 1 keeps more of its own value", "更平缓：token 1 拿到更多它自己的值"),
             row_1("α̂₁ = softmax(q¹ · kᵀ / √3)")),
        Step("scaled_output_1", say("and b¹ then", "这时的 b¹"), scaled_1 @ v,
             say("token 1's output as the formula has it", "按公式算出的 token 1 的输出")),
        Step("all_outputs", say("b¹, b², b³ at once: softmax(q kᵀ / √3) v", "一次算出 b¹、b²、b³：softmax(q kᵀ / √3) v"),
             attend(dot_product_scores(q, k), v)[0],
             say("row 1 is b¹ above; rows 2 and 3 the blog leaves to the reader",
                 "第 1 行就是上面的 b¹；第 2、3 行博客留给读者自己算")),
    ]


TUTORIALS = {
    "000": (("the maths of self-attention: averaging the past, keys and queries, values, the 1/√d scale",
             "自注意力的基本数学：对前面取平均、键和查询、值、1/√d 缩放"), tutorial_000),
    "001": (("a worked example: 'Life is short, eat dessert first'", "一个完整的例子：'Life is short, eat dessert first'"),
            tutorial_001),
    "002": (("scoring functions: masked softmax with valid lengths, additive and dot-product attention",
             "注意力分数：带有效长度的掩码 softmax、加性注意力和缩放点积注意力"), tutorial_002),
    "003": (("the softmax's input, its gradient, and why q·k is divided by √d_k",
             "softmax 的输入、它的梯度，以及 q·k 为什么要除以 √d_k"), tutorial_003),
    "004": (("the blog's three-token example, without its rounding", "博客里三个 token 的例子，不做舍入"), tutorial_004),
}
# Each tutorial's names, and the attention page's (S, A and A·V).
LEGENDS = {
    "000": ("000's names: x the input; xbow the past's average; wei the weights; out = wei @ v. On the attention "
            "page, wei is S before the softmax and A after it; out is A·V.",
            "000 中的记号：x 是输入；xbow 是对前面 token 的平均；wei 是权重矩阵；out = wei @ v。"
            "在注意力页面上，softmax 之前的 wei 叫 S，之后叫 A；out 叫 A·V。"),
    "001": ("001's names: x = embedded_sentence, x⁽ⁱ⁾ its rows; ω (omega, attn_scores) = q·k, "
            "unnormalised; α (attention_weights_2, attn_weights) = softmax(ω / √d_k); z (context_vector_2, "
            "context_vec) = α @ values. On the attention page ω is S, ω / √d_k the scaled S, α is A and z is A·V.",
            "001 中的记号：x = embedded_sentence，x⁽ⁱ⁾ 是它的第 i 行；ω（omega，attn_scores）= "
            "q·k，即非归一化的注意力权重；α（attention_weights_2，attn_weights）= softmax(ω / √d_k)；z（context_vector_2，"
            "context_vec）= α @ values。在注意力页面上，ω 叫 S，ω / √d_k 是缩放后的 S，α 叫 A，z 叫 A·V。"),
    "002": ("002's names: X the scores; valid_lens how many keys are real (per row or query); a(q, k): additive "
            "w_vᵀ tanh(W_q q + W_k k), or scaled dot-product q·k / √d; attention weights = masked_softmax(scores, "
            "valid_lens). On the attention page the scores are S (scaled: S / √d) and the weights A.",
            "002 中的记号：X 是注意力分数；valid_lens 是有效长度，即每行（或每个查询）有几个有效的键；打分函数 a(q, k) 可以是"
            "加性注意力 w_vᵀ tanh(W_q q + W_k k)，也可以是缩放点积 q·k / √d；注意力权重 = masked_softmax(scores, "
            "valid_lens)。在注意力页面上，注意力分数叫 S（缩放后是 S / √d），注意力权重叫 A。"),
    "003": ("003's names: Q, K, V; x the softmax's input, here [a, a, 2a]; y = softmax(x), y₃ its third entry; d_k "
            "the width of q and k. Its question, whether (Q, V), (K, V) or V alone would do, is what the ladder's "
            "rungs shared_qk, no_values and average measure (docs/attention.md).",
            "003 中的记号：Q、K、V 是查询、键和值；x 是 softmax 的输入，这里是 [a, a, 2a]；y = softmax(x)，y₃ 是它的第三项；"
            "d_k 是 q 和 k 的维度。它的思考题“只用 (Q, V)、(K, V) 或 V 行不行”，由阶梯实验的 shared_qk、no_values 和 "
            "average 几级来回答（docs/attention.md）。"),
    "004": ("004's names: aⁱ the embedded input; qⁱ, kⁱ, vⁱ; α₁,ⱼ = q¹·kʲ / √d the scaled scores; α̂₁,ⱼ = "
            "softmax(α₁) the weights; b¹ = Σⱼ α̂₁,ⱼ vʲ the output. On the attention page α is the scaled S, α̂ is A "
            "and b is A·V.",
            "004 中的记号：aⁱ 是嵌入后的输入；qⁱ、kⁱ、vⁱ 是查询、键和值；α₁,ⱼ = q¹·kʲ / √d 是缩放后的注意力分数；"
            "α̂₁,ⱼ = softmax(α₁) 是权重；b¹ = Σⱼ α̂₁,ⱼ vʲ 是输出。在注意力页面上，α 是缩放后的 S，α̂ 叫 A，b 叫 A·V。"),
}
# Where a tutorial drew random numbers without a seed, one line says which figures cannot be repeated.
UNSEEDED = {
    "000": ("note: tutorial 000 set no seed, so its x (x[0][0] = 0.0687 there) and what follows cannot be matched; "
            "this script seeds torch.manual_seed(1337) (x[0][0] = 0.0783 here). The rest matches.",
            "注意：教程 000 没有设随机种子，它的 x（那里 x[0][0] = 0.0687）和由 x 算出的数都无法重现；本脚本用 "
            "torch.manual_seed(1337)（这里 x[0][0] = 0.0783）。其余都能对上。"),
    "002": ("note: tutorial 002 drew its scores with torch.rand and no seed (0.4497 0.5503 there); this script seeds "
            "torch.manual_seed(0). The rest matches.",
            "注意：教程 002 用 torch.rand 生成注意力分数，没有设随机种子（它的第一行权重是 0.4497、0.5503）；本脚本用 "
            "torch.manual_seed(0)。其余都能对上。"),
}
COUNTING = ("Tokens, rows and columns are counted from 1 here, as on the attention page and in the walkthrough; a "
            "tutorial's own\nnames and subscripts (001's ω_24, 000's x[0]) stay as written; [NNN In [n]] names its "
            "notebook cell.\n",
            "这里的 token、行和列都从 1 开始数，和注意力页面、逐步演示一致；教程自己的记号和下标（001 的 ω_24、000 的 x[0]）\n"
            "保持原样，对应的 Notebook 单元格写作 [NNN In [n]]。\n")


def show(value: torch.Tensor) -> str:
    """A value as printed: 4 decimals (scientific where all are below 0.001), whole numbers as torch prints them."""
    value = value.detach()
    if value.dim() == 0:
        return f"  {value.item():.4f}"
    if value.dim() > 2:
        return "\n".join(show(part) for part in value)
    rows = value.reshape(-1, value.size(-1)).tolist()
    floats = value.is_floating_point()
    finite = value[value.isfinite()].abs() if floats else value
    small = floats and finite.numel() > 0 and 0 < finite.max() < 1e-3
    whole = not floats or (finite.numel() == value.numel() and bool((value == value.round()).all()))
    width = max(len(str(int(v))) for row in rows for v in row) if whole else 0

    def number(v) -> str:
        if value.dtype == torch.bool:
            return f"{v!s:>5}"
        if whole:  # ids, lengths, shapes; 1. and 0.
            return f"{int(v):>{width}d}{'.' if floats else ''}"
        if not math.isfinite(v):
            return f"{'-inf':>{12 if small else 8}}"
        return f"{v:12.4e}" if small else f"{v:8.4f}"
    start = "  [ " if whole and value.dtype != torch.bool else "  ["
    return "\n".join(start + "  ".join(map(number, row)) + " ]" for row in rows)


# ---- --png: each attention matrix drawn as a heatmap
GRADIENT_RANGE = 0.25  # one scale for every Jacobian, so that small looks small


def figure_of(step: Step, say: Say = ENGLISH):
    """step's value as a heatmap per panel, each cell's number in it, the masked cells hatched (or a curve)."""
    from common.pictures import MASKED_FILL, MASKED_HATCH, Patch, Rectangle, plt

    picture, hatched = step.picture, {"facecolor": MASKED_FILL, "edgecolor": MASKED_HATCH, "hatch": "///"}
    if picture.kind == "curve":
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100, layout="constrained")
        ax.plot(*picture.line.double().numpy(), color="C0", linewidth=1.5)
        ax.plot(*step.value.double().numpy(), "o", color="C3", markersize=4)
        ax.set(xlabel=picture.column_axis, ylabel=picture.row_axis)
        ax.set_title(picture.title or step.formula, fontsize=11)
        ax.grid(alpha=0.3)
        return fig
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
                                      say("∂y_i/∂x_j (one scale for all three)", "∂y_i/∂x_j（三张图同一个色标）"))
    else:
        cmap, low, high, bar_label = "viridis", 0.0, 1.0, say("attention weight", "注意力权重")
    slanted = max(map(len, picture.columns)) > 3
    for panel, ax in enumerate(axes[0]):
        shown = ~masked[panel] if picture.kind == "mask" else value[panel]
        image = ax.imshow(shown.float().numpy(), cmap=cmap, vmin=low, vmax=high)
        for i in range(n_rows):
            for j in range(n_cols):
                v, hidden = float(value[panel, i, j]), bool(masked[panel, i, j])
                if hidden:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, **hatched, linewidth=0))
                if picture.kind == "mask":
                    label, dark = str(not hidden), False
                elif hidden:
                    continue
                elif picture.kind == "gradient":
                    label = f"{v:.2f}" if v == 0 or abs(v) >= 0.005 else f"{v:.1e}"
                    dark = abs(v) > 0.6 * GRADIENT_RANGE
                else:
                    label, dark = f"{v:.2f}", v < 0.5
                ax.text(j, i, label, ha="center", va="center", fontsize=8 if len(label) <= 5 else 6.5,
                        color="white" if dark else "black")
        ax.set_xticks(range(n_cols), picture.columns, rotation=45 if slanted else 0,
                      ha="right" if slanted else "center", fontsize=8)
        ax.set_yticks(range(n_rows), picture.rows, fontsize=8)
        ax.set_xlabel(picture.column_axis, fontsize=9)
        ax.set_ylabel(picture.row_axis, fontsize=9)
        if picture.panels:
            ax.set_title(picture.panels[panel], fontsize=9)
    fig.suptitle(picture.title or step.formula, fontsize=11)
    if picture.kind != "mask":
        fig.colorbar(image, ax=axes[0].tolist(), label=bar_label, shrink=0.9)
    if masked.any():
        fig.legend(handles=[Patch(**hatched, label=picture.masked_means)], loc="outside lower center", fontsize=8,
                   frameon=False)
    return fig


def draw(step: Step, path: Path, say: Say = ENGLISH) -> None:
    """figure_of(step) written to path whole, with a font for Chinese where there is one."""
    from common.pictures import font_for, plt, save_figure

    with plt.rc_context({"font.family": ["DejaVu Sans", *filter(None, [font_for("注")])]}):
        fig = figure_of(step, say)
        save_figure(fig, path, "--png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split(": ", 1)[1].strip())
    parser.add_argument("tutorial", nargs="*", metavar="NNN", help=f"which ones ({', '.join(TUTORIALS)}; default: all)")
    parser.add_argument("--lang", choices=("en", "zh"), default="en", help=LANG_HELP)
    parser.add_argument("--png", metavar="DIR", default="",
                        help="also draw each attention matrix (and 003's curve) into this folder")
    args = parser.parse_args(argv)
    for number in args.tutorial:
        if number not in TUTORIALS:
            raise UserError(f"no tutorial {number}; choose from {', '.join(TUTORIALS)}")
    say = speaker(args.lang)
    if args.png and args.lang == "zh":
        from common.pictures import INSTALL_HINT, font_for
        if font_for("注") is None:
            raise UserError(f"--png --lang zh: no installed font draws Chinese; {INSTALL_HINT}, or use --lang en")
    with output_folder(Path(args.png), "--png") if args.png else contextlib.nullcontext() as folder:
        print(say(*COUNTING))
        for number in dict.fromkeys(args.tutorial) or TUTORIALS:  # each once, in the order given
            titles, steps = TUTORIALS[number]
            print(say(f"=== tutorial {number}: ", f"=== 教程 {number}：") + say(*titles) + "\n")
            for words in (LEGENDS[number], UNSEEDED.get(number)):
                if words:
                    print(say(*words) + "\n")
            for step in steps(say):
                cell = f" [{number} {step.cell}]" if step.cell else ""
                print(f"{step.formula}{cell}{say(':', '：')}\n{show(step.value)}\n  {say('what to see: ', '要点：')}"
                      f"{step.see}")
                if folder is not None and step.picture is not None:
                    path = folder / f"{number}-{step.name}.png"
                    draw(step, path, say)
                    print(f"  {say('picture: ', '图：')}{path}")
                print()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
