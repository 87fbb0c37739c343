"""Attention: the textbook heads, the explicit path and the fused SDPA path are one function."""
import math

import pytest
import torch
import torch.nn.functional as F

from model.attention import CausalSelfAttention, attention_mask, fused_attention, recording_attention
from model.textbook import MultiHeadAttention, masked_softmax
from model.config import ModelConfig

CFG = ModelConfig(vocab_size=11, block_size=16, n_layer=1, n_head=4, n_embd=32)


def heads_sharing_weights(fused: CausalSelfAttention) -> MultiHeadAttention:
    """A list-of-heads module whose per-head q/k/v are slices of the fused qkv projection."""
    mha = MultiHeadAttention(CFG)
    C, hs = CFG.n_embd, CFG.head_size
    W, b = fused.c_attn.weight.detach(), fused.c_attn.bias.detach()
    with torch.no_grad():
        for h, head in enumerate(mha.heads):
            for part, lin in enumerate((head.query, head.key, head.value)):
                rows = slice(part * C + h * hs, part * C + (h + 1) * hs)
                lin.weight.copy_(W[rows])
                lin.bias.copy_(b[rows])
        mha.proj.weight.copy_(fused.c_proj.weight)
        mha.proj.bias.copy_(fused.c_proj.bias)
    return mha


def make_forms():
    torch.manual_seed(0)
    fused = CausalSelfAttention(CFG, path="sdpa")
    for p in fused.parameters():  # non-zero biases so that they are checked too
        torch.nn.init.normal_(p, std=0.3)
    explicit = CausalSelfAttention(CFG, path="explicit")
    explicit.load_state_dict(fused.state_dict())
    heads = heads_sharing_weights(fused)
    return {"sdpa": fused, "explicit": explicit, "heads": heads}, (fused, explicit, heads)


def test_three_forms_agree_on_outputs_and_gradients():
    forms, modules = make_forms()
    x = torch.randn(3, 12, CFG.n_embd)
    outputs, grads = {}, {}
    for name, form in forms.items():
        xi = x.clone().requires_grad_(True)
        out = form(xi)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        outputs[name], grads[name] = out.detach(), xi.grad
    for name in ("explicit", "heads"):
        torch.testing.assert_close(outputs[name], outputs["sdpa"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grads[name], grads["sdpa"], rtol=1e-5, atol=1e-5)
    fused, explicit, heads = modules
    # weight gradients agree too: the fused qkv gradient, sliced per head, is each head's gradient
    torch.testing.assert_close(fused.c_attn.weight.grad, explicit.c_attn.weight.grad, rtol=1e-5, atol=1e-5)
    C, hs = CFG.n_embd, CFG.head_size
    torch.testing.assert_close(heads.heads[2].key.weight.grad, fused.c_attn.weight.grad[C + 2 * hs:C + 3 * hs],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["sdpa", "explicit", "heads"])
def test_changing_a_token_never_changes_earlier_outputs(form):
    forms, _ = make_forms()
    x = torch.randn(2, 10, CFG.n_embd)
    base = forms[form](x).detach()
    for t in range(10):
        changed = x.clone()
        changed[:, t] += 5.0
        out = forms[form](changed).detach()
        torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-6)
        assert not torch.allclose(out[:, t], base[:, t])


def test_explicit_path_returns_causal_rows_that_sum_to_one():
    _, (fused, _, _) = make_forms()
    with recording_attention(fused) as recorded:
        fused(torch.randn(2, 7, CFG.n_embd))
    weights, = recorded
    assert weights.shape == (2, CFG.n_head, 7, 7)
    assert torch.all(weights.triu(diagonal=1) == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, CFG.n_head, 7))


# --- the tutorial facts, as executable checks -------------------------------------------------
def test_three_ways_of_averaging_the_past_agree():
    torch.manual_seed(1)
    B, T, C = 2, 8, 3
    x = torch.randn(B, T, C)
    loop = torch.zeros(B, T, C)
    for b in range(B):
        for t in range(T):
            loop[b, t] = x[b, : t + 1].mean(0)
    tril = torch.tril(torch.ones(T, T))
    matmul = (tril / tril.sum(1, keepdim=True)) @ x
    softmax = F.softmax(torch.zeros(T, T).masked_fill(tril == 0, float("-inf")), dim=-1) @ x
    torch.testing.assert_close(matmul, loop)
    torch.testing.assert_close(softmax, loop)


def test_masking_after_softmax_and_renormalising_equals_masking_before():
    scores = torch.randn(5, 6, 6)
    tril = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    before = F.softmax(scores.masked_fill(~tril, float("-inf")), dim=-1)
    after = F.softmax(scores, dim=-1) * tril
    after = after / after.sum(-1, keepdim=True)
    torch.testing.assert_close(after, before)


def test_scaling_keeps_the_variance_of_scores_near_one():
    gen = torch.Generator().manual_seed(0)
    head_size = 64
    q = torch.randn(20000, head_size, generator=gen)
    k = torch.randn(20000, head_size, generator=gen)
    raw = (q * k).sum(-1)
    assert raw.var().item() == pytest.approx(head_size, rel=0.05)
    assert (raw / math.sqrt(head_size)).var().item() == pytest.approx(1.0, rel=0.05)


def test_softmax_jacobian_is_diag_y_minus_y_y_transposed():
    z = torch.randn(7, dtype=torch.float64)
    y = F.softmax(z, dim=0)
    jacobian = torch.autograd.functional.jacobian(lambda v: F.softmax(v, dim=0), z)
    torch.testing.assert_close(jacobian, torch.diag(y) - torch.outer(y, y))


def test_sharp_softmax_is_nearly_one_hot_with_a_vanishing_jacobian():
    z = torch.tensor([0.1, -0.2, 0.3, 0.2, -0.5], dtype=torch.float64) * 200  # unscaled large scores
    y = F.softmax(z, dim=0)
    assert y.max().item() > 0.999 and y.argmax().item() == 2
    jacobian = torch.autograd.functional.jacobian(lambda v: F.softmax(v, dim=0), z)
    assert jacobian.abs().max().item() < 1e-3  # gradients hardly flow: why q·kᵀ is scaled by 1/√d


# --- padding-aware masking ---------------------------------------------------------------------
def test_masked_softmax_zeroes_padding_and_rows_sum_to_one():
    scores = torch.randn(3, 2, 4, 6)
    valid_lens = torch.tensor([6, 3, 1])
    weights = masked_softmax(scores, valid_lens, padding="left")
    for b, n in enumerate(valid_lens.tolist()):
        assert torch.all(weights[b, ..., : 6 - n] == 0)  # left padding: the first 6-n keys are padding
        assert torch.all(weights[b, ..., 6 - n:] > 0)
        torch.testing.assert_close(weights[b, ..., 6 - n:], F.softmax(scores[b, ..., 6 - n:], dim=-1))
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 4))


def test_masked_softmax_gives_zeros_not_nan_for_an_empty_row():
    weights = masked_softmax(torch.randn(2, 4), torch.tensor([0, 4]), padding="right")
    assert torch.all(weights[0] == 0) and not torch.isnan(weights).any()


def test_attention_mask_is_causal_and_hides_padding_but_never_empties_a_row():
    mask = attention_mask(torch.arange(4), 4, torch.tensor([0, 2]))[:, 0]
    tril = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    assert torch.equal(mask[0], tril)
    expected = tril.clone()
    expected[:, :2] = False
    expected[0, 0] = expected[1, 1] = True  # padding queries see only themselves
    assert torch.equal(mask[1], expected)
    assert torch.equal(attention_mask(torch.arange(4), 4)[0, 0], tril)


def test_attention_mask_of_one_slot_is_that_row_of_the_tril_over_a_whole_cache():
    """A decoding step's query at slot s over a fixed cache of 6 slots sees slots 0..s (and not the padding)."""
    tril = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    for s in range(6):
        assert torch.equal(attention_mask(torch.tensor([s]), 6)[0, 0], tril[s:s + 1])
        padded = attention_mask(torch.tensor([s]), 6, torch.tensor([2]))[0, 0, 0]
        assert padded.tolist() == [2 <= j <= s or j == s for j in range(6)]


def test_fused_attention_under_cpu_bfloat16_autocast_is_the_textbook_formula():
    """On CPU the fused kernel runs in float32 inside bfloat16 autocast (its bfloat16 backward is slow there);
    output and gradients still equal q·kᵀ/√d, tril mask, softmax, weighted sum, up to bfloat16 rounding."""
    torch.manual_seed(0)
    B, H, T, D = 2, 4, 12, 8
    q, k, v = (torch.randn(B, H, T, D).bfloat16().requires_grad_(True) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fused_attention(q, k, v, None, 0.0, True)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    scores = (q64 @ k64.transpose(-2, -1) / math.sqrt(D)).masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)),
                                                                       float("-inf"))
    reference = F.softmax(scores, dim=-1) @ v64
    reference.sum().backward()
    torch.testing.assert_close(y.double(), reference, rtol=1e-2, atol=1e-2)
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("compiling", [False, True])
def test_inside_torch_compile_on_a_cpu_in_bfloat16_the_fused_path_is_the_explicit_one(compiling, monkeypatch):
    """The sdpa path, while torch.compile traces it on a CPU under bfloat16 autocast, computes exactly what the
    explicit path computes (the written-out steps inductor fuses), output and gradients bit for bit, without calling
    the fused kernel; outside a trace, or in float32, it calls the kernel, the same function within rounding."""
    import model.attention as attention
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    kernel_calls = []
    real_kernel = F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda *args, **kwargs: kernel_calls.append(1) or real_kernel(*args, **kwargs))
    torch.manual_seed(0)
    fused = CausalSelfAttention(CFG, path="sdpa")
    explicit = CausalSelfAttention(CFG, path="explicit")
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(3, 16, CFG.n_embd)

    def run(module, autocast):
        inputs = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = module(inputs)
        y.float().square().sum().backward()
        grads = [inputs.grad] + [p.grad for p in module.parameters()]
        module.zero_grad(set_to_none=True)
        return [y] + grads

    for autocast in (True, False):
        kernel_calls.clear()
        got = run(fused, autocast)
        written_out = compiling and autocast
        assert bool(kernel_calls) == (not written_out)
        reference = run(explicit, autocast)
        if written_out:
            assert all(torch.equal(a, b) for a, b in zip(got, reference))
        for a, b in zip(got, reference):  # either way the same function
            torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2)
