"""The decoder: config checks, initialisation, causality end to end, learning, optimizer groups."""
import copy
import math

import pytest
import torch

from model import GPT, ModelConfig
from model.attention import recording_attention
from model.kv_cache import Decoding
from training.optim import configure_optimizer
from bench import CountOperations
from conftest import set_attention_path

TINY = dict(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16)


@pytest.mark.parametrize("overrides, words", [
    (dict(n_embd=30, n_head=4), ["n_embd (30)", "n_head (4)"]),
    (dict(n_layer=-1), ["n_layer", "-1"]),
    (dict(dropout=1.5), ["dropout", "1.5"]),
    (dict(attention="fast"), ["attention", "'fast'"]),
])
def test_config_errors_name_the_field_and_value(overrides, words):
    with pytest.raises(ValueError) as err:
        ModelConfig(**{**TINY, **overrides})
    for word in words:
        assert word in str(err.value)


def test_initial_loss_is_near_uniform_and_init_follows_gpt2():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=65, block_size=32, n_layer=4, n_head=4, n_embd=64)
    model = GPT(cfg)
    idx, targets = torch.randint(0, 65, (2, 8, 32))
    _, loss = model(idx, targets)
    assert loss.item() == pytest.approx(math.log(65), abs=0.1)
    assert model.lm_head.weight is model.wte.weight
    assert model.blocks[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.1)
    proj_std = model.blocks[0].mlp.c_proj.weight.std().item()
    assert proj_std == pytest.approx(0.02 / math.sqrt(2 * 4), rel=0.1)


def test_parameter_counts():
    cfg = ModelConfig(**TINY)
    model = GPT(cfg)
    C, V, T, L = cfg.n_embd, cfg.vocab_size, cfg.block_size, cfg.n_layer
    per_block = (2 * 2 * C) + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    expected_total = V * C + T * C + L * per_block + 2 * C
    assert model.num_params(non_embedding=False) == expected_total
    assert model.num_params() == expected_total - T * C
    untied = GPT(ModelConfig(**TINY, tie_weights=False))
    assert untied.num_params(non_embedding=False) == expected_total + V * C


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_paths_agree_inside_the_model(position):
    torch.manual_seed(0)
    model = GPT(ModelConfig(**TINY, position=position)).eval()
    idx = torch.randint(0, 13, (3, 16))
    fast, _ = model(idx, idx)
    set_attention_path(model, "explicit")
    slow, _ = model(idx, idx)
    torch.testing.assert_close(slow, fast, rtol=1e-5, atol=1e-5)


def test_without_targets_every_position_and_when_decoding_only_the_next():
    torch.manual_seed(0)
    model = GPT(ModelConfig(**TINY)).eval()
    idx = torch.randint(0, 13, (2, 9))
    full, loss = model(idx)
    nxt, _ = model(idx, decoding=Decoding())
    with_targets, _ = model(idx, idx)
    assert loss is None and full.shape == (2, 9, 13) and nxt.shape == (2, 1, 13)
    torch.testing.assert_close(nxt, full[:, -1:])
    torch.testing.assert_close(with_targets, full)


def test_recording_attention_gives_each_layers_causal_weights_and_stops_after():
    torch.manual_seed(0)
    model = GPT(ModelConfig(**TINY)).eval()
    idx = torch.randint(0, 13, (2, 7))
    plain, _ = model(idx)
    with recording_attention(model) as weights:
        recorded, _ = model(idx)
    assert len(weights) == TINY["n_layer"] and weights[0].shape == (2, TINY["n_head"], 7, 7)
    assert all(torch.all(w.triu(diagonal=1) == 0) for w in weights)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(2, TINY["n_head"], 7))
    torch.testing.assert_close(recorded, plain, rtol=1e-5, atol=1e-5)  # recording changes nothing it returns
    model(idx)
    assert len(weights) == TINY["n_layer"]  # nothing recorded outside the with block


def test_longer_than_block_size_is_refused():
    model = GPT(ModelConfig(**TINY))
    with pytest.raises(ValueError, match="block_size 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=32))
    idx = torch.randint(0, 13, (4, 17))
    x, y = idx[:, :-1], idx[:, 1:]
    opt = configure_optimizer(model, 3e-3, 0.0, (0.9, 0.99), "cpu")
    for _ in range(300):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


def test_weight_decay_only_on_matrices():
    model = GPT(ModelConfig(**TINY))
    opt = configure_optimizer(model, 1e-3, 0.1, (0.9, 0.95), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_rope_rotates_without_stretching_and_scores_depend_only_on_distance():
    from model.attention import apply_rope, rope_tables
    cos, sin = rope_tables(32, 8)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)

    def at(x, pos):  # x placed at one position: (1, 1, 1, 8)
        return apply_rope(x, cos[pos].double(), sin[pos].double())

    assert torch.allclose(at(q, 5).norm(), q.norm())
    score = (at(q, 7) * at(k, 3)).sum()  # distance 4
    assert torch.allclose(score, (at(q, 20) * at(k, 16)).sum())  # distance 4 again, elsewhere
    assert torch.allclose(at(q, 0).flatten(), q)  # position 0 is not rotated
    model = GPT(ModelConfig(**TINY, position="rope"))
    assert model.wpe is None and model.num_params() == model.num_params(non_embedding=False)


def test_relu_squared_is_relu_then_square_with_gradient_two_relu():
    model = GPT(ModelConfig(**{**TINY, "activation": "relu2"}))
    act = model.blocks[0].mlp.act
    x = torch.linspace(-3, 3, 61, requires_grad=True)
    y = act(x)
    y.sum().backward()
    expected = [max(v, 0.0) ** 2 for v in x.tolist()]
    torch.testing.assert_close(y, torch.tensor(expected))
    torch.testing.assert_close(x.grad, torch.tensor([2 * max(v, 0.0) for v in x.tolist()]))
    with pytest.raises(ValueError, match="activation must be one of gelu, relu2, got 'swish'"):
        ModelConfig(**{**TINY, "activation": "swish"})


def test_muon_takes_the_block_matrices_and_adamw_everything_else():
    model = GPT(ModelConfig(**TINY))
    opt = configure_optimizer(model, 1e-3, 0.1, (0.9, 0.95), "cpu", kind="muon")
    names = {id(p): name for name, p in model.named_parameters()}
    muon = {names[id(p)] for group in opt.muon.param_groups for p in group["params"]}
    adamw = {names[id(p)] for group in opt.adamw.param_groups for p in group["params"]}
    assert muon == {name for name, p in model.named_parameters() if name.startswith("blocks.") and p.dim() == 2}
    assert muon.isdisjoint(adamw) and muon | adamw == set(names.values())
    assert "wte.weight" in adamw  # the embedding (shared with the head) is not a hidden matrix
    assert len(opt.param_groups) == 3  # the schedule sets every group's learning rate


def test_muon_and_adamw_hand_the_schedule_the_groups_they_step_with_after_a_checkpoint_is_loaded():
    """Loading a state dict gives each optimizer new group dicts: the learning rate the schedule writes must reach
    the groups the optimizers step with, after a resume as before it."""
    from training.optim import configure_optimizer
    model = GPT(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    opt = configure_optimizer(model, 1e-2, 0.1, (0.9, 0.95), "cpu", kind="muon")
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    for group in opt.param_groups:
        group["lr"] = 0.123
    assert [g["lr"] for g in opt.muon.param_groups + opt.adamw.param_groups] == [0.123] * 3


def test_a_muon_step_is_orthogonal_and_sized_like_adamw():
    """One step from rest moves a hidden matrix by lr * 0.2 * sqrt(max(rows, cols)) times a near-orthogonal
    matrix (5 Newton-Schulz steps leave its singular values between about 0.7 and 1.2): AdamW's update size."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(**TINY))
    lr = 1e-2
    opt = configure_optimizer(model, lr, 0.0, (0.9, 0.95), "cpu", kind="muon")
    weight = model.blocks[0].mlp.c_fc.weight  # (4 * n_embd, n_embd)
    before = weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.randn_like(p)  # a well-conditioned gradient, so 5 Newton-Schulz steps reach every direction
    opt.step()
    step = (before - weight.detach()) / (lr * 0.2 * max(weight.shape) ** 0.5)
    singular = torch.linalg.svdvals(step.double())
    assert singular.min() > 0.6 and singular.max() < 1.25, singular


def test_muon_and_adamw_step_through_a_gradient_scaler_like_one_optimizer():
    """float16 training (CUDA) scales the loss; unscaling and stepping both optimizers must give the plain step."""
    def one_step(scale: float | None):
        torch.manual_seed(0)
        model = GPT(ModelConfig(**TINY))
        opt = configure_optimizer(model, 1e-2, 0.1, (0.9, 0.95), "cpu", kind="muon")
        x = torch.randint(0, TINY["vocab_size"], (4, TINY["block_size"]))
        loss = model(x, x)[1]
        if scale is None:
            loss.backward()
            opt.step()
        else:
            scaler = torch.amp.GradScaler("cpu", init_scale=scale)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        return model.state_dict()

    plain, scaled = one_step(None), one_step(2.0 ** 10)
    for name in plain:  # a power-of-two scale unscales exactly
        torch.testing.assert_close(scaled[name], plain[name], rtol=0, atol=0)


def _snapshot(model, opt) -> list[torch.Tensor]:
    """Every weight and every tensor of optimizer state (moments, momentum buffers, step counts), copied."""
    state = opt.state_dict()
    inner = [state] if "state" in state else list(state.values())  # AdamW, or Muon + AdamW
    tensors = [t for s in inner for per_param in s["state"].values() for t in per_param.values()]
    return [t.detach().clone() for t in list(model.parameters()) + tensors]


@pytest.mark.parametrize("kind", ["adamw", "muon"])
def test_a_step_with_non_finite_gradients_changes_nothing_and_the_next_step_is_exact(kind, monkeypatch):
    """A skipped step leaves weights and optimizer state bit-identical, and the run then goes on exactly as one that
    never saw the bad gradients. On the device path (GPUs) the host never reads the flag, and it computes exactly
    what the host path (CPUs) computes."""
    torch.manual_seed(0)
    shapes = [p.shape for p in GPT(ModelConfig(**TINY)).parameters()]
    good = [[torch.randn(shape) for shape in shapes] for _ in range(3)]
    bad = [g.clone() for g in good[0]]
    bad[5].view(-1)[0] = float("nan")

    def host_read(self, *args):
        raise AssertionError("the step read a tensor on the host")

    def run(grads, on_device: bool):
        torch.manual_seed(0)
        model = GPT(ModelConfig(**TINY))
        opt = configure_optimizer(model, 1e-2, 0.1, (0.9, 0.95), "cpu", kind=kind)
        for step_grads in grads:
            for p, g in zip(model.parameters(), step_grads, strict=True):
                p.grad = g.clone()
            finite = torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            before = _snapshot(model, opt)
            with monkeypatch.context() as patch:
                if on_device:  # reading the flag on the host would fail here
                    for name in ("__bool__", "item", "tolist"):
                        patch.setattr(torch.Tensor, name, host_read)
                opt.step_if_finite(finite, on_device)
            if step_grads is bad:
                for a, b in zip(before, _snapshot(model, opt), strict=True):
                    assert torch.equal(a, b)
        return _snapshot(model, opt)

    results = [run(grads, on_device) for on_device in (True, False)
               for grads in ([good[0], bad, good[1], good[2]], [good[0], good[1], good[2]])]
    for other in results[1:]:
        assert len(other) == len(results[0])
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("nesterov", [True, False])
def test_our_muon_in_bfloat16_is_torch_muon_bit_for_bit(nesterov):
    """training.optim.Muon only adds a choice of Newton-Schulz dtype; in bfloat16 it must be torch.optim.Muon
    exactly."""
    def run(cls, **extra):
        torch.manual_seed(0)
        shapes = ((48, 16), (16, 64), (32, 32), (48, 16), (16, 64), (48, 16))  # ours stacks the same-shaped ones
        weights = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
        opt = cls(weights, lr=0.02, weight_decay=0.1, nesterov=nesterov, adjust_lr_fn="match_rms_adamw", **extra)
        for _ in range(3):
            for w in weights:
                w.grad = torch.randn_like(w)
            opt.step()
        return weights + [opt.state[w]["momentum_buffer"] for w in weights]

    from training.optim import Muon
    for ours, theirs in zip(run(Muon, ns_dtype=torch.bfloat16), run(torch.optim.Muon), strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("on_device", [True, False])
def test_an_optimizer_step_runs_as_many_operations_for_six_layers_as_for_two(on_device):
    """Muon updates the matrices of one shape as one stack and AdamW is fused, so a step dispatches the same number of
    operations (on a GPU, kernel launches) whatever the depth, on both the device path (GPUs) and the host path."""
    def count(n_layer: int) -> int:
        torch.manual_seed(0)
        model = GPT(ModelConfig(**{**TINY, "n_layer": n_layer}))
        opt = configure_optimizer(model, 1e-2, 0.1, (0.9, 0.95), "cpu", kind="muon")
        for _ in range(2):  # the first step also creates the optimizer's state
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            with CountOperations() as ops:
                opt.step_if_finite(torch.tensor(True), on_device)
        return ops.count

    assert count(6) == count(2) > 0


def test_newton_schulz_in_float32_matches_the_same_iteration_in_float64():
    """The float32 path (CPUs without bfloat16 units) against the polynomial written out in float64."""
    from training.optim import orthogonalize
    torch.manual_seed(0)
    coefficients = (3.4445, -4.7750, 2.0315)
    for shape in ((64, 16), (16, 64)):
        g = torch.randn(shape)
        x = g.double().T if shape[0] > shape[1] else g.double()
        x = x / x.norm()
        for _ in range(5):
            a, b, c = coefficients
            x = a * x + (b * (x @ x.T) + c * (x @ x.T) @ (x @ x.T)) @ x
        expected = x.T if shape[0] > shape[1] else x
        before = g.clone()
        got = orthogonalize(g, coefficients, 5, 1e-7, torch.float32)
        assert got.dtype == torch.float32 and got.shape == g.shape
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)
        assert torch.equal(g, before)  # the input is left alone (float32 to float32 must still copy)
        singular = torch.linalg.svdvals(got.double())  # the code's output, not the reference
        assert singular.min() > 0.5 and singular.max() < 1.3  # near-orthogonal, as Muon intends


@pytest.mark.parametrize("has_units, choice, expected", [(True, "auto", torch.bfloat16), (False, "auto", torch.float32),
                                                        (True, "float32", torch.float32),
                                                        (False, "bfloat16", torch.bfloat16)])
def test_muon_runs_newton_schulz_in_float32_on_cpus_without_bfloat16_units_unless_told(monkeypatch, has_units, choice,
                                                                                        expected):
    """--muon_dtype auto: bfloat16 where the CPU has the units, float32 where it has not; float32 or bfloat16 named
    are used on either."""
    from common import machine
    monkeypatch.setattr(machine, "cpu_has_bfloat16_units", lambda: has_units)
    opt = configure_optimizer(GPT(ModelConfig(**TINY)), 1e-2, 0.1, (0.9, 0.95), "cpu", kind="muon", muon_dtype=choice)
    assert opt.muon.ns_dtype == expected


@pytest.mark.skipif(not hasattr(torch.optim, "_muon") or not hasattr(torch.optim._muon, "_adjust_lr"),
                    reason="this torch no longer has Muon's private learning-rate function to compare with")
@pytest.mark.parametrize("adjust_lr_fn", [None, "original", "match_rms_adamw"])
@pytest.mark.parametrize("shape", [(640, 160), (160, 640), (160, 160)])
def test_muons_learning_rate_per_matrix_is_torchs(adjust_lr_fn, shape):
    from training.optim import muon_step_size
    assert muon_step_size(0.02, adjust_lr_fn, torch.Size(shape)) == \
        torch.optim._muon._adjust_lr(0.02, adjust_lr_fn, torch.Size(shape))


def test_logit_softcap_squashes_every_logit_by_its_formula_in_training_and_sampling():
    """logit_softcap c: the logits are c * tanh(z / c) of the uncapped model's z (same weights), for the training
    forward, the loss (the cross-entropy of the capped logits) and the decoding step with its key/value caches, so
    greedy sampling follows the capped logits; every logit lies inside (-c, c). 0 and positive numbers only."""
    from model.generate import generate
    torch.manual_seed(0)
    capped = GPT(ModelConfig(**TINY, position="rope", logit_softcap=1.0)).eval()
    plain = GPT(ModelConfig(**TINY, position="rope"))
    plain.load_state_dict(capped.state_dict())
    plain.eval()
    with torch.no_grad():
        for p in capped.parameters():
            p.mul_(3)  # logits well past the cap
        plain.load_state_dict(capped.state_dict())
        idx = torch.randint(0, 13, (2, 16))
        z, _ = plain(idx)
        logits, loss = capped(idx, idx)
        assert z.abs().max() > 2 and logits.abs().max() < 1
        torch.testing.assert_close(logits, torch.tanh(z))  # c * tanh(z / c), c = 1
        torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits.view(-1, 13), idx.view(-1)))
        step, _ = capped(idx, decoding=Decoding())
        torch.testing.assert_close(step, torch.tanh(z[:, -1:]))
    prompts = [[1, 2, 3]]
    cached = generate(capped, prompts, 20, temperature=0)
    assert cached == generate(capped, prompts, 20, temperature=0, use_cache=False)
    ids = list(prompts[0])
    for _ in range(20):  # greedy by hand over the capped formula
        with torch.no_grad():
            ids.append(int(torch.tanh(plain(torch.tensor([ids[-16:]]))[0][0, -1]).argmax()))  # c = 1
    assert cached[0] == ids[len(prompts[0]):]  # generate() returns the new characters
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="logit_softcap must be 0"):
            ModelConfig(**TINY, logit_softcap=bad)


def test_zero_proj_starts_every_block_as_the_identity_and_changes_nothing_else():
    """zero_proj: every c_proj weight (attention's and the MLP's) starts at 0, every other weight is what the same
    seed gives without it, and so the untrained model's logits are the head applied to the embedding alone."""
    torch.manual_seed(3)
    zero = GPT(ModelConfig(**TINY, zero_proj=True, bias=False))
    torch.manual_seed(3)
    usual = GPT(ModelConfig(**TINY, bias=False))
    for (name, a), (_, b) in zip(zero.named_parameters(), usual.named_parameters()):
        if name.endswith("c_proj.weight"):
            assert not a.any() and b.abs().min() > 0, name
        else:
            assert torch.equal(a, b), name
    idx = torch.randint(0, 13, (2, 16))
    with torch.no_grad():
        logits, _ = zero(idx)
        x = zero.wte(idx) + zero.wpe(torch.arange(16))
        torch.testing.assert_close(logits, zero.lm_head(zero.ln_f(x)))

