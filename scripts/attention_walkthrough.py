"""python scripts/attention_walkthrough.py [--lang en|zh]: one head of causal self-attention, step by step, on tutorial
004's three tokens and weights, each step named as 004 names it, in English or Chinese."""
from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import quiet_while_loading  # noqa: E402

loaded = quiet_while_loading(__name__)

import torch  # noqa: E402

from errors import ArgumentParser, run_cli  # noqa: E402
from tutorials import ENGLISH, LANG_HELP, Say, blog_004, head_with, show, speaker  # noqa: E402
loaded()


def walkthrough(say: Say = ENGLISH) -> list[tuple[str, torch.Tensor]]:
    """Every intermediate of one head, computed with the project's Head, each with its name and 004's."""
    x, w_q, w_k, w_v = blog_004()
    head = head_with(w_q, w_k, w_v, block_size=3)
    q, k, v = head.query(x), head.key(x), head.value(x)
    scores = q @ k.T
    scaled = scores / math.sqrt(k.size(-1))
    mask = head.tril[:3, :3]
    masked = scaled.masked_fill(mask == 0, float("-inf"))
    weights = torch.softmax(masked, dim=-1)
    out = weights @ v
    assert torch.allclose(out, head(x[None])[0])
    return [(say("x (3 tokens x 4 numbers): 004's a¹, a², a³", "x（3 个 token x 4 个数）：004 的 a¹、a²、a³"), x),
            (say("q = x @ W_query: 004's qⁱ", "q = x @ W_query：004 的 qⁱ"), q),
            (say("k = x @ W_key: 004's kⁱ", "k = x @ W_key：004 的 kⁱ"), k),
            (say("v = x @ W_value: 004's vⁱ", "v = x @ W_value：004 的 vⁱ"), v),
            (say("scores = q @ k^T: 004's qⁱ·kʲ (row 1 is its [2, 4, 4])",
                 "scores = q @ k^T：004 的 qⁱ·kʲ（第 1 行就是它的 [2, 4, 4]）"), scores),
            (say("scaled = scores / sqrt(head_size=3): 004's αᵢ,ⱼ = qⁱ·kʲ/√d",
                 "scaled = scores / sqrt(head_size=3)：004 的 αᵢ,ⱼ = qⁱ·kʲ/√d"), scaled),
            (say("causal mask (tril: 1 = may look): not in 004", "因果掩码（tril：1 = 可以看）：004 没有"), mask),
            (say("masked scores (future = -inf)", "掩码后的分数（未来 = -inf）"), masked),
            (say("weights = softmax(masked, over each row): 004's α̂ᵢ,ⱼ",
                 "weights = softmax(masked，对每一行)：004 的 α̂ᵢ,ⱼ"), weights),
            (say("output = weights @ v: 004's bⁱ", "output = weights @ v：004 的 bⁱ"), out)]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("--lang", choices=("en", "zh"), default="en", help=LANG_HELP)
    args = parser.parse_args(argv)
    say = speaker(args.lang)
    print(say("One head of causal self-attention, step by step. Tokens are counted from 1, as on the attention page "
              "and in\ntutorials.py.\n", "一个因果自注意力头，一步一步算。token 从 1 开始数，和注意力页面、tutorials.py 一样。\n"))
    for name, tensor in walkthrough(say):
        print(f"{name}{say(':', '：')}\n{show(tensor)}\n")
    print(say("Row t of the weights says how much token t takes from tokens 1..t: each row sums to 1, and the\n"
              "zeros above the diagonal are the future it may not see.\n"
              "\n"
              "Where this differs from 004: this head is causal, as a GPT's attention is, so token 1 sees only itself\n"
              "and its output is its own value v¹ = [1, 2, 3]. 004's blog lets token 1 see all three tokens and gets\n"
              "[2.0, 7.0, 1.5] (from weights rounded to [0, 0.5, 0.5]; exactly [1.9366, 6.6831, 1.5951], and\n"
              "[1.8639, 6.3194, 1.7042] with the 1/√3 of its own formula): python scripts/tutorials.py 004.",
              "权重的第 t 行表示 token t 从 token 1..t 各取多少：每行之和为 1，对角线以上的 0 是它不许看的未来。\n"
              "\n"
              "和 004 不同的地方：这个头是因果的（GPT 的注意力就是这样），所以 token 1 只看得到它自己，输出就是它自己的值\n"
              "v¹ = [1, 2, 3]。004 的博客让 token 1 看到全部三个 token，得到 [2.0, 7.0, 1.5]（来自舍入成 [0, 0.5, 0.5] 的\n"
              "权重；精确值是 [1.9366, 6.6831, 1.5951]，按它自己公式里的 1/√3 是 [1.8639, 6.3194, 1.7042]）：\n"
              "python scripts/tutorials.py 004。"))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
