"""python scripts/tutorials.py [000 001 002 003 004] [--lang en|zh] [--png DIR]: the worked examples of the five
self-attention tutorials this project grew from, recomputed step by step with this project's attention code, each step
printed with its formula, the tutorial's own names and cell, and what to see in it, in English or Chinese; with --png,
every attention matrix it prints (and 003's curve) is also drawn into DIR."""
from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from typing import Callable, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import quiet_while_loading  # noqa: E402

loaded = quiet_while_loading(__name__)  # a Ctrl-C while torch loads: one line, not the import's traceback

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


class Picture(NamedTuple):
    """How --png draws a printed matrix: the tutorial's symbols as its title and axis names, a label per row and
    column (positions counted from 1), and the masked cells, hatched grey, unlike any weight. kind "curve" draws the
    value's two rows (x, then y) as points, over line, the same curve finely sampled."""
    title: str
    rows: list[str]
    columns: list[str]
    row_axis: str
    column_axis: str
    masked: torch.Tensor | None = None  # True where masked out (-inf before the softmax, or padding); value's shape
    kind: str = "weights"  # weights (0 to 1) | mask (True/False) | gradient (signed, one fixed scale) | curve
    panels: tuple[str, ...] = ()  # the panels' titles where the value has a leading batch axis
    masked_means: str = "masked: its score was set to -inf before the softmax, so its weight is 0"
    line: torch.Tensor | None = None  # kind "curve": (2, n) points drawn as a line under the printed ones


class Step(NamedTuple):
    """One printed step: a short name (the tests look steps up by it), the formula or sentence it illustrates (with
    the tutorial's own names), its value, a sentence saying what to see in that value, how --png draws it (None: a
    value that is not an attention matrix, not drawn), and the tutorial's notebook cell it reproduces ("" where the
    tutorial has no cell for it)."""
    name: str
    formula: str
    value: object
    see: str
    picture: Picture | None = None
    cell: str = ""


# The tutorial's own printed a (tutorial 000, "softmax is sensitive to scale"): its numbers, so its softmax can be
# matched although its x cannot.
TUTORIAL_000_A = [-0.4427, 0.8926, -0.7062, -0.7538, 1.3745, -0.1691, -1.4154, -0.6329]


def causal(n: int) -> torch.Tensor:
    return torch.tril(torch.ones(n, n, dtype=torch.bool))


def counted(n: int, word: str = "") -> list[str]:
    """Labels 1..n (positions are counted from 1 here, as on the attention page), each after word if one is given."""
    return [f"{word}{i}" for i in range(1, n + 1)]


def future(say: Say) -> str:
    """What a hatched cell of a causal picture means."""
    return say("masked: its score was set to -inf before the softmax, so its weight is 0",
               "被掩码遮住：softmax 之前它的分数被设为 -inf，所以权重为 0")


def causal_picture(title: str, n: int, say: Say) -> Picture:
    """An n x n picture of weights of tokens over tokens, counted from 1, the future hatched."""
    return Picture(title, counted(n), counted(n), say("token t (query)", "词元 t（查询）"),
                   say("token s (key)", "词元 s（键）"), ~causal(n), masked_means=future(say))


# ---- 000: averaging the past three ways, a head without and with values, the 1/√d scale ---------------------------
def tutorial_000(say: Say = ENGLISH) -> list[Step]:
    torch.manual_seed(1337)
    B, T, C = 2, 8, 2
    x = torch.rand(B, T, C)
    loop = torch.stack([torch.stack([x[b, :t + 1].mean(0) for t in range(T)]) for b in range(B)])
    tril = torch.tril(torch.ones(T, T))
    averaging = tril / tril.sum(1, keepdim=True)
    by_softmax = F.softmax(torch.zeros(T, T).masked_fill(tril == 0, float("-inf")), dim=-1)
    steps: list[Step] = [
        Step("x", say("x: 2 sequences of 8 tokens, 2 numbers each (sequence 1 shown, the tutorial's x[0])",
                      "x：2 个序列，每个 8 个词元，每个词元 2 个数（显示第 1 个序列，即教程的 x[0]）"), x[0],
             say("random numbers in [0, 1), one row per token: only their shape matters for what follows",
                 "[0, 1) 之间的随机数，每个词元一行：后面用到的只是它的形状"), cell="In [5]-[6]"),
        Step("loop", say("xbow: the mean of tokens 1..t of sequence 1, one position at a time (a loop)",
                         "xbow：第 1 个序列中词元 1..t 的平均，一个位置一个位置地算（循环）"), loop[0],
             say("row 1 is x's row 1, row 2 the mean of x's rows 1-2, ..., row 8 the mean of all 8 rows",
                 "第 1 行就是 x 的第 1 行，第 2 行是 x 第 1-2 行的平均……第 8 行是全部 8 行的平均"),
             cell="In [10]-[12]"),
        Step("averaging", say("wei = tril(ones(8, 8)), each row divided by its sum: the same average as a matrix",
                              "wei = tril(ones(8, 8))，每行除以它的和：同一个平均，写成矩阵"), averaging,
             say("row t holds t equal weights 1/t, then zeros (the future): row 1 is [1, 0, ...], row 8 is all 0.125",
                 "第 t 行有 t 个相等的权重 1/t，后面是 0（未来）：第 1 行是 [1, 0, ...]，第 8 行全是 0.125"),
             causal_picture("wei = tril(ones) / row sums", T, say), cell="In [17]"),
        Step("softmax_average", say("wei = softmax(zeros, the future set to -inf): the same matrix again",
                                    "wei = softmax(全 0，未来设为 -inf)：又是同一个矩阵"), by_softmax,
             say("the same numbers as the matrix above: equal scores give equal weights, and exp(-inf) gives 0",
                 "和上面的矩阵数值相同：相等的分数给出相等的权重，exp(-inf) 等于 0"),
             causal_picture("wei = softmax(zeros, future = -inf)", T, say), cell="In [21]"),
        Step("averaging_gap", say("max |xbow - wei @ x| for the matrix, then for the softmax (xbow2, xbow3)",
                                  "max |xbow - wei @ x|，先是矩阵的，再是 softmax 的（xbow2、xbow3）"),
             torch.tensor([(loop - averaging @ x).abs().max(), (loop - by_softmax @ x).abs().max()]),
             say("both 0 up to float32 rounding (1e-7 or less): the loop, the matrix and the softmax are one average",
                 "两者都是 0（只差 float32 舍入，1e-7 以内）：循环、矩阵和 softmax 算的是同一个平均"),
             cell="In [18]-[19], [23]-[24]"),
    ]
    # A head that learns whom to average: keys and queries from x; first without values (weights @ x).
    torch.manual_seed(1337)
    C, head_size = 32, 16
    x = torch.rand(4, T, C)
    w_k, w_q, w_v = (torch.randn(C, head_size) / math.sqrt(C) for _ in range(3))
    k, q, v = x @ w_k, x @ w_q, x @ w_v
    scores = dot_product_scores(q, k, scaled=False)  # the tutorial's cell: no scale yet (its section 3.3 adds it)
    no_values, weights = attend(scores, x, causal(T))
    with_values, _ = attend(scores, v, causal(T))
    steps += [Step("kq_scores", say("wei = q @ kᵀ of sequence 1: every query against every key, the future too, "
                                    "no scale yet (the tutorial's wei[0])",
                                    "wei = q @ kᵀ（第 1 个序列）：每个查询对每个键，未来的也算，还没有缩放（教程的 wei[0]）"),
                   scores[0], say("8 x 8 raw scores, positive and negative: not weights yet; on the attention page "
                                  "this is S", "8 x 8 个原始分数，有正有负：还不是权重；在注意力页面上这是 S"),
                   cell="In [31]-[32]"),
              Step("kq_weights", say("wei = softmax(wei, the future set to -inf) of sequence 1: learned weights "
                                     "instead "
                                     "of a plain average, with no 1/√16 (as the tutorial's cell; its section 3.3 adds "
                                     "the scale)", "wei = softmax(wei，未来设为 -inf)（第 1 个序列）：学到的权重代替了简单平均，"
                                     "没有 1/√16（和教程的这一格一样；它的 3.3 节才加上缩放）"), weights[0],
                   say("still zeros above the diagonal and rows summing to 1, but no longer equal: the products of "
                       "queries and keys choose whom each token averages",
                       "对角线以上仍是 0，每行之和仍为 1，但不再相等：查询和键的乘积决定每个词元平均谁"),
                   causal_picture("wei = softmax(q·kᵀ, future = -inf), sequence 1, no scale", T, say),
                   cell="In [33]"),
              Step("no_values_shape", say("out = wei @ x without values: as wide as x (32)",
                                          "没有值时 out = wei @ x：和 x 一样宽（32）"),
                   torch.tensor(no_values.shape),
                   say("4 sequences, 8 tokens, 32 numbers each: the width of x, not the head size 16, since nothing "
                       "projected x", "4 个序列，8 个词元，每个 32 个数：是 x 的宽度，不是头的大小 16，因为 x 没有被投影"),
                   cell="In [34]"),
              Step("values_shape", say("with values, out = wei @ v, v = x @ W_v: as wide as the head (16)",
                                       "有值时 out = wei @ v，v = x @ W_v：和头一样宽（16）"),
                   torch.tensor(with_values.shape),
                   say("4 sequences, 8 tokens, 16 numbers each: each token hands over its value, not itself",
                       "4 个序列，8 个词元，每个 16 个数：每个词元交出的是它的值，不是它自己"), cell="In [36]-[37]")]
    # The scale: q·k of unit-variance vectors has variance head_size; dividing by √head_size brings it back to 1.
    torch.manual_seed(1337)
    qn, kn = torch.randn(64, T, head_size), torch.randn(64, T, head_size)
    raw = qn @ kn.transpose(-2, -1)
    steps.append(Step("variance", say("var(q), var(k), var(wei = q·k), var(q·k/√16): the product's variance is "
                                      "about 16",
                                      "var(q)、var(k)、var(wei = q·k)、var(q·k/√16)：乘积的方差约为 16"),
                      torch.stack([qn.var(), kn.var(), raw.var(), (raw / math.sqrt(head_size)).var()]),
                      say("q and k near 1, q·k near 16 (a sum of 16 products of variance 1), and near 1 again after "
                          "dividing by √16", "q 和 k 接近 1，q·k 接近 16（16 个方差为 1 的乘积之和），除以 √16 后又接近 1"),
                      cell="In [39]-[42]"))
    # Softmax is sensitive to scale: the tutorial's own a, then the same numbers times 10.
    a = torch.tensor(TUTORIAL_000_A)
    steps += [
        Step("a", say("a: the tutorial's 8 printed numbers (its own draw, so its softmax can be matched)",
                      "a：教程打印的 8 个数（它自己抽的，所以它的 softmax 可以对上）"), a,
             say("the 5th number, 1.3745, is the largest; the 2nd, 0.8926, comes next",
                 "第 5 个数 1.3745 最大；第 2 个数 0.8926 其次"), cell="In [44]"),
        Step("softmax_a", "b = softmax(a)", F.softmax(a, dim=-1),
             say("every entry keeps some weight; the largest input takes 0.4110 and the 2nd 0.2538, as in the tutorial",
                 "每一项都留有一些权重；最大的输入得到 0.4110，第 2 个得到 0.2538，与教程相同"), cell="In [45]"),
        Step("softmax_10a", say("b = softmax(a * 10): the same order, ten times the spread",
                                "b = softmax(a * 10)：顺序不变，差距放大 10 倍"), F.softmax(a * 10, dim=-1),
             say("now the largest takes 0.9920 and the rest almost nothing: large scores make the softmax one-hot, "
                 "which is what unscaled q·k does at a large head size",
                 "现在最大的一项得到 0.9920，其余几乎为 0：分数大了，softmax 就接近 one-hot，头很大而 q·k 不缩放时正是这样"),
             cell="In [46]"),
    ]
    # 000 scales the output (wei @ v * head_size**-0.5) instead of the scores; that is a different thing.
    right, right_weights = attend(dot_product_scores(q, k, scaled=True), v, causal(T))
    wrong_weights = F.softmax((q @ k.transpose(-2, -1)).masked_fill(~causal(T), float("-inf")), dim=-1)
    wrong = wrong_weights @ v * head_size ** -0.5
    head = Head(C, head_size, T, bias=False)
    with torch.no_grad():
        for layer, w in ((head.key, w_k), (head.query, w_q), (head.value, w_v)):
            layer.weight.copy_(w.T)
    steps += [
        Step("scale_gap", say("max |softmax(q·kᵀ/√d) v - softmax(q·kᵀ) v / √d|: the tutorial's out = wei @ v * "
                              "head_size**-0.5 scales after the softmax, which is not the same",
                              "max |softmax(q·kᵀ/√d) v - softmax(q·kᵀ) v / √d|：教程的 out = wei @ v * head_size**-0.5 "
                              "在 softmax 之后才缩放，结果不同"), (right - wrong).abs().max(),
             say("far from 0: the tutorial's last cell (the output times 1/√d) gives other outputs than the formula",
                 "远不是 0：教程最后一格（把输出乘以 1/√d）算出的输出和公式的不同"), cell="In [48]"),
        Step("head_gap", say("max |softmax(q·kᵀ/√d) v - this project's Head(x)|: the model scales before the softmax",
                             "max |softmax(q·kᵀ/√d) v - 本项目的 Head(x)|：模型在 softmax 之前缩放"),
             (right - head(x)).abs().max().detach(),
             say("0: this project's Head computes the formula as written", "0：本项目的 Head 按公式原样计算")),
        Step("sharpest", say("largest weight in the last row of sequence 1, scaled before vs not scaled: the unscaled "
                             "softmax is sharper", "第 1 个序列最后一行的最大权重，先缩放与不缩放：不缩放的 softmax 更尖锐"),
             torch.stack([right_weights[0, -1].max(), wrong_weights[0, -1].max()]),
             say("the second (unscaled) is larger: without 1/√d one key takes more of the row",
                 "第二个（不缩放）更大：没有 1/√d，一个键拿走这一行更多的权重")),
    ]
    return steps


# ---- 001: "Life is short, eat dessert first" ------------------------------------------------------------------------
def tutorial_001(say: Say = ENGLISH) -> list[Step]:
    sentence = "Life is short, eat dessert first"
    words = sentence.replace(",", "").split()
    vocabulary = {word: i for i, word in enumerate(sorted(words))}
    ids = torch.tensor([vocabulary[w] for w in words])
    torch.manual_seed(123)
    x = torch.nn.Embedding(50_000, 3)(ids).detach()  # a 50,000-word table, 3 numbers per word
    torch.manual_seed(123)
    w_q, w_k, w_v = torch.rand(3, 2), torch.rand(3, 2), torch.rand(3, 4)  # d_q = d_k = 2, d_v = 4
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    omega = q @ k.T  # every query against every key: attn_scores
    omega_2 = omega[1]  # query 2 against every key
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
    mask_simple = causal(6)
    masked_simple = weights * mask_simple  # causal masking after the softmax, then renormalised...
    renormalised = masked_simple / masked_simple.sum(1, keepdim=True)
    _, causal_weights = attend(dot_product_scores(q, k), v, causal(6))  # ...equals masking before it
    word_query, word_key = say("query (word)", "查询（词）"), say("key (word)", "键（词）")
    return [
        Step("vocabulary", say("dc: the sorted words, numbered: ", "dc：排好序的词，各编一个号：") + str(vocabulary)
             + say("; sentence_int, the sentence as ids", "；sentence_int：句子的编号"), ids,
             say("the sentence's words as ids, in order: 'Life' is 0, 'is' 4, 'short' 5, 'eat' 2, 'dessert' 1, "
                 "'first' 3", "句子中的词按顺序换成编号：'Life' 是 0，'is' 4，'short' 5，'eat' 2，'dessert' 1，'first' 3"),
             cell="In [1]-[2]"),
        Step("embedding", say("x = embedded_sentence = Embedding(50000, 3)(ids), seed 123: one row x⁽ⁱ⁾ per word",
                              "x = embedded_sentence = Embedding(50000, 3)(ids)，种子 123：每个词一行 x⁽ⁱ⁾"), x,
             say("6 rows of 3 numbers, the tutorial's own (same seed): row 1 is 'Life', row 2 'is'",
                 "6 行，每行 3 个数，与教程的相同（同一个种子）：第 1 行是 'Life'，第 2 行是 'is'"), cell="In [4]"),
        Step("W_q", say("W_q (W_query, 3 x 2), seed 123", "W_q（W_query，3 x 2），种子 123"), w_q,
             say("3 rows (the embedding's width) by 2 (d_q): the tutorial's numbers",
                 "3 行（嵌入的宽度）乘 2 列（d_q）：与教程的数相同"), cell="In [5]"),
        Step("W_k", say("W_k (W_key, 3 x 2)", "W_k（W_key，3 x 2）"), w_k,
             say("as wide as W_q: a query and a key must have the same width to be multiplied",
                 "和 W_q 一样宽：查询和键必须一样宽才能相乘"), cell="In [5]"),
        Step("W_v", say("W_v (W_value, 3 x 4): d_v may differ", "W_v（W_value，3 x 4）：d_v 可以不同"), w_v,
             say("4 columns: each word's value, and so its output, has 4 numbers", "4 列：每个词的值（因此它的输出）有 4 个数"),
             cell="In [5]"),
        Step("q_2", say("query_2 = x⁽²⁾ @ W_q", "query_2 = x⁽²⁾ @ W_q"), q[1],
             say("the 2nd word's ('is') query: 2 numbers", "第 2 个词（'is'）的查询：2 个数"), cell="In [7]"),
        Step("keys", say("keys = x @ W_k", "keys = x @ W_k（键）"), k,
             say("one key per word, row by row: 6 x 2", "每个词一个键，一行一个：6 x 2"), cell="In [8]"),
        Step("values", say("values = x @ W_v", "values = x @ W_v（值）"), v,
             say("one value per word: 6 x 4, what each word hands over once chosen",
                 "每个词一个值：6 x 4，一个词被选中时交出的东西"), cell="In [8]"),
        Step("omega_24", say("ω_24 = query_2 · keys[4] (the 2nd word's query, the 5th word's key)",
                             "ω_24 = query_2 · keys[4]（第 2 个词的查询，第 5 个词的键）"), omega_2[4],
             say("'is' against 'dessert'; the tutorial's subscripts mix two counts (its code's keys[4] counts from 0)",
                 "'is' 对 'dessert'；教程的下标混用了两种数法（它代码里的 keys[4] 从 0 数）"), cell="In [11]"),
        Step("omega_2", say("ω_2 = query_2 @ keysᵀ: the unnormalised attention weights",
                            "ω_2 = query_2 @ keysᵀ：未归一化的注意力权重"), omega_2,
             say("one score per word; the 5th is ω_24 above, and the largest, 3.4707, is 'is' against itself",
                 "每个词一个分数；第 5 个就是上面的 ω_24，最大的 3.4707 是 'is' 对它自己"), cell="In [13]"),
        Step("alpha_2", say("α_2 = attention_weights_2 = softmax(ω_2 / √d_k), d_k = 2",
                            "α_2 = attention_weights_2 = softmax(ω_2 / √d_k)，d_k = 2"), alpha_2,
             say("the same order as ω_2, now summing to 1: 'is' takes 0.6870 of its context from itself",
                 "顺序和 ω_2 相同，但和为 1：'is' 的上下文有 0.6870 来自它自己"),
             Picture("α_2 = softmax(ω_2 / √d_k)", ["q_2 (is)"], words, say("query", "查询"), word_key),
             cell="In [14]"),
        Step("z_2", say("z⁽²⁾ = context_vector_2 = α_2 @ values: the 2nd word's context vector (4 numbers, as wide "
                        "as v)", "z⁽²⁾ = context_vector_2 = α_2 @ values：第 2 个词的上下文向量（4 个数，和 v 一样宽）"),
             alpha_2 @ v, say("a mix of the 6 rows of v, mostly the 2nd (weight 0.6870)",
                              "v 的 6 行的混合，主要是第 2 行（权重 0.6870）"), cell="In [15]"),
        Step("Z", say("context_vec = softmax(attn_scores / √d_k) @ values for every word at once (SelfAttention)",
                      "context_vec = softmax(attn_scores / √d_k) @ values，一次算出每个词（SelfAttention）"), z,
             say("row 2 is z⁽²⁾ above: one matrix product gives every word's context vector",
                 "第 2 行就是上面的 z⁽²⁾：一次矩阵乘法得到每个词的上下文向量"), cell="In [18]-[19]"),
        Step("multi_head", say("4 heads with d_v = 1, concatenated: [head_1(x) | ... | head_4(x)]",
                               "4 个 d_v = 1 的头，拼接起来：[head_1(x) | ... | head_4(x)]"), torch.cat(heads, -1),
             say("one column per head, each from its own W_q, W_k, W_v: the heads sit side by side",
                 "每个头一列，各有自己的 W_q、W_k、W_v：多个头并排放着"), cell="In [24]-[25]"),
        Step("cross_weights", say("cross-attention weights: softmax(q kᵀ / √d_k), queries from the 6 words, keys from "
                                  "8 other inputs", "交叉注意力的权重：softmax(q kᵀ / √d_k)，查询来自 6 个词，键来自另外 8 个输入"),
             cross_weights,
             say("6 rows by 8 columns: the matrix need not be square; each row (a word) sums to 1 over the other input",
                 "6 行 8 列：矩阵不必是方的；每行（一个词）在另一个输入上的和为 1"),
             Picture(say("cross-attention: softmax(q kᵀ / √d_k)", "交叉注意力：softmax(q kᵀ / √d_k)"), words,
                     counted(8, say("input ", "输入 ")), word_query, say("key (the second input)", "键（第二个输入）")),
             cell="In [26]-[28]"),
        Step("cross", say("cross-attention context_vectors: queries from the 6 words, keys and values from 8 other "
                          "inputs (6 x 4)", "交叉注意力的 context_vectors：查询来自 6 个词，键和值来自另外 8 个输入（6 x 4）"),
             cross, say("one row per word of the sentence, although keys and values came from 8 other inputs",
                        "句子的每个词一行，虽然键和值来自另外 8 个输入"), cell="In [28]"),
        Step("scores", say("attn_scores = queries @ keysᵀ: every ω, 6 x 6 (the omegas, unnormalised)",
                           "attn_scores = queries @ keysᵀ：全部的 ω，6 x 6（未归一化）"), omega,
             say("row 2 is ω_2 above; every word scores every word, the later ones too (no mask yet)",
                 "第 2 行就是上面的 ω_2；每个词给每个词打分，后面的词也算（还没有掩码）"), cell="In [29]"),
        Step("weights", say("attn_weights = softmax(attn_scores / √d_k), over each row: every α",
                            "attn_weights = softmax(attn_scores / √d_k)，对每一行：全部的 α"), weights,
             say("row 2 is α_2 above; each row sums to 1 and every word takes something from every word, the later "
                 "ones too", "第 2 行就是上面的 α_2；每行之和为 1，每个词从每个词那里都取一些，后面的词也一样"),
             Picture("attn_weights = softmax(ω / √d_k)", words, words, word_query, word_key), cell="In [30]"),
        Step("mask_simple", say("mask_simple = tril(ones(6, 6)): 1 where a word may look, 0 at the later words",
                                "mask_simple = tril(ones(6, 6))：能看的地方为 1，后面的词为 0"), mask_simple,
             say("row t keeps words 1..t: True on and below the diagonal",
                 "第 t 行保留词 1..t：对角线及以下为 True"), cell="In [32]"),
        Step("masked_simple", say("masked_simple = attn_weights * mask_simple: the weights with the later words "
                                  "zeroed, after the softmax", "masked_simple = attn_weights * mask_simple：在 softmax "
                                  "之后把后面的词的权重置 0"), masked_simple,
             say("the rows no longer sum to 1 (row 1 keeps only 0.1772): the next step renormalises them",
                 "各行之和不再是 1（第 1 行只剩 0.1772）：下一步重新归一化"),
             Picture("masked_simple = attn_weights * mask_simple", words, words, word_query, word_key, ~causal(6),
                     masked_means=say("masked: its weight was set to 0 after the softmax",
                                      "被掩码遮住：softmax 之后它的权重被置为 0")), cell="In [33]"),
        Step("renormalised", say("masked_simple_norm = masked_simple / its row sums",
                                 "masked_simple_norm = masked_simple / 每行之和"), renormalised,
             say("zeros above the diagonal (the future), and each row sums to 1 again",
                 "对角线以上为 0（未来），每行之和又是 1"),
             Picture("masked_simple / row sums (masked after the softmax)", words, words, word_query, word_key,
                     ~causal(6), masked_means=say("masked: its weight was set to 0 after the softmax, then each row "
                                                  "renormalised", "被掩码遮住：softmax 之后它的权重被置为 0，再把每行重新归一化")),
             cell="In [34]"),
        Step("causal", say("softmax with the future set to -inf before it (not in the tutorial; how this project "
                           "masks): the same", "在 softmax 之前把未来设为 -inf（教程里没有；本项目这样做掩码）：结果相同"),
             causal_weights,
             say("the same numbers as above: masking with -inf before the softmax = zeroing after it and renormalising",
                 "和上面的数相同：softmax 之前用 -inf 掩码，等于之后置 0 再重新归一化"),
             Picture("softmax(ω / √d_k, future = -inf) (masked before the softmax)", words, words, word_query,
                     word_key, ~causal(6), masked_means=future(say))),
    ]


# ---- 002: masked softmax with valid lengths; additive and scaled dot-product attention ----------------------------
def padded(title: str, valid_lens: torch.Tensor, padding: str, say: Say) -> Picture:
    """The picture of masked_softmax's (2 batches, 2 queries, 4 keys) weights, the padding keys masked."""
    keep = valid_key_mask(valid_lens, 4, padding=padding)
    return Picture(title, counted(2), counted(4), say("query", "查询"), say("key", "键"), ~keep,
                   panels=tuple(say(f"batch {b + 1}, valid_lens {valid_lens[b].tolist()}",
                                    f"第 {b + 1} 批，valid_lens {valid_lens[b].tolist()}") for b in range(2)),
                   masked_means=padding_means(say))


def padding_means(say: Say) -> str:
    return say("padding: its score was set to -inf before the softmax, so its weight is 0",
               "填充：softmax 之前它的分数被设为 -inf，所以权重为 0")


def tutorial_002(say: Say = ENGLISH) -> list[Step]:
    mask = valid_key_mask(torch.tensor([1, 2, 3]), 4, padding="right")
    torch.manual_seed(0)
    scores = torch.rand(2, 2, 4)
    # The tutorial pads on the right (real tokens first). This project's sampler pads prompts on the left.
    per_row = masked_softmax(scores, torch.tensor([2, 3]), padding="right")
    per_query = masked_softmax(scores, torch.tensor([[1, 3], [2, 4]]), padding="right")
    left = masked_softmax(scores, torch.tensor([2, 3]), padding="left")
    # The tutorial's sequence_mask fills padding with -1e6, where model/textbook.py uses -inf.
    real = valid_key_mask(torch.tensor([2, 2, 3, 3]), 4, padding="right").reshape(2, 2, 4)
    with_1e6 = F.softmax(scores.masked_fill(~real, -1e6), dim=-1)
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
        Step("sequence_mask", say("sequence_mask: valid lengths [1, 2, 3] over 4 slots, padding on the right: True = a "
                                  "real token", "sequence_mask：4 个位置上的有效长度 [1, 2, 3]，填充在右边：True = 真的词元"),
             mask, say("row i keeps its first i slots (True) and marks the rest as padding (False)",
                       "第 i 行保留前 i 个位置（True），其余标为填充（False）"),
             Picture("sequence_mask(valid_len = [1, 2, 3])", ["valid_len 1", "valid_len 2", "valid_len 3"],
                     counted(4), say("row", "行"), say("slot", "位置"), ~mask, kind="mask",
                     masked_means=say("padding (False)", "填充（False）")), cell="In [2]"),
        Step("scores", say("X, the scores: torch.rand(2, 2, 4), seed 0", "X，即分数：torch.rand(2, 2, 4)，种子 0"), scores,
             say("2 batches of 2 queries by 4 keys, random: this script's draw, not the tutorial's",
                 "2 批，每批 2 个查询乘 4 个键，随机：是本脚本抽的，不是教程的")),
        Step("per_row", say("attention weights = masked_softmax(X, [2, 3], padding='right'): one valid length per "
                            "batch", "注意力权重 = masked_softmax(X, [2, 3], padding='right')：每批一个有效长度"), per_row,
             say("batch 1's rows weigh only keys 1-2, batch 2's only keys 1-3; each row still sums to 1",
                 "第 1 批的行只给键 1-2 权重，第 2 批只给键 1-3；每行之和仍为 1"),
             padded("masked_softmax(X, valid_lens = [2, 3])", torch.tensor([[2, 2], [3, 3]]), "right", say),
             cell="In [7]"),
        Step("minus_1e6_gap", say("max |masked_softmax with -inf - the tutorial's sequence_mask(X, valid_lens, -1e6)|: "
                                  "the tutorial fills padding with -1e6, this project with -inf",
                                  "max |用 -inf 的 masked_softmax - 教程的 sequence_mask(X, valid_lens, -1e6)|：教程用 "
                                  "-1e6 填充，本项目用 -inf"), (per_row - with_1e6).abs().max(),
             say("0: exp(-1e6 - max) is 0 in float32 as exp(-inf) is, so the weights are the same; -inf says "
                 "'never' whatever the scores' size", "0：在 float32 中 exp(-1e6 - max) 和 exp(-inf) 一样是 0，所以权重相同；"
                 "不论分数多大，-inf 都表示“绝不”"), cell="In [3]"),
        Step("per_query", say("masked_softmax(X, [[1, 3], [2, 4]], padding='right'): one valid length per query",
                              "masked_softmax(X, [[1, 3], [2, 4]], padding='right')：每个查询一个有效长度"), per_query,
             say("each query its own length: the first has a single key, so its weight there is exactly 1",
                 "每个查询有自己的长度：第一个只有一个键，所以那里的权重正好是 1"),
             padded("masked_softmax(X, valid_lens = [[1, 3], [2, 4]])", torch.tensor([[1, 3], [2, 4]]), "right", say),
             cell="In [8]"),
        Step("left", say("masked_softmax(X, [2, 3], padding='left'): the sampler's convention keeps the LAST keys",
                         "masked_softmax(X, [2, 3], padding='left')：采样器的约定，保留的是最后的键"), left,
             say("the same lengths counted from the end: the zeros (padding) come first",
                 "同样的长度从末尾数：0（填充）在前面"),
             padded(say("masked_softmax(X, valid_lens = [2, 3], padding on the left)",
                        "masked_softmax(X, valid_lens = [2, 3])，填充在左边"), torch.tensor([[2, 2], [3, 3]]), "left",
                    say)),
        Step("additive_weights", say("additive attention weights: softmax(w_vᵀ tanh(W_q q + W_k k)) over the valid "
                                     "keys; identical keys, so equal weights", "加性注意力的权重：在有效的键上求 "
                                     "softmax(w_vᵀ tanh(W_q q + W_k k))；键都相同，所以权重相等"), additive_weights[:, 0],
             say("0.5 on each of the first 2 keys in batch 1, 1/6 on each of the first 6 in batch 2, 0 on the padding",
                 "第 1 批前 2 个键各 0.5，第 2 批前 6 个键各 1/6，填充为 0"),
             Picture(say("additive attention weights, valid_lens = [2, 6]", "加性注意力的权重，valid_lens = [2, 6]"),
                     [say("batch 1", "第 1 批"), say("batch 2", "第 2 批")], counted(10), say("the query of", "查询所在"),
                     say("key", "键"), ~keep[:, 0], masked_means=padding_means(say)), cell="In [9]-[10]"),
        Step("additive", say("AdditiveAttention's output: the mean of the first 2, and of the first 6, value rows",
                             "AdditiveAttention 的输出：前 2 行、前 6 行值的平均"), additive,
             say("[2, 3, 4, 5] and [10, 11, 12, 13], the tutorial's output: equal weights average the valid value rows",
                 "[2, 3, 4, 5] 和 [10, 11, 12, 13]，与教程的输出相同：相等的权重就是对有效的值行取平均"),
             cell="In [10]"),
        Step("dot_product", say("DotProductAttention (scores = q·kᵀ / √d) on the same keys and values: the tutorial "
                                "only defines it, in a cell never run (In [None], nothing printed); run here",
                                "DotProductAttention（scores = q·kᵀ / √d）用同样的键和值：教程只定义了它，那一格从没运行"
                                "（In [None]，没有输出）；这里运行它"), dot,
             say("the same numbers as additive attention: identical keys score alike under any scoring function, so "
                 "only the lengths matter", "和加性注意力的数相同：键都相同时，任何打分函数都给它们相同的分数，所以只有长度起作用"),
             cell="In [None]"),
    ]


# ---- 003: how the softmax's input shapes its output and its gradient; why divide by √d_k ---------------------------
def y3_of(a: torch.Tensor) -> torch.Tensor:
    """003's y3 for each a: the third entry of softmax([a, a, 2a]), the share of the largest input."""
    return torch.stack([F.softmax(torch.stack([v, v, 2 * v]), dim=0)[2] for v in a])


def tutorial_003(say: Say = ENGLISH) -> list[Step]:
    a = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    inputs = [torch.stack([v, v, 2 * v]) for v in a]
    jacobians = [torch.autograd.functional.jacobian(lambda s: F.softmax(s, dim=0), x) for x in inputs]
    closed_form = [torch.diag(y) - torch.outer(y, y) for y in (F.softmax(x, dim=0) for x in inputs)]
    curve_a = torch.tensor([0.0, 0.5, 1, 2, 3, 5, 10, 20, 50, 100], dtype=torch.float64)
    fine_a = torch.linspace(0, 100, 401, dtype=torch.float64)
    torch.manual_seed(0)
    T, d = 16, 512
    q, k, v = torch.randn(T, d), torch.randn(T, d), torch.randn(T, d)

    def through_softmax(scaled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient that reaches the softmax's input (the median over rows of each row's norm), and how peaked
        the weights are (the mean largest weight per row)."""
        scores = dot_product_scores(q, k, scaled=scaled).requires_grad_(True)
        out, weights = attend(scores, v, causal(T))
        out.square().sum().backward()  # any loss of the output will do; its gradient must pass the softmax
        rows = slice(1, None)  # row 1 has a single key to look at: its weight is 1 either way
        return scores.grad[rows].norm(dim=-1).median(), weights.max(-1).values[rows].mean().detach()

    (scaled_grad, scaled_peak), (raw_grad, raw_peak) = through_softmax(True), through_softmax(False)
    seeing = {1: say("entries of 0.04 to 0.24: a change in any input moves every output",
                     "各项在 0.04 到 0.24 之间：任何一个输入变了，每个输出都跟着变"),
              10: say("entries of 1e-4 and less: the gradient has nearly vanished", "各项不超过 1e-4：梯度几乎消失了"),
              100: say("entries of 1e-44 and less, one of them 0 (∂y₃/∂x₃ = y₃(1 - y₃) is about 7e-44, but 1 - y₃ "
                       "rounds to 0 even in float64): no gradient reaches the input at all",
                       "各项不超过 1e-44，其中一项是 0（∂y₃/∂x₃ = y₃(1 - y₃) 约为 7e-44，但 1 - y₃ 即使在 float64 中也舍入为 0）："
                       "根本没有梯度回到输入")}
    return [
        Step("y3", say("y₃ = softmax([a, a, 2a])₃ for a = 1, 10, 100: large inputs put nearly all the weight on the "
                       "largest", "a = 1、10、100 时的 y₃ = softmax([a, a, 2a])₃：输入大了，几乎全部权重都落在最大的一项上"),
             y3_of(a), say("the largest input's share grows from 0.5761 to 0.9999 to 1.0000: the output becomes "
                           "one-hot",
                           "最大输入的份额从 0.5761 到 0.9999 再到 1.0000：输出变成 one-hot")),
        Step("y3_curve", say("a (first row) and y₃ (second row): the curve the tutorial draws for a from 0 to 100",
                             "a（第一行）和 y₃（第二行）：教程为 a 从 0 到 100 画的曲线"),
             torch.stack([curve_a, y3_of(curve_a)]),
             say("y₃ starts at 0.3333 (a = 0: three equal inputs) and is already 0.9 by a = 3: it saturates long "
                 "before 100", "y₃ 从 0.3333 开始（a = 0：三个输入相等），到 a = 3 已经是 0.9：远在 100 之前就饱和了"),
             Picture(say("y₃ = softmax([a, a, 2a])₃ against a", "y₃ = softmax([a, a, 2a])₃ 随 a 的变化"), [], [], "y₃",
                     "a", kind="curve", line=torch.stack([fine_a, y3_of(fine_a)]))),
        *(Step(f"jacobian_{int(v)}", say(f"∂y_i/∂x_j, y = softmax(x), for x = [{int(v)}, {int(v)}, {2 * int(v)}] "
                                         "(row i, column j)", f"∂y_i/∂x_j，y = softmax(x)，x = [{int(v)}, {int(v)}, "
                                         f"{2 * int(v)}]（第 i 行，第 j 列）"),
               jacobian, seeing[int(v)],
               Picture(f"∂y_i/∂x_j, y = softmax(x), x = [{int(v)}, {int(v)}, {2 * int(v)}]", counted(3, "y_"),
                       counted(3, "x_"), say("output", "输出"), say("input", "输入"), kind="gradient"))
          for v, jacobian in zip(a.tolist(), jacobians)),
        Step("jacobian_formula", say("max |∂y/∂x - (diag(y) - y yᵀ)| over the three: the tutorial's closed form",
                                     "三者的 max |∂y/∂x - (diag(y) - y yᵀ)|：教程推出的公式"),
             torch.stack([(j - c).abs().max() for j, c in zip(jacobians, closed_form)]).max(),
             say("0: autograd's Jacobian is the tutorial's diag(y) - y yᵀ, which is 0 wherever y is one-hot",
                 "0：autograd 算出的雅可比矩阵就是教程的 diag(y) - y yᵀ，y 是 one-hot 时它就是 0")),
        Step("score_std", say(f"std of q·k for random unit-variance q, k of size d_k = {d}: scaled by 1/√d_k, then "
                              "unscaled", f"随机的单位方差 q、k（d_k = {d}）的 q·k 的标准差：先除以 √d_k，再不除"),
             torch.stack([dot_product_scores(q, k).std(), dot_product_scores(q, k, scaled=False).std()]),
             say("this script's own experiment (seed 0): about 1 scaled, about √512 = 22.6 unscaled",
                 "本脚本自己的实验（种子 0）：缩放后约为 1，不缩放约为 √512 = 22.6")),
        Step("peak", say("mean largest attention weight per row (rows 2..16): scaled, then unscaled (1 = one-hot)",
                         "每行最大注意力权重的平均（第 2..16 行）：先缩放，再不缩放（1 = one-hot）"),
             torch.stack([scaled_peak, raw_peak]),
             say("unscaled, each row puts nearly all its weight on one key, as softmax([a, a, 2a]) did for a large a",
                 "不缩放时，每行几乎把全部权重放在一个键上，就像 a 很大时的 softmax([a, a, 2a])")),
        Step("gradient_norms", say("median over rows of |∂loss/∂scores|, the gradient that gets through the softmax: "
                                   "scaled, then unscaled", "各行 |∂loss/∂scores| 的中位数，即穿过 softmax 的梯度：先缩放，再不缩放"),
             torch.stack([scaled_grad, raw_grad]),
             say("the unscaled gradient is about 2000 times smaller: the one-hot rows' Jacobians are nearly 0",
                 "不缩放的梯度小了约 2000 倍：接近 one-hot 的行，雅可比矩阵几乎为 0")),
    ]


# ---- 004: the blog's three tokens, computed exactly -----------------------------------------------------------------
def tutorial_004(say: Say = ENGLISH) -> list[Step]:
    x = torch.tensor([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=torch.float32)
    w_k = torch.tensor([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=torch.float32)
    w_q = torch.tensor([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=torch.float32)
    w_v = torch.tensor([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=torch.float32)
    k, q, v = x @ w_k, x @ w_q, x @ w_v
    scores_1 = q[0] @ k.T
    rounded = torch.tensor([0.0, 0.5, 0.5])  # what the blog writes for softmax([2, 4, 4])
    weights_1 = F.softmax(scores_1, dim=0)
    scaled_1 = F.softmax(scores_1 / math.sqrt(3), dim=0)
    tokens = counted(3, say("token ", "词元 "))
    return [
        Step("x", say("a¹, a², a³: the blog's three inputs (Input 1-3), already embedded, 4 numbers each",
                      "a¹、a²、a³：博客的三个输入（Input 1-3），已经嵌入好，各 4 个数"), x,
             say("small integers, so every step can be checked by hand", "都是小整数，每一步都能手算验证")),
        Step("W_q", say("W_q, the blog's query weights (4 x 3)", "W_q，博客的查询权重（4 x 3）"), w_q,
             say("4 rows (the input's width) by 3 (d): each input becomes a query of 3 numbers",
                 "4 行（输入的宽度）乘 3 列（d）：每个输入变成 3 个数的查询")),
        Step("W_k", say("W_k, the key weights (4 x 3)", "W_k，键的权重（4 x 3）"), w_k,
             say("as wide as W_q, so that queries and keys can be multiplied", "和 W_q 一样宽，查询和键才能相乘")),
        Step("W_v", say("W_v, the value weights (4 x 3)", "W_v，值的权重（4 x 3）"), w_v,
             say("what each token will hand over, 3 numbers each", "每个词元将交出的东西，各 3 个数")),
        Step("keys", say("kⁱ = aⁱ W_k, every token's key", "kⁱ = aⁱ W_k，每个词元的键"), k,
             say("one key per token (3 x 3), integers since a and W_k are", "每个词元一个键（3 x 3），a 和 W_k 都是整数，所以它也是")),
        Step("queries", say("qⁱ = aⁱ W_q", "qⁱ = aⁱ W_q"), q,
             say("one query per token: token 1's is [1, 0, 2]", "每个词元一个查询：词元 1 的是 [1, 0, 2]")),
        Step("values", say("vⁱ = aⁱ W_v", "vⁱ = aⁱ W_v"), v,
             say("one value per token: what the weights will mix", "每个词元一个值：权重要混合的就是它们")),
        Step("scores_1", say("token 1's scores q¹ · kʲ (the blog's α₁,ⱼ without its / √d)",
                             "词元 1 的分数 q¹ · kʲ（博客的 α₁,ⱼ，没有除以 √d）"), scores_1,
             say("[2, 4, 4]: token 1's query matches tokens 2 and 3 equally, and better than itself",
                 "[2, 4, 4]：词元 1 的查询和词元 2、3 匹配得一样好，比和它自己更好")),
        Step("blog_output_1", say("b¹ as the blog computes it: it rounds α̂₁ = softmax([2, 4, 4]) to [0, 0.5, 0.5], "
                                  "and gets", "博客算的 b¹：它把 α̂₁ = softmax([2, 4, 4]) 舍入成 [0, 0.5, 0.5]，得到"),
             rounded @ v, say("[2.0, 7.0, 1.5], the blog's figure, from rounded weights",
                              "[2.0, 7.0, 1.5]，博客的数，来自舍入过的权重")),
        Step("weights_1", say("α̂₁ = softmax([2, 4, 4]) exactly", "α̂₁ = softmax([2, 4, 4])，精确值"), weights_1,
             say("0.0634 is not 0: token 1 still takes a little from itself", "0.0634 不是 0：词元 1 仍从自己那里取一点"),
             Picture("α̂₁ = softmax(q¹ · kᵀ), no scale", [say("token 1", "词元 1")], tokens, say("query", "查询"),
                     say("key", "键"))),
        Step("output_1", say("b¹ = Σⱼ α̂₁,ⱼ vʲ, token 1's output, exactly", "b¹ = Σⱼ α̂₁,ⱼ vʲ，词元 1 的输出，精确值"),
             weights_1 @ v, say("near the blog's [2.0, 7.0, 1.5] but not equal: its rounding moved every number",
                                "接近博客的 [2.0, 7.0, 1.5] 但不相等：它的舍入改变了每个数")),
        Step("scaled_weights_1", say("with the 1/√d of the blog's own formula α₁,ⱼ = q¹·kʲ/√d that its numbers leave "
                                     "out (d = 3): α̂₁ = softmax([2, 4, 4] / √3)", "加上博客自己的公式 α₁,ⱼ = q¹·kʲ/√d "
                                     "里、它的数却省掉的 1/√d（d = 3）：α̂₁ = softmax([2, 4, 4] / √3)"), scaled_1,
             say("flatter than without the scale: dividing by √3 gives token 1 more of its own value",
                 "比不缩放时平缓：除以 √3 让词元 1 拿到更多它自己的值"),
             Picture("α̂₁ = softmax(q¹ · kᵀ / √3)", [say("token 1", "词元 1")], tokens, say("query", "查询"),
                     say("key", "键"))),
        Step("scaled_output_1", say("and b¹ then", "这时的 b¹"), scaled_1 @ v,
             say("token 1's output as the formula has it", "公式给出的词元 1 的输出")),
        Step("all_outputs", say("b¹, b², b³ at once: softmax(q kᵀ / √3) v", "一次算出 b¹、b²、b³：softmax(q kᵀ / √3) v"),
             attend(dot_product_scores(q, k), v)[0],
             say("row 1 is the scaled output above; rows 2 and 3 are tokens 2 and 3 computed the same way (the blog "
                 "leaves them to the reader)", "第 1 行就是上面缩放后的输出；第 2、3 行是词元 2、3 用同样方法算出的（博客留给读者算）")),
    ]


TUTORIALS = {
    "000": (("the maths of self-attention: averaging the past, keys and queries, values, the 1/√d scale",
             "自注意力的数学：对过去取平均、键和查询、值、1/√d 缩放"), tutorial_000),
    "001": (("a worked example: 'Life is short, eat dessert first'", "一个算例：'Life is short, eat dessert first'"),
            tutorial_001),
    "002": (("scoring functions: masked softmax with valid lengths, additive and dot-product attention",
             "打分函数：带有效长度的掩码 softmax、加性注意力和点积注意力"), tutorial_002),
    "003": (("the softmax's input, its gradient, and why q·k is divided by √d_k",
             "softmax 的输入、它的梯度，以及为什么 q·k 要除以 √d_k"), tutorial_003),
    "004": (("the blog's three-token example, without its rounding", "博客中三个词元的例子，不做它的舍入"), tutorial_004),
}
# Each tutorial's own names for what it computes, and the attention page's names for the same (the page shows them
# for your model: S, A and A·V in sections 5 and 7).
LEGENDS = {
    "000": ("000's names: x the input; xbow the average of the past (a loop, then wei @ x); wei the weights: first "
            "tril(ones) / row sums, then softmax of zeros with the future at -inf, then q @ kᵀ before the softmax and "
            "its softmax after; out = wei @ v. On the attention page, wei is S before the softmax and A after it; "
            "out is A·V.",
            "000 的名字：x 是输入；xbow 是过去的平均（先用循环，再用 wei @ x）；wei 是权重：先是 tril(ones) 除以行和，再是未来设为 "
            "-inf 的全 0 的 softmax，然后 softmax 之前是 q @ kᵀ、之后是它的 softmax；out = wei @ v。在注意力页面上，softmax "
            "之前的 wei 是 S，之后是 A；out 是 A·V。"),
    "001": ("001's names: x = embedded_sentence, x⁽ⁱ⁾ its rows; W_query, W_key, W_value; ω (omega, attn_scores) = q·k, "
            "the unnormalised attention weights; α (attention_weights_2, attn_weights) = softmax(ω / √d_k); z "
            "(context_vector_2, context_vec) = α @ values. On the attention page ω is S, ω / √d_k the scaled S, α is "
            "A and z is A·V.",
            "001 的名字：x = embedded_sentence，x⁽ⁱ⁾ 是它的行；W_query、W_key、W_value；ω（omega，attn_scores）= q·k，即未归一化"
            "的注意力权重；α（attention_weights_2，attn_weights）= softmax(ω / √d_k)；z（context_vector_2，context_vec）= "
            "α @ values。在注意力页面上，ω 是 S，ω / √d_k 是缩放后的 S，α 是 A，z 是 A·V。"),
    "002": ("002's names: X the scores; valid_lens how many keys are real (one per row or per query); the attention "
            "scoring function a(q, k): additive w_vᵀ tanh(W_q q + W_k k), or scaled dot-product q·k / √d; attention "
            "weights = masked_softmax(scores, valid_lens). On the attention page the scores are S (scaled: S / √d) "
            "and the attention weights A.",
            "002 的名字：X 是分数；valid_lens 是真的键有几个（每行一个，或每个查询一个）；注意力打分函数 a(q, k)：加性的 "
            "w_vᵀ tanh(W_q q + W_k k)，或缩放点积 q·k / √d；注意力权重 = masked_softmax(scores, valid_lens)。在注意力页面上，"
            "分数是 S（缩放后是 S / √d），注意力权重是 A。"),
    "003": ("003's names: Q, K, V the query, key and value; x the softmax's input, here [a, a, 2a]; y = softmax(x), y₃ "
            "its third entry; d_k the size of q and k. Its open question, whether (Q, V), (K, V) or V alone would do, "
            "is what the ladder's rungs shared_qk, no_values and average measure (docs/attention.md).",
            "003 的名字：Q、K、V 是查询、键和值；x 是 softmax 的输入，这里是 [a, a, 2a]；y = softmax(x)，y₃ 是它的第三项；d_k 是 "
            "q 和 k 的大小。它留下的开放问题（只用 (Q, V)、(K, V) 或 V 行不行）正是阶梯的 shared_qk、no_values 和 average "
            "几级所测量的（docs/attention.md）。"),
    "004": ("004's names: aⁱ the embedded input; qⁱ, kⁱ, vⁱ; α₁,ⱼ = q¹·kʲ / √d the scaled scores (its worked numbers "
            "leave the √d out); α̂₁,ⱼ = softmax(α₁) the weights; b¹ = Σⱼ α̂₁,ⱼ vʲ the output. On the attention page "
            "α is the scaled S, α̂ is A and b is A·V.",
            "004 的名字：aⁱ 是嵌入后的输入；qⁱ、kⁱ、vⁱ；α₁,ⱼ = q¹·kʲ / √d 是缩放后的分数（它的算例省掉了 √d）；α̂₁,ⱼ = "
            "softmax(α₁) 是权重；b¹ = Σⱼ α̂₁,ⱼ vʲ 是输出。在注意力页面上，α 是缩放后的 S，α̂ 是 A，b 是 A·V。"),
}
# Where a tutorial drew random numbers without a seed, its figures cannot be repeated: one line says so (the tests
# check the figures named here against the script's own).
UNSEEDED = {
    "000": ("note: tutorial 000 set no seed, so its x (x[0][0] = 0.0687 there) and what is computed from x cannot be "
            "matched; this script seeds torch.manual_seed(1337) (x[0][0] = 0.0783 here). What does not depend on the "
            "draw matches: the three averages agree, var(q·k) is about 16, and softmax(a), softmax(10a) use its a",
            "注意：教程 000 没有设随机种子，所以它的 x（那里 x[0][0] = 0.0687）以及由 x 算出的东西都对不上；本脚本用 "
            "torch.manual_seed(1337)（这里 x[0][0] = 0.0783）。与抽样无关的都对得上：三种平均相同，var(q·k) 约为 16，"
            "softmax(a)、softmax(10a) 用的是它的 a"),
    "002": ("note: tutorial 002 drew its scores with torch.rand and no seed, so its masked softmax (0.4497 0.5503 "
            "there) cannot be matched; this script seeds torch.manual_seed(0). What does not depend on the draw "
            "matches: zeros past each valid length, 1.0000 for a length of 1, outputs [2, 3, 4, 5], [10, 11, 12, 13]",
            "注意：教程 002 用 torch.rand 抽分数，没有设随机种子，所以它的掩码 softmax（那里是 0.4497 0.5503）对不上；本脚本用 "
            "torch.manual_seed(0)。与抽样无关的都对得上：有效长度之后为 0，长度为 1 时是 1.0000，输出 [2, 3, 4, 5]、"
            "[10, 11, 12, 13]"),
}
COUNTING = ("Tokens, rows and columns are counted from 1 here, as on the attention page and in the walkthrough; a "
            "tutorial's own\nnames and subscripts (001's ω_24, 000's x[0]) are kept as it writes them, and its "
            "notebook cell is named as [NNN In [n]].\n",
            "这里的词元、行和列都从 1 开始数，和注意力页面、逐步演示一样；教程自己的名字和下标（001 的 ω_24、000 的 x[0]）\n"
            "照它的写法保留，它的笔记本代码格写作 [NNN In [n]]。\n")


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


def curve_figure(step: Step):
    """A kind "curve" step: its two rows (x, y) as points over the finely sampled line."""
    from common.pictures import plt

    picture = step.picture
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100, layout="constrained")
    ax.plot(*picture.line.double().numpy(), color="#1f77b4", linewidth=1.5)
    ax.plot(*step.value.double().numpy(), "o", color="#d62728", markersize=4)
    ax.set_xlabel(picture.column_axis)
    ax.set_ylabel(picture.row_axis)
    ax.set_title(picture.title, fontsize=11)
    ax.grid(alpha=0.3)
    return fig


def figure_of(step: Step, say: Say = ENGLISH):
    """step's value as a heatmap per panel, each cell's number written in it, the masked cells hatched grey (a
    curve for kind "curve")."""
    from matplotlib.patches import Patch, Rectangle

    from common.pictures import plt

    picture = step.picture
    if picture.kind == "curve":
        return curve_figure(step)
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


def draw(step: Step, path: Path, say: Say = ENGLISH) -> None:
    """figure_of(step) written to path (whole or not at all), in fonts that draw every character of its words."""
    from common.pictures import plt, save_figure

    with plt.rc_context({"font.family": picture_fonts()}):
        fig = figure_of(step, say)
        save_figure(fig, path, "--png")
    plt.close(fig)


def picture_fonts() -> list[str]:
    """matplotlib's own sans-serif font, then an installed font that draws Chinese, where there is one."""
    from common.pictures import font_for

    return ["DejaVu Sans", *filter(None, [font_for("注")])]


def check_chinese_font() -> None:
    """--png with --lang zh draws Chinese words: refused in one line where no installed font has them."""
    from common.pictures import INSTALL_HINT, font_for

    if font_for("注") is None:
        raise UserError(f"--png --lang zh: no installed font draws Chinese; {INSTALL_HINT}, or draw the pictures "
                        f"in English (--lang en)")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description="Recompute the tutorials' worked examples step by step.")
    parser.add_argument("tutorial", nargs="*", metavar="NNN", help=f"which ones ({', '.join(TUTORIALS)}; default: all)")
    parser.add_argument("--lang", choices=("en", "zh"), default="en",
                        help="the language of the words around the numbers: English or Chinese (中文)")
    parser.add_argument("--png", metavar="DIR", default="",
                        help="also draw every attention matrix printed (and 003's curve), one picture each, into "
                             "this folder (NNN-step.png; default: no pictures)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.tutorial if n not in TUTORIALS]
    if unknown:
        raise UserError(f"no tutorial {unknown[0]}; choose from {', '.join(TUTORIALS)}")
    say, zh = speaker(args.lang), args.lang == "zh"
    if args.png and zh:
        check_chinese_font()
    with output_folder(Path(args.png), "--png") if args.png else contextlib.nullcontext() as folder:
        print(say(*COUNTING))
        for number in dict.fromkeys(args.tutorial) or TUTORIALS:  # (each once, in the order given)
            titles, steps = TUTORIALS[number]
            print(say(f"=== tutorial {number}: ", f"=== 教程 {number}：") + say(*titles) + "\n")
            for words in (LEGENDS[number], UNSEEDED.get(number)):
                if words:  # one line each, as the steps' sentences: a terminal folds it without breaking a formula
                    print(say(*words) + "\n")
            for step in steps(say):
                cell = f" [{number} {step.cell}]" if step.cell else ""
                print(f"{step.formula}{cell}{say(':', '：')}\n{show(step.value)}\n  {say('what to see: ', '看什么：')}"
                      f"{step.see}")
                if folder is not None and step.picture is not None:
                    path = folder / f"{number}-{step.name}.png"
                    draw(step, path, say)
                    print(f"  {say('picture: ', '图：')}{path}")
                print()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
