"""scripts/attention_html.py: the page holds the model's own weights, references nothing outside itself, and in a
real browser shows the text and changes the highlighted weights when a character is hovered."""
import json
import re
import shutil
import subprocess

import pytest

from conftest import run_script, train_debug
from errors import run_cli
from training import checkpoint

import attention_html

TEXT = "ROMEO: but soft,\nwhat light"


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


def test_the_page_holds_the_models_own_weights(run, page):
    data = embedded(page.read_text(encoding="utf-8"))
    model, tokenizer, _ = checkpoint.load_model(run / "run" / "ckpt_best.pt")
    expected = attention_html.attention_of(model, tokenizer.encode(TEXT))
    assert data["text"] == TEXT and len(data["weights"]) == 2 and len(data["weights"][0]) == 2
    for layer, layer_expected in zip(data["weights"], expected):
        for head, head_expected in zip(layer, layer_expected):
            for q, (row, row_expected) in enumerate(zip(head, head_expected)):
                assert len(row) == q + 1 and row == pytest.approx(row_expected, abs=6e-6)
                assert sum(row) == pytest.approx(1, abs=1e-4)


def test_the_page_references_nothing_outside_itself(page):
    html = page.read_text(encoding="utf-8")
    for outside in ("http:", "https:", "src=", "href=", "@import", "url(", "//cdn", "<link"):
        assert outside not in html, outside
    hostile = page.parent / "hostile.html"  # user text cannot end the data script or inject markup
    run = page.parent
    done = make_page(run, "--text", "</script><b>x", "--html", str(hostile), "--unknown", "skip")
    assert done.returncode == 0, done.stderr
    assert "</script><b>" not in hostile.read_text(encoding="utf-8")
    # The model above knows none of < / > b, so the page is written directly with such a text as its data.
    text = "</script><b>x"
    weights = [[[[1.0 / (q + 1)] * (q + 1) for q in range(len(text))]]]
    hostile.write_text(attention_html.page(text, weights, "t", "a"), encoding="utf-8")
    assert "</script><b>" not in hostile.read_text(encoding="utf-8")
    assert embedded(hostile.read_text(encoding="utf-8"))["text"] == text  # the text survives as data


def dom(page, fragment: str = "") -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           page.as_uri() + fragment], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def span_weights(html: str) -> list[tuple[str, float]]:
    return [(ch, float(w)) for w, ch in
            re.findall(r'<span class="ch[^"]*" data-position="\d+" data-weight="([\d.]+)"[^>]*>(.*?)</span>', html)]


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                    reason="needs Chromium (Debian/Ubuntu: apt-get install chromium)")
def test_in_a_real_browser_the_text_shows_and_a_hover_highlights_that_characters_weights(page):
    weights = embedded(page.read_text(encoding="utf-8"))["weights"]
    still = span_weights(dom(page, "#view=2"))
    shown = "".join(ch for ch, _ in still).replace("&nbsp;", " ").replace("\u00a0", " ").replace("\u21b5", "\n")
    assert shown == TEXT and all(w == 0 for _, w in still)  # rendered by the page's script, nothing highlighted
    hovered = span_weights(dom(page, "#layer=2&view=2&hover=6"))  # the 6th character, layer 2, head 2
    assert [w for _, w in hovered[:6]] == pytest.approx(weights[1][1][5], abs=1e-5)
    assert all(w == 0 for _, w in hovered[6:]) and any(w > 0 for _, w in hovered)


@pytest.mark.parametrize("args, words", [
    (["--text", "o" * 33], "this model reads at most 32"),
    (["--text", "ROMEO ж"], "never saw: 'ж'"),
    (["--text", ""], "--text is empty"),
    (["--text", "ROMEO", "--html", "/nonexistent-dir/p.html"], "/nonexistent-dir"),
])
def test_bad_inputs_are_one_line(run, args, words, capsys):
    args = args if "--html" in args else [*args, "--html", str(run / "p.html")]
    code = run_cli(attention_html.main, ["--out_dir", str(run / "run"), *args])  # in this process: quicker
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err
