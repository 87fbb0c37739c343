"""scripts/attention_html.py: the page carries the model's weights exactly, references nothing outside itself, and in a
real browser computes what PyTorch computes: the logits, every step of attention (against model/textbook.py), and the
next character's probabilities (against model/generate.py), for every architecture option."""
import base64
import copy
import html as html_text
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import patient, run_script, set_attention_path, train_debug
from data import prepare, resolve
from data.tokenizer import CharTokenizer
from errors import run_cli
from model import GPT
from model.config import ModelConfig
from model.generate import generate, logits_to_probs
from model.attention import apply_rope
from model.textbook import Head
from training import checkpoint

import attention_html

TEXT = "ROMEO: but soft,\nwhat light"
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(not BROWSER, reason="needs Chromium (Debian/Ubuntu: apt-get install chromium)")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page")
    corpus = tmp / "corpus.txt"
    corpus.write_text("ROMEO: but soft, what light through yonder window breaks?\n" * 80, encoding="utf-8")
    train_debug(corpus, tmp / "run", "--max_iters", "20")
    return tmp


def make_page(run, *args):
    return run_script("attention_html.py", "--out_dir", str(run / "run"), *args)


def embedded(html: str) -> dict:
    blob = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, flags=re.S).group(1)
    return json.loads(blob)


@pytest.fixture(scope="module")
def page(run):
    done = make_page(run, "--text", TEXT, "--html", str(run / "page.html"))
    assert done.returncode == 0, done.stderr
    return run / "page.html"


def test_the_page_carries_every_weight_of_the_model_bit_for_bit(run, page):
    data = embedded(page.read_text(encoding="utf-8"))
    model, tokenizer, _ = checkpoint.load_model(run / "run" / "ckpt_best.safetensors")
    carried = np.frombuffer(base64.b64decode(data["weights"]), dtype="<f4")
    weights = model.state_dict()
    assert set(data["tensors"]) == set(weights) - {"lm_head.weight"}  # tied: the head is the token embedding
    for name, (start, end) in data["tensors"].items():
        assert np.array_equal(carried[start:end], weights[name].numpy().ravel()), name
    assert data["text"] == TEXT and data["config"] == model.config.to_dict()
    assert "".join(map(chr, data["vocab"])) == tokenizer.chars  # code points


def test_the_page_references_nothing_outside_itself(run, page):
    html = page.read_text(encoding="utf-8")
    for outside in ("http:", "https:", "src=", "href=", "@import", "url(", "//cdn", "<link", "fetch("):
        assert outside not in html, outside
    model, tokenizer, _ = checkpoint.load_model(run / "run" / "ckpt_best.safetensors")
    text = "</script><b>x"  # user text cannot end the data script or inject markup
    hostile = attention_html.page(model, tokenizer.chars, text, "</script>t", {"path": "</script><b>run"})
    assert "</script><b>" not in hostile and embedded(hostile)["text"] == text
    assert embedded(hostile)["about"] == {"path": "</script><b>run"}


# ---------------------------------------------------------------------------------------------
# In a real browser.
# ---------------------------------------------------------------------------------------------
SHARED = {}  # the one Chromium the module's pages open in, started when first needed (starting one costs a second)


@pytest.fixture(scope="module", autouse=True)
def shared_browser_ends_with_the_module():
    yield
    if SHARED:
        SHARED.pop("browser").__exit__()


def fresh_tab():
    """The module's one Chromium on a fresh blank tab (Browser.new_page), so that nothing of the last page is left."""
    from browser import Browser

    if "browser" not in SHARED:
        SHARED["browser"] = Browser().__enter__()
    SHARED["browser"].new_page()
    return SHARED["browser"]


def dom(page, fragment: str = "") -> str:
    """The page's document after its scripts ran (as chromium --dump-dom prints it), with no uncaught error in its
    script."""
    browser = fresh_tab()
    browser.open(page.as_uri() + fragment, timeout=120)
    html = browser.evaluate("document.documentElement.outerHTML")
    assert browser.errors == [], browser.errors
    return html


def numbers(page, **state) -> dict:
    """What the page computed, opened in the given state (#text=...&layer=...&numbers), as its JSON."""
    fragment = "#" + "&".join(f"{key}={quote(str(value), safe='')}" for key, value in {**state, "numbers": 1}.items())
    found = re.search(r'<pre id="numbers">(.*?)</pre>', dom(page, fragment), flags=re.S)
    assert found, "the page wrote no numbers"
    return json.loads(html_text.unescape(found.group(1)))


def exact(values) -> torch.Tensor:
    """The page's numbers (JavaScript's doubles) as they came."""
    return torch.tensor(values, dtype=torch.float64)


def span_weights(html: str) -> list[tuple[str, float]]:
    return [(ch, float(w)) for w, ch in
            re.findall(r'<span class="ch[^"]*" data-position="\d+" data-weight="([\d.]+)"[^>]*>(.*?)</span>', html)]


@needs_browser
def test_in_a_real_browser_the_text_shows_and_a_hover_highlights_that_characters_weights(run, page):
    model, tokenizer, _ = checkpoint.load_model(run / "run" / "ckpt_best.safetensors")
    weights = attention_html.attention_of(model, tokenizer.encode(TEXT))
    still = span_weights(dom(page, "#view=2"))
    shown = "".join(ch for ch, _ in still).replace("&nbsp;", " ").replace("\u00a0", " ").replace("\u21b5", "\n")
    assert shown == TEXT
    hovered = span_weights(dom(page, "#layer=2&view=2&hover=6"))  # the 6th character, layer 2, head 2
    assert [w for _, w in hovered[:6]] == pytest.approx(weights[1][1][5], abs=1e-5)
    assert all(w == 0 for _, w in hovered[6:]) and any(w > 0 for _, w in hovered)


VARIANTS = {  # every architecture option, each in some variant
    "learned-gelu-bias-tied": {},
    "rope-qknorm-relu2-nobias-untied": dict(position="rope", qk_norm=True, activation="relu2", bias=False,
                                            tie_weights=False, logit_softcap=2.0),  # soft-capped too: logits pass 2
    "none-additive-noresidual": dict(position="none", attention_score="additive", residual=False),
    "dot-sharedqk-novalues-nomlp": dict(attention_score="dot", shared_qk=True, attention_values=False, mlp=False),
    "uniform": dict(attention_score="uniform"),
}


def variant_checkpoint(run, name: str):
    """The trained debug run's checkpoint with a model of the variant's shape in it, its weights drawn large enough
    that attention is far from uniform and every nonlinearity is used over its range."""
    state = checkpoint.load(run / "run" / "ckpt_best.safetensors")
    config = ModelConfig(**{**state["model_config"], **VARIANTS[name]})
    torch.manual_seed(len(name))
    model = GPT(config)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            param.copy_(torch.randn_like(param) * (0.2 if "ln" not in param_name else 0.3)
                        + (1.0 if param_name.endswith("ln_1.weight") or param_name.endswith("ln_2.weight")
                           or param_name == "ln_f.weight" else 0.0))
    path = run / f"{name}.safetensors"
    checkpoint.save({**state, "model": model.state_dict(), "model_config": config.to_dict()}, path)
    return path, model.eval(), CharTokenizer(state["vocab"])


def attention_inputs_and_outputs(model, idx):
    """Each layer's attention input (the block's normalised x) and output, from hooks on the PyTorch model."""
    seen = []
    hooks = [block.attn.register_forward_hook(lambda m, args, out: seen.append((args[0][0], out[0])))
             for block in model.blocks]
    try:
        logits, _ = model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return logits[0], seen


def pytorch_stream(model, idx) -> dict:
    """Every step of the forward pass under the names the page's overview gives them, read from hooks on the PyTorch
    model's own modules: the embeddings, each block's norms, attention, residual sums, MLP hidden layer and output,
    ln_f and the logits (T rows each)."""
    got, hooks = {}, []

    def keep(name, module, take_input=False):
        def hook(_, args, out):
            got[name] = (args[0] if take_input else out)[0]
        hooks.append(module.register_forward_hook(hook))
    keep("embedding.token", model.wte)
    if model.wpe is not None:
        keep("embedding.position", model.wpe)
    for b, block in enumerate(model.blocks, 1):
        keep(f"block{b}.input", block, take_input=True)
        keep(f"block{b}.attention", block.attn)
        keep(f"block{b}.output", block)
        if model.config.residual:
            keep(f"block{b}.ln_1", block.ln_1)
        if block.mlp is not None:
            keep(f"block{b}.mlp_hidden", block.mlp.act)
            keep(f"block{b}.mlp", block.mlp)
            if model.config.residual:
                keep(f"block{b}.ln_2", block.ln_2)
    keep("ln_f", model.ln_f)
    try:
        with torch.no_grad():
            got["logits"] = model(idx)[0][0]
    finally:
        for hook in hooks:
            hook.remove()
    if model.wpe is not None:
        got["embedding.sum"] = got["block1.input"]  # (dropout is off: the first block reads wte + wpe as it is)
    for b in range(1, model.config.n_layer + 1):
        block_input, output = got.pop(f"block{b}.input"), got.pop(f"block{b}.output")
        if model.config.residual:
            got[f"block{b}.residual_1"] = block_input + got[f"block{b}.attention"]
            if f"block{b}.mlp" in got:
                got[f"block{b}.residual_2"] = output
    return got


@needs_browser
@pytest.mark.parametrize("name", VARIANTS)
def test_in_a_real_browser_the_page_computes_what_pytorch_computes(run, tmp_path, name):
    """The logits, one character's attention step by step, the next character's probabilities, and every step of
    the overview of the whole model (the embeddings, each LayerNorm, attention, residual sum and MLP, ln_f) equal
    PyTorch's for each architecture variant."""
    path, model, tokenizer = variant_checkpoint(run, name)
    html = tmp_path / "page.html"
    assert run_cli(attention_html.main, ["--ckpt", str(path), "--text", TEXT, "--html", str(html)]) == 0
    layer, head, query = 2, 2, 9  # counted from 1, as the page counts
    sampling = dict(temperature=0.7, top_k=5, top_p=0.9)
    got = numbers(html, text=TEXT, layer=layer, view=head, query=query, **sampling)
    idx = torch.tensor([tokenizer.encode(TEXT)])
    with torch.no_grad():
        logits, seen = attention_inputs_and_outputs(model, idx)
        weights = attention_html.attention_of(model, idx[0].tolist())
    assert got["text"] == TEXT
    torch.testing.assert_close(exact(got["logits"]), logits.double(), atol=1e-4, rtol=0)
    if cap := model.config.logit_softcap:  # the cap bites: without it, some logits lie well past it
        uncapped = copy.deepcopy(model)
        uncapped.config.logit_softcap = 0.0
        with torch.no_grad():
            assert uncapped(idx)[0].abs().max() > cap + 1 and logits.abs().max() < cap

    step, (x, out) = got["step"], seen[layer - 1]
    assert (step["layer"], step["head"], step["query"]) == (layer, head, query)
    torch.testing.assert_close(exact(step["input"]), x[query - 1].double(), atol=1e-5, rtol=0)
    torch.testing.assert_close(exact(step["weights"]), torch.tensor(weights[layer - 1][head - 1][query - 1],
                                                                           dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(exact(step["output"]), out[query - 1].double(), atol=1e-5, rtol=0)
    assert len(step["keys"]) == len(step["raw"]) == query  # the keys up to the query's own: the causal mask

    probs = logits_to_probs(logits[-1:], **sampling)[0]
    torch.testing.assert_close(exact(got["probs"]), probs.double(), atol=1e-5, rtol=0)

    stream = pytorch_stream(model, idx)
    assert list(got["model"]) == [name for name in OVERVIEW_ORDER(model.config) if name in stream]
    assert set(got["model"]) == set(stream)
    for step, values in got["model"].items():
        torch.testing.assert_close(exact(values), stream[step].double(), atol=1e-4 if step == "logits" else 2e-5,
                                   rtol=0, msg=step)


def OVERVIEW_ORDER(config) -> list[str]:  # noqa: N802 (a table, spelt as one)
    """The overview's steps in the order the forward pass takes them."""
    per_block = ["ln_1", "attention", "residual_1", "ln_2", "mlp_hidden", "mlp", "residual_2"]
    return (["embedding.token", "embedding.position", "embedding.sum"]
            + [f"block{b}.{part}" for b in range(1, config.n_layer + 1) for part in per_block] + ["ln_f", "logits"])


def step_in_the_browser(run, tmp_path, variant: str, layer: int, head: int, query: int):
    """The step view's numbers for a variant's page on TEXT, the PyTorch model, and its attention inputs/outputs."""
    path, model, tokenizer = variant_checkpoint(run, variant)
    html = tmp_path / "page.html"
    assert run_cli(attention_html.main, ["--ckpt", str(path), "--text", TEXT, "--html", str(html)]) == 0
    step = numbers(html, layer=layer, view=head, query=query)["step"]
    with torch.no_grad():
        _, seen = attention_inputs_and_outputs(model, torch.tensor([tokenizer.encode(TEXT)]))
    return step, model, seen


@needs_browser
def test_in_a_real_browser_each_step_equals_the_textbook_head(run, tmp_path):
    """The step view's query, keys, scores, scaled scores, weights and weighted sum for one head equal
    model/textbook.py's Head given that head's share of the model's projections."""
    layer, head, query = 1, 2, 14
    step, model, seen = step_in_the_browser(run, tmp_path, "learned-gelu-bias-tied", layer, head, query)
    with torch.no_grad():
        cfg, attn = model.config, model.blocks[layer - 1].attn
        size, rows = cfg.head_size, slice((head - 1) * cfg.head_size, head * cfg.head_size)
        textbook = Head(cfg.n_embd, size, cfg.block_size, bias=True)
        for i, part in enumerate((textbook.query, textbook.key, textbook.value)):
            part.weight.copy_(attn.c_attn.weight[i * cfg.n_embd:][rows])
            part.bias.copy_(attn.c_attn.bias[i * cfg.n_embd:][rows])
        x = seen[layer - 1][0][None]  # (1, T, n_embd)
        q, k, v = textbook.query(x)[0], textbook.key(x)[0], textbook.value(x)[0]
        raw = q[query - 1] @ k[:query].T
        scaled = raw / math.sqrt(size)
        alpha = F.softmax(scaled, dim=-1)
        head_out = textbook(x)[0, query - 1]
    for got, expected in ((step["q"], q[query - 1]), (step["keys"], k[:query]), (step["values"], v[:query]),
                          (step["raw"], raw), (step["scores"], scaled), (step["weights"], alpha),
                          (step["out"], head_out)):
        torch.testing.assert_close(exact(got), expected.double(), atol=1e-5, rtol=0)


@needs_browser
def test_in_a_real_browser_the_rotary_query_is_the_projection_normalised_and_turned(run, tmp_path):
    layer, head, query = 2, 1, 20
    step, model, seen = step_in_the_browser(run, tmp_path, "rope-qknorm-relu2-nobias-untied", layer, head, query)
    with torch.no_grad():
        cfg = model.config
        q = model.blocks[layer - 1].attn.c_attn(seen[layer - 1][0])[query - 1, :cfg.n_embd]
        q = F.rms_norm(q[(head - 1) * cfg.head_size:head * cfg.head_size], (cfg.head_size,))
        q = apply_rope(q, model.rope_cos[query - 1], model.rope_sin[query - 1])
    torch.testing.assert_close(exact(step["q"]), q.double(), atol=1e-5, rtol=0)


@needs_browser
def test_in_a_real_browser_greedy_appending_is_generate_and_a_seed_repeats_its_draws(run, page):
    model, tokenizer, _ = checkpoint.load_model(run / "run" / "ckpt_best.safetensors")
    greedy = numbers(page, text="ROMEO", temperature=0, append=6)["text"]
    expected = generate(model, [tokenizer.encode("ROMEO")], 6, temperature=0)[0]
    assert greedy == "ROMEO" + tokenizer.decode(expected)
    first = numbers(page, text="ROMEO", seed=7, append=8)["text"]
    assert numbers(page, text="ROMEO", seed=7, append=8)["text"] == first and len(first) == 13
    unknown = numbers(page, text="RO\u0436MEO")  # a character never seen is skipped, and named in the note
    assert unknown["text"] == "ROMEO"
    note = re.search(r'<p class="note warn" id="input-note">(.*?)</p>', dom(page, "#text=RO%D0%B6MEO")).group(1)
    assert "never seen in training: \u201c\u0436\u201d" in note


@needs_browser
def test_the_page_benchmark_reports_the_forward_pass_in_the_browser(run, tmp_path):
    figures = tmp_path / "page.json"
    done = run_script("bench_page.py", "--out_dir", str(run / "run"), "--chars", "20", "--passes", "3",
                      "--json", str(figures))
    assert done.returncode == 0, done.stderr
    got = json.loads(figures.read_text())
    assert got["chars"] == 20 and got["passes"] == 3 and got["forward_ms_min"] <= got["forward_ms_median"] > 0
    assert "ms (median of 3" in done.stdout and done.stderr == ""


@pytest.mark.slow
@needs_browser
def test_the_page_benchmark_stopped_by_sigterm_leaves_no_folder_and_no_chromium(run, tmp_path):
    """bench_page.py sent SIGTERM while Chromium runs the page: it exits with 130, Chromium and its helpers are gone,
    and its temporary folder (the page, Chromium's profile and singleton socket) is removed."""
    state = checkpoint.load(run / "run" / "ckpt_best.safetensors")
    config = ModelConfig(**{**state["model_config"], "n_layer": 4, "n_head": 4, "n_embd": 192, "block_size": 64})
    path = tmp_path / "wide.safetensors"  # a model whose 1000 forward passes take Chromium a minute or more
    checkpoint.save({**state, "model": GPT(config).state_dict(), "model_config": config.to_dict()}, path)
    # A short temporary directory: Chromium aborts where the path of its singleton socket in it is too long for a
    # Unix socket (108 bytes), as pytest's own tmp_path can be.
    temp = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    bench = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "scripts" / "bench_page.py"), "--ckpt",
                              str(path), "--passes", "1000"], env={**os.environ, "TMPDIR": str(temp)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + patient(120)
        while not list(temp.glob("*/profile/*")) and bench.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(temp.glob("*/profile/*")), "Chromium never started"
        time.sleep(1)
        bench.send_signal(signal.SIGTERM)
        out, err = bench.communicate(timeout=patient(60))
    finally:
        bench.kill()
        left = [entry.name for entry in temp.iterdir() if not entry.name.startswith("torchinductor")]
        shutil.rmtree(temp)
    assert bench.returncode == 130 and err.strip() == "interrupted", err
    assert left == []
    browsers = [cmdline for cmdline in Path("/proc").glob("[0-9]*/cmdline") if str(temp) in read_quietly(cmdline)]
    assert browsers == []


def read_quietly(path: Path) -> str:
    """A /proc file's text, or "" for a process that has ended."""
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return ""


@needs_browser
def test_a_learner_types_clicks_and_appends_and_every_view_follows(run, page):
    """Driven as a person drives it (keys typed one by one, real mouse clicks): each keystroke recomputes the model,
    whose logits equal PyTorch's for the text typed so far; a click picks the character the steps explain; the button
    appends a character the model finds possible."""
    model, tokenizer, _ = checkpoint.load_model(run / "run" / "ckpt_best.safetensors")
    browser = fresh_tab()
    browser.open(page.as_uri())
    browser.type("soft, wh", into="#input", replace=True)  # over the opening text
    assert browser.evaluate("document.querySelectorAll('#strip .ch').length") == 8
    logits = browser.evaluate("JSON.parse(numbers({})).logits")
    with torch.no_grad():
        expected = model(torch.tensor([tokenizer.encode("soft, wh")]))[0][0]
    torch.testing.assert_close(exact(logits), expected.double(), atol=1e-4, rtol=0)
    browser.click("#strip .ch:nth-of-type(3)")  # the "f"
    assert browser.evaluate("document.getElementById('step-title').textContent").startswith(
        "\u201cf\u201d (character 3), layer 1, head 1")
    probs = browser.evaluate("JSON.parse(numbers({})).probs")
    browser.click("#append")
    text = browser.evaluate("document.getElementById('input').value")
    assert text[:8] == "soft, wh" and len(text) == 9 and probs[tokenizer.stoi[text[8]]] > 0
    assert browser.evaluate("document.querySelectorAll('#strip .ch').length") == 9
    assert browser.errors == []


# A vocabulary beyond the Basic Multilingual Plane: two astral characters, and a lone high and low surrogate (what
# --encoding unicode_escape reads from "\\ud83d\\ude00") that meet in "ME", where JavaScript would join them into one.
ASTRAL = str.maketrans({"R": "\U0001f389", "O": "\U0001d4b3", "M": "\ud83d", "E": "\ude00"})


@needs_browser
def test_in_a_real_browser_characters_beyond_the_basic_plane_keep_their_ids(run, tmp_path):
    """With astral characters and lone surrogates in the vocabulary, the page reads the opening text as the model's
    own ids, computes PyTorch's logits, and appends greedily exactly the ids generate() appends (none undefined)."""
    state = checkpoint.load(run / "run" / "ckpt_best.safetensors")
    path = tmp_path / "astral.safetensors"
    checkpoint.save({**state, "vocab": state["vocab"].translate(ASTRAL)}, path)
    model, tokenizer, _ = checkpoint.load_model(path)
    text = TEXT.translate(ASTRAL)
    html = tmp_path / "page.html"
    assert run_cli(attention_html.main, ["--ckpt", str(path), "--text", text, "--html", str(html)]) == 0
    got = numbers(html, temperature=0, append=4)
    ids = tokenizer.encode(text)
    appended = generate(model, [ids], 4, temperature=0)[0]
    assert got["ids"] == ids + appended and "undefined" not in got["text"]
    with torch.no_grad():
        logits = model(torch.tensor([ids + appended]))[0][0]
    torch.testing.assert_close(exact(got["logits"]), logits.double(), atol=1e-4, rtol=0)
    typed = numbers(html, text="\U0001f389\U0001d4b3")  # typed astral characters: one id each
    assert typed["ids"] == tokenizer.encode("\U0001f389\U0001d4b3")


@needs_browser
def test_an_address_asking_for_a_billion_appends_appends_one_window(page):
    """#append is bounded by the block size: the page finishes, with a window's worth of characters added."""
    html = dom(page, "#text=ROMEO&temperature=0&append=1000000000")
    note = re.search(r'<p class="note warn" id="input-note">(.*?)</p>', html).group(1)
    assert note == "32 of at most 32 characters; the first 5 left out: the model reads at most 32"


@needs_browser
def test_the_browser_keeps_its_pipe_when_the_system_hands_out_fds_3_and_4():
    """In a process whose fds 3 and 4 are free, os.pipe() returns exactly those (checked), and tests/browser.py's
    Chromium still answers over its pipe."""
    script = ("import os, sys\n"
              "for fd in (3, 4):\n"
              "    try: os.close(fd)\n"
              "    except OSError: pass\n"
              "r, w = os.pipe(); assert (r, w) == (3, 4), (r, w); os.close(r); os.close(w)\n"
              "sys.path.insert(0, sys.argv[1])\n"
              "from browser import Browser\n"
              "with Browser() as browser: print(browser.evaluate('6 * 7'))\n")
    done = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True, text=True,
                          timeout=patient(120), close_fds=True)
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr[-2000:]


def pytorch_matrices(model, x, layer: int, head: int, factor: float) -> dict:
    """One head's matrices for the layer's attention input x (T, n_embd), computed here from the module's own parts:
    Q, K, V (T x head_size), S = QKᵀ, S times factor, masked with -inf, A = softmax, A·V."""
    attn, cfg, T = model.blocks[layer - 1].attn, model.config, x.size(0)
    q, k, v = (t[0, :, head - 1] for t in attn.projections(x[None]))  # (T, head_size) each
    if cfg.qk_norm:
        q, k = F.rms_norm(q, (cfg.head_size,)), F.rms_norm(k, (cfg.head_size,))
    if cfg.position == "rope":
        q, k = (apply_rope(t, model.rope_cos[:T], model.rope_sin[:T]) for t in (q, k))
    scores = q @ k.T
    masked = (scores * factor).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    weights = F.softmax(masked, dim=-1)
    return {"Q": q, "K": k, "V": v, "S": scores, "scaled": scores * factor, "masked": masked, "A": weights,
            "AV": weights @ v}


# What each matrix step must say the tutorials call it (their symbols, and the notebook cell that computes it).
TUTORIAL_NAMES = {
    "Q": ["000 In [28] q = query(x)", "001 In [29] queries = x @ W_query", "004 q\u2071"],
    "K": ["000 In [28] k = key(x)", "001 In [8] keys = x @ W_key"],
    "V": ["000 In [36] v = value(x)", "001 In [8] values = x @ W_value"],
    "S": ["000 In [31] wei = q @ k.transpose(-2, -1)", "001 In [29] \u03c9, attn_scores", "002 In [None]"],
    "scaled": ["001 In [30] \u03c9 / \u221ad_k", "004 \u03b1i,j = q\u2071\u00b7k\u02b2 / \u221ad",
               "000 In [48] none: its last cell scales the output instead"],
    "masked": ["000 In [33] wei.masked_fill(tril == 0, float('-inf'))", "001 In [33] masked_simple",
               "\u22121e6 where the page has \u2212\u221e"],
    "A": ["000 In [33] wei = F.softmax(wei, dim=-1)", "001 In [30] \u03b1, attn_weights", "004 \u03b1i,j"],
    "AV": ["000 In [36] out = wei @ v", "001 In [15] z, context_vec", "004 b\u2071"],
}


def factor_model(model, factor: float):
    """The same weights with every q·k multiplied by factor instead of the model's own (the explicit path)."""
    set_attention_path(model, "explicit")
    for block in model.blocks:
        block.attn.scores = lambda q, k: (q @ k.transpose(-2, -1)) * factor
    return model


@needs_browser
def test_a_learner_steps_through_the_matrices_points_clicks_and_changes_the_scale(run, tmp_path):
    """The matrix view, driven by clicks: each step's drawn matrix (Q, K, V, S, S/√d, masked, A, A·V) equals
    PyTorch's within 1e-5 (the mask's cells -inf and hatched, not white); pointing at a cell shows its number;
    clicking a row explains that character. The what-if scale (x1, x10) gives PyTorch's logits with that factor; at
    the model's own factor the page is the model again."""
    layer, head = 2, 2
    path, model, tokenizer = variant_checkpoint(run, "rope-qknorm-relu2-nobias-untied")
    html = tmp_path / "page.html"
    assert run_cli(attention_html.main, ["--ckpt", str(path), "--text", TEXT, "--html", str(html)]) == 0
    idx = torch.tensor([tokenizer.encode(TEXT)])
    with torch.no_grad():
        own_logits, seen = attention_inputs_and_outputs(model, idx)
        expected = pytorch_matrices(model, seen[layer - 1][0], layer, head, 1 / math.sqrt(model.config.head_size))
    drawn = ("Array.from(document.querySelectorAll('#matrix tr')).slice(1).map(tr => "
             "Array.from(tr.querySelectorAll('td')).map(td => td.dataset.value))")  # "-Infinity" where masked
    browser = fresh_tab()
    browser.open(html.as_uri() + f"#layer={layer}&view={head}")
    assert browser.evaluate("document.getElementById('matrix-formula').textContent").startswith(
        f"Layer {layer}, head {head}: A = softmax")  # it opens on the weights
    browser.choose("#matrix-step", "0")
    for name in expected:
        assert browser.evaluate("document.getElementById('matrix-formula').textContent").startswith(
            f"Layer {layer}, head {head}: ")
        got = [[float(value) for value in row] for row in browser.evaluate(drawn)]
        assert len(got) == len(TEXT), name
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), expected[name].double(), atol=1e-5,
                                   rtol=0, msg=name)
        if name == "masked":
            hatched = browser.evaluate("Array.from(document.querySelectorAll('#matrix td.masked')).map(td => "
                                       "getComputedStyle(td).backgroundImage).filter(b => b.includes("
                                       "'repeating-linear-gradient')).length")
            assert hatched == len(TEXT) * (len(TEXT) - 1) // 2
            browser.point("#matrix tr:nth-child(3) td:nth-child(4)")  # query 2, key 3: the future
            assert browser.evaluate("document.getElementById('matrix-readout').textContent") == \
                "masked[2][3] = \u2212\u221e"
            browser.point("#matrix tr:nth-child(5) td:nth-child(3)")  # query 4, key 2
            shown = browser.evaluate("document.getElementById('matrix-readout').textContent")
            assert shown == f"masked[4][2] = {expected['masked'][3, 1].item():.4f}"
        named = browser.evaluate("document.getElementById('matrix-tutorials').textContent")
        assert all(part in named for part in TUTORIAL_NAMES[name]), (name, named)
        if name in ("A", "AV"):  # 004's α̂ᵢ,ⱼ as markup: a monospace font has no combining hat, nor ⱼ
            assert '004 <span class="hat">\u03b1</span><sub>i,j</sub>' in browser.evaluate(
                "document.getElementById('matrix-tutorials').innerHTML").replace("b\u2071 = \u03a3<sub>j</sub> ", "")
        assert browser.evaluate("document.querySelector('#legend tr.chosen').dataset.symbol") == name
        browser.click("#matrix-next")
    browser.click("#matrix tr:nth-child(6) th")  # the row of character 5
    assert browser.evaluate("document.getElementById('step-title').textContent").startswith(
        "\u201cO\u201d (character 5)")
    for choice, factor in (("1", 1.0), ("10", 10.0)):
        browser.choose("#scale", choice)
        if choice == "10":  # 10 against the model's own 1/√head_size, said as a multiple of it
            assert f"({10 * math.sqrt(model.config.head_size):.1f} times it)" in browser.evaluate(
                "document.getElementById('what-if').textContent")
        assert not browser.evaluate("document.getElementById('what-if').hidden")
        with torch.no_grad():
            logits = factor_model(copy.deepcopy(model), factor)(idx)[0][0]
        torch.testing.assert_close(exact(browser.evaluate("JSON.parse(numbers({})).logits")), logits.double(),
                                   atol=1e-4, rtol=0)
    browser.choose("#scale", "sqrt")
    assert browser.evaluate("document.getElementById('what-if').hidden")
    torch.testing.assert_close(exact(browser.evaluate("JSON.parse(numbers({})).logits")), own_logits.double(),
                               atol=1e-4, rtol=0)
    browser.open("about:blank")  # a short text: each cell of its weights A has its number written in it
    browser.open(html.as_uri() + f"#text=ROMEO&layer={layer}&view={head}")
    written = browser.evaluate("Array.from(document.querySelectorAll('#matrix tr')).slice(1).map(tr => "
                               "Array.from(tr.querySelectorAll('td')).map(td => Number(td.textContent)))")
    with torch.no_grad():
        _, short = attention_inputs_and_outputs(model, torch.tensor([tokenizer.encode("ROMEO")]))
        weights = pytorch_matrices(model, short[layer - 1][0], layer, head,
                                   1 / math.sqrt(model.config.head_size))["A"]
    torch.testing.assert_close(torch.tensor(written, dtype=torch.float64), weights.double(), atol=0.005 + 1e-6,
                               rtol=0)
    assert browser.errors == []


@needs_browser
def test_a_learner_sees_every_head_at_once_points_at_a_weight_and_opens_a_head(run, tmp_path):
    """Every layer x head as a picture of its weights for the whole text: each pixel is its head's colour at
    PyTorch's weight (within one step of 255), the masked future a dark grey that no weight's colour reaches;
    pointing at a pixel shows PyTorch's weight, or "masked" in the future; clicking a head opens it in the matrix
    view at its weights A, equal to PyTorch's within 1e-5."""
    path, model, tokenizer = variant_checkpoint(run, "rope-qknorm-relu2-nobias-untied")
    html = tmp_path / "page.html"
    assert run_cli(attention_html.main, ["--ckpt", str(path), "--text", TEXT, "--html", str(html)]) == 0
    ids, T = tokenizer.encode(TEXT), len(TEXT)
    expected = attention_html.attention_of(model, ids)  # [layer][head][query][key <= query]
    browser = fresh_tab()
    browser.open(html.as_uri())
    palette = browser.evaluate("HEAD_RGB")
    for layer in range(model.config.n_layer):
        for head in range(model.config.n_head):
            canvas = f'#heads canvas[data-layer="{layer}"][data-head="{head}"]'
            pixels = np.array(browser.evaluate(f"(() => {{ const c = document.querySelector('{canvas}'); "
                                               f"return Array.from(c.getContext('2d').getImageData(0, 0, "
                                               f"c.width, c.height).data); }})()")).reshape(T, T, 4)
            weights = np.zeros((T, T))
            for query, row in enumerate(expected[layer][head]):
                weights[query, :query + 1] = row
            colour = np.array(palette[head])
            wanted = np.rint(255 + (colour - 255) * np.sqrt(weights)[..., None])
            future = np.triu(np.ones((T, T), dtype=bool), 1)
            wanted[future] = [85, 85, 85]
            assert np.abs(pixels[..., :3] - wanted).max() <= 1, (layer, head)
            grey_reachable = np.abs(np.rint(255 + (colour - 255) * np.sqrt(np.linspace(0, 1, 1001))[:, None])
                                    - 85).max(axis=1).min()
            assert grey_reachable > 8  # no weight is drawn near the grey of the mask
    for query, key in ((5, 2), (20, 20), (3, 9)):  # 1-based: a weight, the diagonal, the future
        browser.point('#heads canvas[data-layer="1"][data-head="0"]', at=((key - 0.5) / T, (query - 0.5) / T))
        shown = browser.evaluate("document.getElementById('heads-readout').textContent")
        value = f"{expected[1][0][query - 1][key - 1]:.4f}" if key <= query else "masked (the future)"
        assert shown.startswith(f"layer 2, head 1: A[{query}][{key}] = {value}, "), shown
    browser.click('#heads canvas[data-layer="1"][data-head="1"]')
    assert browser.evaluate("[document.getElementById('layer').value, document.getElementById('view').value]") \
        == ["1", "1"]
    assert browser.evaluate("document.getElementById('matrix-formula').textContent").startswith(
        "Layer 2, head 2: A = softmax")
    drawn = browser.evaluate("Array.from(document.querySelectorAll('#matrix tr')).slice(1).map(tr => "
                             "Array.from(tr.querySelectorAll('td')).map(td => Number(td.dataset.value)))")
    with torch.no_grad():
        _, seen = attention_inputs_and_outputs(model, torch.tensor([ids]))
        matrices = pytorch_matrices(model, seen[1][0], 2, 2, 1 / math.sqrt(model.config.head_size))
    torch.testing.assert_close(torch.tensor(drawn, dtype=torch.float64), matrices["A"].double(), atol=1e-5, rtol=0)
    assert browser.errors == []


def variant_page(run, tmp_path, name: str):
    """The page of a variant's model (variant_checkpoint) opened on TEXT: its path, the model, the tokenizer."""
    path, model, tokenizer = variant_checkpoint(run, name)
    html = tmp_path / f"{name}.html"
    assert run_cli(attention_html.main, ["--ckpt", str(path), "--text", TEXT, "--html", str(html)]) == 0
    return html, model, tokenizer


@needs_browser
def test_a_learner_sees_what_rotary_positions_do_for_the_character_clicked(run, tmp_path):
    """Rotary positions explained: after a click on character 5, each pair's frequency and its angle at character 5
    are model/attention.py's rotary tables' (the angle's cosine is the model's own table entry), and the picture's q·k of q = k = ones
    equals PyTorch's apply_rope for every distance, from the first character and from the middle alike."""
    html, model, _ = variant_page(run, tmp_path, "rope-qknorm-relu2-nobias-untied")
    head_size, block_size = model.config.head_size, model.config.block_size
    frequencies = 10000.0 ** (-torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
    browser = fresh_tab()
    browser.open(html.as_uri())
    browser.click("#strip .ch:nth-of-type(5)")
    assert "angle at character 5" in browser.evaluate("document.getElementById('rotary').textContent")
    about = browser.evaluate("document.getElementById('positions-about').textContent")
    assert f"\u03b8\u1d62 = 10000^(\u22122(i \u2212 1)/{head_size})" in about  # pair 1: θ = 1, as the table has
    assert "q\u00b7k" in browser.evaluate("Array.from(document.querySelectorAll('#distance-plot text'))"
                                           ".map(t => t.textContent)")  # the y axis, labelled
    rows = browser.evaluate("Array.from(document.querySelectorAll('#rotary tr')).slice(1).map(tr => "
                            "[Number(tr.dataset.frequency), Number(tr.dataset.angle)])")
    dots = browser.evaluate("Array.from(document.querySelectorAll('#distance-plot circle')).map(c => "
                            "[Number(c.dataset.from), Number(c.dataset.distance), Number(c.dataset.value)])")
    assert browser.errors == []
    got = torch.tensor(rows, dtype=torch.float64)
    torch.testing.assert_close(got[:, 0], frequencies.double(), atol=0, rtol=1e-6)
    torch.testing.assert_close(got[:, 1], (4 * frequencies).double(), atol=0, rtol=1e-6)  # position 4: character 5
    torch.testing.assert_close(got[:, 1].cos(), model.rope_cos[4, :head_size // 2].double(), atol=1e-6, rtol=0)
    turned = apply_rope(torch.ones(block_size, head_size), model.rope_cos, model.rope_sin)  # q = k = ones, turned
    middle = block_size // 2
    assert sorted({start for start, _, _ in dots}) == [1, middle + 1]
    for start in (1, middle + 1):
        values = torch.tensor([value for s, _, value in dots if s == start], dtype=torch.float64)
        assert [d for s, d, _ in dots if s == start] == list(range(block_size - start + 1))
        expected = turned[start - 1:] @ turned[start - 1]
        torch.testing.assert_close(values, expected.double(), atol=1e-5, rtol=0)
        torch.testing.assert_close(values, (turned @ turned[0])[:len(values)].double(), atol=1e-5, rtol=0)


@needs_browser
def test_a_learner_sees_how_alike_learned_positions_are_and_that_none_has_none(run, tmp_path):
    """Learned positions: every pixel of the similarity picture is the colour of PyTorch's cosine similarity of the
    two position vectors (within one step of 255), and pointing at one shows that similarity; a model without
    positions says so in a sentence and draws nothing."""
    html, model, _ = variant_page(run, tmp_path, "learned-gelu-bias-tied")
    table = model.wpe.weight.detach()
    similarity = F.cosine_similarity(table[:, None], table[None], dim=-1).double()  # (block_size, block_size)
    n = len(table)
    browser = fresh_tab()
    browser.open(html.as_uri())
    pixels = np.array(browser.evaluate("(() => { const c = document.getElementById('similarity'); return "
                                       "Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height)"
                                       ".data); })()")).reshape(n, n, 4)
    for s, t in ((3, 7), (10, 10), (30, 2)):  # 1-based
        browser.point("#similarity", at=((t - 0.5) / n, (s - 0.5) / n))
        assert browser.evaluate("document.getElementById('positions-readout').textContent") == \
            f"cos(p{s}, p{t}) = {similarity[s - 1, t - 1].item():.4f}"
    browser.open(variant_page(run, tmp_path, "none-additive-noresidual")[0].as_uri())
    about = browser.evaluate("document.getElementById('positions-about').textContent")
    assert about.startswith("This model has no position information")
    first = browser.evaluate("document.querySelector('#steps .step .formula').textContent")
    assert first == f"x14 = its embedding (no LayerNorm, no residual), {model.config.n_embd} numbers"
    assert browser.evaluate("document.getElementById('positions').children.length") == 0
    assert browser.errors == []
    strength = similarity.abs().clamp(max=1).numpy()[..., None]
    wanted = np.where(similarity.numpy()[..., None] < 0, np.array([31, 119, 180]), np.array([214, 39, 40]))
    wanted = np.rint(255 + (wanted - 255) * strength)
    assert np.abs(pixels[..., :3] - wanted).max() <= 1


@needs_browser
def test_a_learner_walks_the_whole_model_clicks_a_step_and_reads_it_in_both_languages(run, tmp_path):
    """The overview, driven by clicks in English and then in Chinese: one row per step of the forward pass with its
    size and the chosen character's |x| (PyTorch's norm); a click on block 2's MLP hidden layer draws all its numbers
    (each pixel the signed colour of PyTorch's value, within one step of 255), pointing at a pixel reads PyTorch's
    number, and the chosen character's row is listed; the same in Chinese words with the same numbers; a click on an
    attention step moves the layer the views below show; the logits' columns are named by the next character."""
    html, model, tokenizer = variant_page(run, tmp_path, "learned-gelu-bias-tied")
    stream = pytorch_stream(model, torch.tensor([tokenizer.encode(TEXT)]))
    names = [name for name in OVERVIEW_ORDER(model.config) if name in stream]
    hidden = stream["block2.mlp_hidden"].double()
    T, width = hidden.shape
    query, (t, d) = 14, (5, 7)  # the page's middle character; a pixel, counted from 1
    rows = "Array.from(document.querySelectorAll('#model tr.stage'))"
    readout = "document.getElementById('model-readout').textContent"
    browser = fresh_tab()
    browser.open(html.as_uri())
    assert browser.evaluate(f"{rows}.map(tr => tr.dataset.stage)") == names
    sizes = browser.evaluate(f"{rows}.map(tr => tr.cells[tr.cells.length - 3].textContent)")
    assert sizes == [f"{T} \u00d7 {stream[name].shape[1]}" for name in names]
    lengths = browser.evaluate(f"{rows}.map(tr => tr.querySelector('td.length').textContent)")
    assert lengths == [f"{stream[name][query - 1].norm().item():.2f}" for name in names]
    browser.click('#model tr[data-stage="block2.mlp_hidden"] td.label')
    assert browser.evaluate("document.getElementById('model-formula').textContent").startswith(
        "Block 2: MLP hidden layer, 4 times wider, after gelu \u2014 gelu(c_fc(ln_2(x))), 27 \u00d7 128")
    pixels = np.array(browser.evaluate("(() => { const c = document.getElementById('model-picture'); return "
                                       "Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height)"
                                       ".data); })()")).reshape(T, width, 4)
    scaled = (hidden / hidden.abs().max()).numpy()[..., None]
    wanted = np.where(scaled < 0, np.array([31, 119, 180]), np.array([214, 39, 40]))
    assert np.abs(pixels[..., :3] - np.rint(255 + (wanted - 255) * np.abs(scaled))).max() <= 1
    browser.point("#model-picture", at=((d - 0.5) / width, (t - 0.5) / T))
    assert browser.evaluate(readout) == f"character {t} \u201cO\u201d, number {d}: {hidden[t - 1, d - 1]:.4f}"
    listed = browser.evaluate("document.querySelector('#model-vector span').textContent")
    assert listed.startswith(f"x{query} (\u201cf\u201d) = [" + ", ".join(
        f"{v:.4f}" for v in hidden[query - 1, :8].tolist()))
    browser.choose("#language", "zh")
    assert browser.evaluate("document.querySelector('#model tr[data-stage=\"block2.mlp_hidden\"] td.label')"
                            ".textContent") == "MLP 的隐藏层：维度扩大到 4 倍，再经过 gelu"
    browser.point("#model-picture", at=((d - 0.5) / width, (t - 0.5) / T))
    assert browser.evaluate(readout) == f"第 {t} 个字符\u201cO\u201d，第 {d} 维：{hidden[t - 1, d - 1]:.4f}"
    assert browser.evaluate(f"{rows}.map(tr => tr.querySelector('td.length').textContent)") == lengths
    browser.click('#model tr[data-stage="logits"] td.label')
    logits = stream["logits"].double()
    browser.point("#model-picture", at=((3 - 0.5) / logits.shape[1], (t - 0.5) / T))
    assert browser.evaluate(readout) == (f"第 {t} 个字符\u201cO\u201d，下一个字符 \u201c{tokenizer.chars[2]}"
                                         f"\u201d：{logits[t - 1, 2]:.4f}")
    browser.click('#model tr[data-stage="block1.attention"] td.label')
    assert browser.evaluate("document.getElementById('layer').value") == "0"
    assert browser.errors == []


HEADINGS = "Array.from(document.querySelectorAll('h2')).map(h => h.textContent)"
CHINESE_HEADINGS = ["1. 你的文本", "2. 整个模型：从字符到下一个字符的概率", "3. 每个字符看向哪里",
                    "4. 一次看所有注意力头", "5. 完整的矩阵", "6. 位置：模型如何知道字符在哪里", "7. 逐步计算：",
                    "8. 下一个字符"]


@needs_browser
def test_a_learner_switches_the_page_to_chinese_and_back(run, page):
    """The English / 中文 switch: every heading, the labels and the matrix steps in the tutorials' terms (查询 Q,
    注意力权重 A, 掩码), the line under the title and the tab's title, the numbers unchanged (the logits still
    PyTorch's); switching back gives the English page's headings and lines exactly."""
    model, tokenizer, state = checkpoint.load_model(run / "run" / "ckpt_best.safetensors")
    with torch.no_grad():
        expected = model(torch.tensor([tokenizer.encode(TEXT)]))[0][0]
    cfg, ckpt = model.config, run / "run" / "ckpt_best.safetensors"
    millions = f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}"
    about = "document.getElementById('about').textContent"
    browser = fresh_tab()
    browser.open(page.as_uri())
    english = browser.evaluate(HEADINGS)
    assert english[3] == "4. Every head at once" and browser.evaluate("document.documentElement.lang") == "en"
    assert browser.evaluate(about) == (f"{ckpt}: step {state['iter']}, {cfg.n_layer} layers x {cfg.n_head} heads "
                                       f"of {cfg.head_size}, {cfg.n_embd} wide, {millions}M parameters, trained "
                                       f"on {state['data']['source']}")
    assert browser.evaluate("document.title") == "chargpt: your model, thinking"
    english_about = browser.evaluate(about)
    browser.choose("#language", "zh")
    assert browser.evaluate(about) == (f"{ckpt}：第 {state['iter']} 步，{cfg.n_layer} 层 × {cfg.n_head} "
                                       f"个头（每个 {cfg.head_size} 维），嵌入维度 {cfg.n_embd}，"
                                       f"{millions}M 个参数，训练于 "
                                       f"{state['data']['source']}")
    assert browser.evaluate("document.title") == "chargpt：你的模型，正在思考"
    headings = browser.evaluate(HEADINGS)
    assert [h[:len(c)] for h, c in zip(headings, CHINESE_HEADINGS)] == CHINESE_HEADINGS
    assert headings[6] == ("7. 逐步计算：\u201cf\u201d（第 14 个字符），第 1 层，"
                           "头 1（要看别的头，请在上面选择）")
    steps = browser.evaluate("Array.from(document.getElementById('matrix-step').options).map(o => o.text)")
    assert steps == ["1. 查询 Q", "2. 键 K", "3. 值 V", "4. 注意力分数 S", "5. 缩放", "6. 掩码",
                     "7. 注意力权重 A", "8. A\u00b7V"]
    labels = browser.evaluate("Array.from(document.querySelectorAll('label > span')).map(s => s.textContent)")
    assert labels[:3] == ["层", "头", "每个 q·k 乘以"]
    assert browser.evaluate("document.getElementById('view').options[0].text") == "所有头"
    assert browser.evaluate("document.getElementById('append').textContent") == "采样一个字符，接在后面"
    torch.testing.assert_close(exact(browser.evaluate("JSON.parse(numbers({})).logits")), expected.double(),
                               atol=1e-4, rtol=0)
    browser.choose("#language", "en")
    assert browser.evaluate(HEADINGS) == english and browser.evaluate(about) == english_about
    assert browser.errors == []


@needs_browser
def test_a_browser_set_to_chinese_opens_the_page_in_chinese(page):
    """With zh-CN as the browser's language the page opens in Chinese; #lang=en still opens it in English."""
    browser = fresh_tab()
    browser.prefer_language("zh-CN")
    browser.open(page.as_uri())
    assert browser.evaluate("navigator.language") == "zh-CN"
    assert browser.evaluate(HEADINGS)[3] == CHINESE_HEADINGS[3]
    assert browser.evaluate("document.getElementById('language').value") == "zh"
    browser.open("about:blank")  # (a new fragment alone would not load the page again)
    browser.open(page.as_uri() + "#lang=en")
    assert browser.evaluate(HEADINGS)[3] == "4. Every head at once"
    assert browser.errors == []


@needs_browser
def test_the_page_says_what_to_install_when_the_browser_has_no_font_for_a_character(run, page, tmp_path):
    """A model whose vocabulary holds characters no font draws (U+0380 and U+0381, which Unicode leaves unassigned)
    gets one line naming them (in the vocabulary's order) and fonts-noto-cjk; a model of plain ASCII gets none."""
    state = checkpoint.load(run / "run" / "ckpt_best.safetensors")
    path = tmp_path / "unassigned.safetensors"
    checkpoint.save({**state, "vocab": state["vocab"].translate(str.maketrans({"R": "\u0380", "O": "\u0381"}))}, path)
    html = tmp_path / "page.html"
    assert run_cli(attention_html.main, ["--ckpt", str(path), "--text", "\u0380\u0381ME", "--html", str(html)]) == 0
    note = re.search(r'<p class="note warn" id="font-note"( hidden="")?>(.*?)</p>', dom(html))
    fix = "so they show as boxes. Fix (Debian/Ubuntu): sudo apt-get install fonts-noto-cjk, then reload the page."
    n = len(state["vocab"]) - 2  # less the newline and the space
    assert note.group(1) is None
    assert note.group(2) == f"This browser has no font for 2 of the model's {n} characters (U+0381 U+0380), {fix}"
    assert re.search(r'<p class="note warn" id="font-note" hidden="">', dom(page))
    no_chinese = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout.strip() == ""
    chinese = re.search(r'<p class="note warn" id="font-note"( hidden="")?>(.*?)</p>', dom(page, "#lang=zh"))
    assert (chinese.group(1) is None) == no_chinese
    if no_chinese:  # in Chinese the page's own words need a font too; the line says so in both languages
        assert chinese.group(2) == (f"This browser has no font for this page's Chinese text, {fix} 这个浏览器缺少显示"
                                    "这些字符的字体，它们会显示成方框。请安装字体（Debian/Ubuntu：sudo apt-get install "
                                    "fonts-noto-cjk），然后刷新页面。")


@needs_browser
def test_an_address_that_names_what_the_page_lacks_is_ignored(page):
    html = dom(page, "#query=99&layer=9&view=x&hover=500")  # a character, layer and head the text and model lack
    assert re.search(r'<span id="step-title">\u201cf\u201d \(character 14\), layer 1, head 1', html)  # the middle one


@needs_browser
def test_the_page_opens_on_a_middle_character_with_its_keys_and_values(page):
    """With no character chosen, the page explains the middle one (not the last, whose mask keeps every key): it is
    marked in the strip, the later ones are greyed as masked, and its 14 keys and values are listed."""
    html = dom(page)
    assert re.search(r'<span id="step-title">\u201cf\u201d \(character 14\), layer 1, head 1', html)
    classes = re.findall(r'<span class="(ch[^"]*)" data-position="(\d+)"', html)
    assert [position for kind, position in classes if "query" in kind] == ["14"]
    assert [position for kind, position in classes if "future" in kind] == [str(n) for n in range(15, 28)]
    listed = re.search(r"<details[^>]*><summary>14 keys and values</summary>(.*?)</details>", html, flags=re.S)
    names = re.findall(r'<div class="vector"><span>([kv]\d+) = ', listed.group(1))
    assert names == [f"{kind}{j}" for j in range(1, 15) for kind in "kv"]


def test_a_model_that_cannot_read_the_default_line_opens_on_a_line_it_writes(run, tmp_path, monkeypatch, capsys):
    """Where the validation text cannot be found and the model knows none of the default line, the page opens on a
    line the model writes, the same each time, and the script and the page say why."""
    monkeypatch.setattr(attention_html, "validation_start", lambda state: (None, "missing"))
    monkeypatch.setattr(attention_html, "DEFAULT_TEXT", "\u0436\u0436\u0436")  # none of it known
    pages = [tmp_path / "a.html", tmp_path / "b.html"]
    for html in pages:
        assert run_cli(attention_html.main, ["--out_dir", str(run / "run"), "--html", str(html)]) == 0
    said = capsys.readouterr().err
    assert said.count("the page opens on text the model wrote, not on the run's validation text: neither the run's "
                      "token cache nor its corpus file is there\n") == 2
    texts = [embedded(html.read_text(encoding="utf-8"))["text"] for html in pages]
    assert texts[0] == texts[1] and len(texts[0]) == 32 and set(texts[0]) <= set("ROMEO: but soft, what light "
                                                                                  "through yonder window breaks?\n")
    about = embedded(pages[0].read_text(encoding="utf-8"))["about"]
    assert (about["opening"], about["why"]) == ("written", "missing")


def test_where_the_validation_text_is_unusable_the_page_says_why(run, tmp_path, monkeypatch, capsys):
    """A checkpoint that records no corpus, and validation text with no usable stretch (its long line has a character
    the model never saw, its short lines too few characters): the page opens on Romeo and Juliet and says which."""
    state = checkpoint.load(run / "run" / "ckpt_best.safetensors")
    unrecorded = tmp_path / "unrecorded.safetensors"
    checkpoint.save({**state, "data": {}}, unrecorded)
    html = tmp_path / "a.html"
    assert run_cli(attention_html.main, ["--ckpt", str(unrecorded), "--html", str(html)]) == 0
    assert [embedded(html.read_text(encoding="utf-8"))["about"][key] for key in ("opening", "why")] == \
        ["default", "unrecorded"]
    monkeypatch.setattr(attention_html, "validation_start",
                        lambda state: ("mid-line\n" + "ROMEO " * 5 + "\u0436\nab\nso\nmid", ""))
    assert run_cli(attention_html.main, ["--out_dir", str(run / "run"), "--html", str(html)]) == 0
    assert [embedded(html.read_text(encoding="utf-8"))["about"][key] for key in ("opening", "why")] == \
        ["default", "short"]
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("the page opens on")]
    assert said == ["the page opens on a line of Romeo and Juliet, not on the run's validation text: " + why for why in (
        "the checkpoint records no corpus",
        "no 20-character stretch of its validation text has only known characters")]


VALIDATION_LINE = "while counter < limit: counter += 1"


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    """A debug run on Python-like source whose validation text (the last tenth) holds only VALIDATION_LINE."""
    tmp = tmp_path_factory.mktemp("source")
    corpus = tmp / "code.py"
    corpus.write_text("def add(left, right):\n    return left + right\n" * 40 + (VALIDATION_LINE + "\n") * 8,
                      encoding="utf-8")
    train_debug(corpus, tmp / "run", "--max_iters", "2")
    return tmp


def opening_of(checkpoint_path: Path, html: Path) -> str:
    assert run_cli(attention_html.main, ["--ckpt", str(checkpoint_path), "--html", str(html)]) == 0
    return embedded(html.read_text(encoding="utf-8"))["text"]


def test_the_page_opens_on_a_line_of_the_runs_own_validation_text(source_run, tmp_path, monkeypatch):
    """A model trained on Python source opens on a line of its validation text (cut to its 32-character window), not
    on Romeo: read from the token cache in the user's cache folder (the one the command line would use; never one a
    checkpoint names), and from the corpus file alone when the cache is gone; once the corpus file has changed (and
    no cache is left) on the default line (a line of Romeo, less the characters the model does not know)."""
    state = checkpoint.load(source_run / "run" / "ckpt_best.safetensors")
    assert state["data"]["n_train"] > 47 * 40  # (the split falls inside the validation lines)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "chargpt").symlink_to(source_run / "cache")  # the run's cache as this user's
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    assert opening_of(source_run / "run" / "ckpt_best.safetensors", tmp_path / "a.html") == VALIDATION_LINE[:32]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    assert opening_of(source_run / "run" / "ckpt_best.safetensors", tmp_path / "b.html") == VALIDATION_LINE[:32]
    corpus = Path(state["data"]["source"])
    kept = corpus.read_bytes()
    try:
        corpus.write_bytes(kept.replace(b"counter", b"Counter"))
        text = opening_of(source_run / "run" / "ckpt_best.safetensors", tmp_path / "c.html")
    finally:
        corpus.write_bytes(kept)
    known = set(state["vocab"])
    assert text == "".join(ch for ch in attention_html.DEFAULT_TEXT if ch in known)[:32]
    about = embedded((tmp_path / "c.html").read_text(encoding="utf-8"))["about"]
    assert (about["opening"], about["why"]) == ("default", "changed")


def test_the_page_reads_no_cache_entry_whose_vocabulary_is_not_the_runs(tmp_path, monkeypatch):
    """The run's validation text is read from a cache entry only where its vocabulary is the checkpoint's: an entry
    whose meta.json has its vocabulary rotated by one character (every id read as another) is passed over."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: to be or not to be\n" for i in range(100)), encoding="utf-8")
    meta = prepare(resolve(str(corpus), tmp_path), tmp_path / "home" / "chargpt").meta
    state = {"data": {"source": str(corpus), "sha256": meta["sha256"], "n_train": meta["n_train"]},
             "run_config": {}, "vocab": meta["vocab"]}
    validation = corpus.read_text(encoding="utf-8")[meta["n_train"]:]
    corpus.unlink()  # (the cache alone can give the text)
    assert attention_html.validation_start(state) == (validation[:attention_html.VAL_SEARCHED], "")
    entry = next((tmp_path / "home" / "chargpt" / "prepared").iterdir())
    (entry / "meta.json").write_text(json.dumps({**meta, "vocab": meta["vocab"][1:] + meta["vocab"][:1]}))
    assert attention_html.validation_start(state) == (None, "missing")


def poem_lines(n: int) -> str:
    """n short lines of five or seven Chinese characters and a closing mark (at most 8 characters a line, as in a
    corpus of Tang poems), made up here from a small stock of characters, the same every time."""
    stock = "春风花月夜山水云天江雨雪松竹梅白日青草长河落秋光明"
    lines = []
    for i in range(n):
        width = 5 if i % 4 < 2 else 7
        lines.append("".join(stock[(i * 7 + j * 3) % len(stock)] for j in range(width)) + ("，" if i % 2 == 0 else "。"))
    return "\n".join(lines) + "\n"


@needs_browser
def test_a_model_of_short_lines_opens_on_its_own_validation_lines_and_says_so(tmp_path):
    """A corpus of short lines (none of 20 characters, as in Tang poems): the page opens on whole lines of the run's
    validation text joined with their newlines (at least 20 characters, at most the 32-character window, starting at
    a line's start), not on babble, and says so under the text in Chinese."""
    corpus = tmp_path / "poems.txt"
    corpus.write_text(poem_lines(600), encoding="utf-8")
    train_debug(corpus, tmp_path / "run", "--max_iters", "2")
    state = checkpoint.load(tmp_path / "run" / "ckpt_best.safetensors")
    validation = corpus.read_text(encoding="utf-8")[state["data"]["n_train"]:]
    text = opening_of(tmp_path / "run" / "ckpt_best.safetensors", tmp_path / "poems.html")
    assert 20 <= len(text) <= 32 and "\n" in text and ("\n" + text + "\n") in validation
    assert embedded((tmp_path / "poems.html").read_text(encoding="utf-8"))["about"]["opening"] == "lines"
    note = re.search(r'<p class="note" id="opening-note">(.*?)</p>', dom(tmp_path / "poems.html", "#lang=zh"))
    assert note.group(1) == "打开时是这次训练的验证文本中的几整行，连同换行（\u21b5）：它的行都很短。"
    marks = Counter(ch for ch in text if not (ch.isalpha() or ch.isdigit() or ch == "\n"))
    look = re.search(r'<p class="hint" id="heads-look">(.*?)</p>', dom(tmp_path / "poems.html", "#lang=zh")).group(1)
    assert look == ("找一找：只看前一个字符的头（对角线下方的一条斜线）、盯着\u201c" + marks.most_common(1)[0][0] +
                    "\u201d的头（一条竖列；它是你的文本里最常见的符号），或盯着行首的头。")  # (，or 。: no spaces here)
    other = dom(tmp_path / "poems.html", "#text=" + quote(text[:5]))  # another text: the note says where it came from
    assert re.search(r'<p class="note" id="opening-note">Opened on the text in the address \(#text=\)\.</p>', other)


@needs_browser
def test_quote_marks_are_named_by_code_point_and_section_4_names_the_texts_commonest_mark(page):
    """A quote mark is written with its code point, not inside quotes (“”” would be ambiguous); the next characters
    are in boxes; section 4's hint names the text's commonest mark that is not a letter, a digit or a newline."""
    browser = fresh_tab()
    browser.open(page.as_uri() + "#text=" + quote("a,b,c d\n\n\n"))
    assert browser.evaluate("[quoted('\u201d'), quoted(\"'\"), quoted('f')]") == [
        "\u201d (U+201D)", "' (U+0027)", "\u201cf\u201d"]
    assert browser.evaluate("document.getElementById('heads-look').textContent") == (
        "Look for heads that look one character back (a line under the diagonal), at \u201c,\u201d (a column; the "
        "commonest mark in your text), or at the start of a line.")
    assert browser.evaluate("document.querySelectorAll('#next td span.box').length") > 0
    assert browser.errors == []
    browser = fresh_tab()  # (a new address that differs only after # would not load the page again)
    browser.open(page.as_uri() + "#text=" + quote("to be or not, to be"))
    assert browser.evaluate("document.getElementById('heads-look').textContent").endswith(
        "(a line under the diagonal), at spaces (a column), or at the start of a line.")
    assert browser.errors == []


@needs_browser
@pytest.mark.parametrize("name, formula", [
    ("learned-gelu-bias-tied", "softmax(QK\u1d40/\u221ad) V"),
    ("dot-sharedqk-novalues-nomlp", "softmax(QK\u1d40) V"),
    ("none-additive-noresidual", "softmax(w\u00b7tanh(q\u1d62 + k\u2c7c)) V"),
    ("uniform", "the mean of the past values (every weight 1/i)"),
])
def test_each_form_of_attention_heads_its_page_with_its_own_formula(run, tmp_path, name, formula):
    """The matrices' heading and the step-by-step's formula line name the model's own form of attention."""
    html = dom(variant_page(run, tmp_path, name)[0])
    heading = re.search(r'<h2 id="matrix-section">(.*?)</h2>', html).group(1)
    assert re.sub(r"<[^>]+>", "", heading) == "5. The whole matrices: " + formula
    assert re.search(r"Attention\(Q, K, V\) = </span><span class=\"form-formula\">" + re.escape(formula) + "</span>",
                     html)


@pytest.mark.parametrize("args, words", [
    (["--text", "o" * 33], "this model reads at most 32"),
    (["--text", "ROMEO \u0436"], "never saw: '\u0436'"),
    (["--text", ""], "--text is empty"),
    (["--text", "ROMEO", "--html", "/nonexistent-dir/p.html"], "/nonexistent-dir"),
])
def test_bad_inputs_are_one_line(run, args, words, capsys):
    args = args if "--html" in args else [*args, "--html", str(run / "p.html")]
    code = run_cli(attention_html.main, ["--out_dir", str(run / "run"), *args])  # in this process: quicker
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err


def test_a_model_too_large_to_carry_is_refused_in_one_line_naming_the_limit(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(attention_html, "MAX_PARAMETERS", 1000)
    html = tmp_path / "big.html"
    code = run_cli(attention_html.main, ["--out_dir", str(run / "run"), "--html", str(html)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "the page carries at most 1,000;" in err, err
    assert not html.exists()


@needs_browser
def test_the_overviews_layernorm_row_names_a_bias_only_where_the_model_has_one(run, tmp_path):
    """The overview's LayerNorm row says 'then its weight and bias' for a model with biases and names --bias false for
    one without (it said 'and bias' for both), in English and in Chinese."""
    row = "document.querySelector('#model tr.stage[data-stage=\"block1.ln_1\"]').textContent"
    for variant, english, chinese in (("learned-gelu-bias-tied", "then its weight and bias", "再乘权重、加偏置"),
                                      ("rope-qknorm-relu2-nobias-untied", "then its weight (no bias: --bias false)",
                                       "再乘权重（没有偏置：--bias false）")):
        html, model, _ = variant_page(run, tmp_path, variant)
        browser = fresh_tab()
        browser.open(html.as_uri())
        assert english in browser.evaluate(row) and (" and bias" in browser.evaluate(row)) == model.config.bias
        browser.choose("#language", "zh")
        assert chinese in browser.evaluate(row), browser.evaluate(row)
        assert browser.errors == []
