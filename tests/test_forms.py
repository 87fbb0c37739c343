"""Every attention form the tutorials teach, in the real model: causal, learns, resumes exactly, samples the same
with and without the KV cache, and equals its closed form or its plain loop."""
import io

import pytest
import torch

from configs import load_config
from errors import UserError
from model import GPT, ModelConfig
from model.attention import CausalSelfAttention, recording_attention
from model.generate import compiled_step, generate
from training.optim import configure_optimizer
from conftest import set_attention_path

TINY = dict(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16)
FORMS = {
    "scaled_dot": {},
    "dot": dict(attention_score="dot"),
    "additive": dict(attention_score="additive"),
    "uniform": dict(attention_score="uniform", position="learned"),
    "shared_qk": dict(shared_qk=True),
    "no_values": dict(attention_values=False),
    "no_positions": dict(position="none"),
    "rope": dict(position="rope"),
    "qk_norm": dict(qk_norm=True),
    "bigram": dict(n_layer=0, position="none", tie_weights=False),  # the ladder's first rung: no blocks at all
    "no_mlp": dict(mlp=False),
    "no_residual": dict(residual=False, mlp=False),
    "no_residual_with_mlp": dict(residual=False),
}


def model_of(form: str, seed: int = 0, **extra) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(**{**TINY, **FORMS[form], **extra}))


def batch(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 13, (4, 16), generator=gen)
    return idx, torch.roll(idx, -1, dims=1)


@pytest.mark.parametrize("path", ["sdpa", "explicit"])
@pytest.mark.parametrize("form", FORMS)
def test_each_form_is_causal_on_each_path(form, path):
    model = model_of(form).eval()
    if form != "additive":  # additive has the explicit path only
        set_attention_path(model, path)
    idx = batch()[0][:2, :12]
    base, _ = model(idx)
    for t in range(12):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % 13
        logits, _ = model(changed)
        torch.testing.assert_close(logits[:, :t], base[:, :t], rtol=0, atol=1e-6)


def train_steps(model, optimizer, steps: int) -> list[float]:
    x, y = batch()
    losses = []
    for _ in range(steps):
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("form", FORMS)
def test_each_form_learns_and_resumes_exactly(form):
    model = model_of(form)
    optimizer = configure_optimizer(model, 1e-2, 0.0, (0.9, 0.99), "cpu")
    losses = train_steps(model, optimizer, 40)
    assert losses[-1] < losses[0] - 0.2, losses  # a fixed batch: every form fits some of it (slowest: no residuals)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, saved)
    straight = train_steps(model, optimizer, 3)
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    resumed = model_of(form, seed=99)  # other initial weights: everything must come from the checkpoint
    resumed.load_state_dict(state["model"])
    resumed_optimizer = configure_optimizer(resumed, 1e-2, 0.0, (0.9, 0.99), "cpu")
    resumed_optimizer.load_state_dict(state["optimizer"])
    assert train_steps(resumed, resumed_optimizer, 3) == straight


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
def test_each_form_samples_the_same_with_and_without_the_cache_and_compiled_once(form):
    """Uncached (every window read whole), cached, and cached with the decoding step captured by torch.compile: the
    same tokens, past the window's slide at block_size 16; the compiled step is traced once for all of them."""
    model = model_of(form).eval()
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8]]  # different lengths: left padding too
    traced = []

    def counting(graph, inputs):  # dynamo's capture without inductor's code generation, which costs seconds
        traced.append(graph)
        return graph.forward

    torch.compiler.reset()  # dynamo keeps a few compiled versions per function: each test's model is a new one
    step = compiled_step("cpu", counting)
    texts = [generate(model, prompts, 30, generator=torch.Generator().manual_seed(5), use_cache=use_cache, **extra)
             for use_cache, extra in ((True, {}), (False, {}), (True, {"step": step}))]
    assert texts[0] == texts[1] == texts[2]
    shorter = generate(model, prompts, 20, generator=torch.Generator().manual_seed(5), step=step)  # another call
    assert shorter == [row[:20] for row in texts[0]]
    assert len(traced) == (1 if TINY["n_layer"] * FORMS[form].get("n_layer", 1) else 0)


@pytest.mark.parametrize("form", [f for f in FORMS if f != "additive"])
def test_the_fused_kernel_computes_each_form_it_is_used_for(form):
    model = model_of(form).eval()
    idx, targets = batch()
    fused, _ = model(idx, targets)
    set_attention_path(model, "explicit")
    explicit, _ = model(idx, targets)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)


def attention_layer(form: str) -> CausalSelfAttention:
    torch.manual_seed(0)
    layer = CausalSelfAttention(ModelConfig(**{**TINY, **FORMS[form]}), path="explicit").eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return layer


def test_additive_scores_equal_a_loop_over_every_query_key_pair_and_head():
    layer = attention_layer("additive")
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 7, 8)
    loop = torch.tensor([[[[float(layer.w_score[h].detach() @ torch.tanh(q[b, h, i] + k[b, h, j])) for j in range(7)]
                           for i in range(5)] for h in range(2)] for b in range(2)])
    torch.testing.assert_close(layer.scores(q, k), loop)


def test_uniform_attention_is_the_running_mean_of_the_values():
    layer = attention_layer("uniform")
    x = torch.randn(2, 6, 16)
    v = layer.c_attn(x)  # uniform learns no q or k: c_attn makes only the values
    assert layer.c_attn.out_features == 16
    running_mean = v.cumsum(1) / torch.arange(1, 7).view(1, 6, 1)
    torch.testing.assert_close(layer(x), layer.c_proj(running_mean))


def test_shared_qk_makes_one_projection_for_queries_and_keys():
    layer = attention_layer("shared_qk")
    assert layer.c_attn.out_features == 2 * 16
    q, k, _ = layer.projections(torch.randn(2, 5, 16))
    assert torch.equal(q, k)
    with recording_attention(layer) as weights:
        layer(torch.randn(1, 5, 16))
    assert torch.equal(weights[0].diagonal(dim1=-2, dim2=-1)[..., 0], torch.ones(1, 2))  # row 0 sees only itself


def test_without_values_each_head_mixes_its_own_slice_of_the_input():
    layer = attention_layer("no_values")
    assert layer.c_attn.out_features == 2 * 16
    x = torch.randn(2, 5, 16)
    with recording_attention(layer) as recorded:
        out = layer(x)
    heads = x.view(2, 5, 2, 8).transpose(1, 2)  # (B, n_head, T, head_size): the input, head by head
    mixed = (recorded[0] @ heads).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(out, layer.c_proj(mixed))


def test_a_block_without_residuals_is_attention_then_mlp_and_the_bigram_model_looks_at_one_character():
    model = model_of("no_residual_with_mlp").eval()
    block, x = model.blocks[0], torch.randn(2, 5, 16)
    torch.testing.assert_close(block(x), block.mlp(block.attn(x)))
    assert not any("ln_1" in name or "ln_2" in name for name, _ in model.named_parameters())
    bigram = model_of("bigram").eval()
    idx = batch()[0][:2, :10]
    logits, _ = bigram(idx)
    alone, _ = bigram(idx.reshape(-1, 1))  # each character by itself gives the same next-character logits
    torch.testing.assert_close(logits.reshape(-1, 13), alone.reshape(-1, 13))


def test_unscaled_dot_product_is_the_scaled_one_with_queries_times_sqrt_head_size():
    scaled, unscaled = attention_layer("scaled_dot"), attention_layer("dot")
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    torch.testing.assert_close(unscaled.scores(q, k), scaled.scores(q * 8 ** 0.5, k))


@pytest.mark.parametrize("argv, message", [
    (["--attention_score", "additive", "--attention", "sdpa"], "additive has no fused kernel"),
    (["--attention_score", "uniform", "--position", "rope"], "no queries or keys for rope"),
    (["--attention_score", "cosine"], "attention_score must be one of scaled_dot, dot, additive, uniform"),
])
def test_impossible_forms_are_refused_in_one_line(argv, message):
    with pytest.raises(UserError, match=message):
        load_config(["--config", "debug", *argv], False)


def test_qk_norm_scores_unit_rms_queries_and_keys():
    layer = attention_layer("qk_norm")
    x = torch.randn(2, 6, 16)
    q, k, v = (t.view(2, 6, 2, 8).transpose(1, 2) for t in layer.c_attn(x).split(16, dim=-1))
    q, k = (t / t.pow(2).mean(-1, keepdim=True).add(torch.finfo(t.dtype).eps).sqrt() for t in (q, k))
    scores = (q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    with recording_attention(layer) as weights:
        y = layer(x)
    torch.testing.assert_close(weights[0], scores.softmax(-1))
    torch.testing.assert_close(y, layer.c_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 16)))


def test_every_declared_form_is_tried_here_and_in_the_browser():
    """Every form model/scoring.py declares (FORMS) is among this file's forms (causal, learns, resumes exactly,
    samples the same with the cache) and among the page's browser test's variants (its numbers equal PyTorch's), so
    a new form cannot reach the page untested."""
    import test_attention_html
    from model.scoring import FORMS as DECLARED
    default = ModelConfig(vocab_size=2).attention_score
    tried = {name: {v.get("attention_score", default) for v in variants.values()}
             for name, variants in (("here", FORMS), ("the browser test", test_attention_html.VARIANTS))}
    for where, forms in tried.items():
        assert set(DECLARED) <= forms, f"{sorted(set(DECLARED) - forms)} not tried in {where}"
