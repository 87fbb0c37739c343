"""Pictures: attention heatmaps in TensorBoard, the attention_map and plot_run scripts, the walkthrough."""
import re
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import train_debug
from common.pictures import DPI, PANEL_INCHES, grid_of


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pictures")
    corpus = tmp / "corpus.txt"
    corpus.write_text("ROMEO: but soft, what light through yonder window breaks?\n" * 60, encoding="utf-8")
    train_debug(corpus, tmp / "run", "--max_iters", "20", "--eval_interval", "10", "--log_attention", "true")
    return tmp / "run"


def figure_size(n_heads: int) -> tuple[int, int]:
    """(width, height) in pixels of attention_figure for this many heads: its panels and margins at its DPI."""
    rows, cols = grid_of(n_heads)
    return round((cols * PANEL_INCHES + 0.8) * DPI), round(rows * PANEL_INCHES * DPI)


def test_tensorboard_holds_attention_images_per_layer(run_dir):
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    events.Reload()
    assert {"where_attention_looks/layer_1", "where_attention_looks/layer_2"} == set(events.Tags()["images"])
    images = events.Images("where_attention_looks/layer_1")
    assert [i.step for i in images] == [0, 10, 20]
    assert (images[0].width, images[0].height) == figure_size(2)


def test_attention_map_writes_a_png_of_the_expected_size(run_dir, tmp_path, script):
    png = tmp_path / "attention.png"
    result = script("attention_map.py", "--out_dir", str(run_dir), "--text", "ROMEO: but soft", "--png", str(png),
                        "--layer", "1")
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Image.open(png).size == figure_size(2)
    one = tmp_path / "one.png"
    assert script("attention_map.py", "--out_dir", str(run_dir), "--text", "ROMEO", "--png", str(one),
                      "--head", "1").returncode == 0
    assert Image.open(one).size == figure_size(1)
    bad = script("attention_map.py", "--out_dir", str(run_dir), "--text", "ROMEO", "--png", str(one), "--layer", "7")
    assert bad.returncode == 2 and "layers 1 to 2" in bad.stderr


def test_attention_map_labels_every_character_it_draws(run_dir, tmp_path, script, monkeypatch):
    """A text of 32 characters (the debug model's block_size): each panel's axes carry a label at every position,
    not every other one, the characters in order, and no two labels overlap."""
    import attention_map
    from common.pictures import tick_labels

    drawn = []
    monkeypatch.setattr(attention_map, "save_figure", lambda figure, path, option: drawn.append(figure))
    text = "ROMEO: but soft, what light thro"
    result = script("attention_map.py", "--out_dir", str(run_dir), "--text", text, "--png", str(tmp_path / "a.png"))
    assert result.returncode == 0 and len(text) == 32, result.stderr
    heatmaps = [ax for ax in drawn[0].axes if ax.images]
    assert len(heatmaps) == 2  # the debug model's two heads
    expected = tick_labels(text)[0]
    for ax in heatmaps:
        for ticks, labels in ((ax.get_xticks(), ax.get_xticklabels()), (ax.get_yticks(), ax.get_yticklabels())):
            assert list(ticks) == list(range(32)) and [t.get_text() for t in labels] == expected
    drawn[0].canvas.draw()
    for ax in heatmaps:  # drawn, no two labels overlap
        across = [t.get_window_extent() for t in ax.get_xticklabels()]
        down = [t.get_window_extent() for t in ax.get_yticklabels()]
        assert all(a.x1 <= b.x0 for a, b in zip(across, across[1:]))
        assert all(a.y0 >= b.y1 for a, b in zip(down, down[1:]))  # the first row at the top


def test_plot_run_writes_a_png_comparing_runs(run_dir, tmp_path, script):
    import plot_run

    png = tmp_path / "curves.png"
    result = script("plot_run.py", "--out_dir", str(run_dir), str(run_dir), "--png", str(png))
    assert result.returncode == 0 and result.stdout.strip() == f"wrote {png} (1 run)", result.stderr  # named twice
    assert Image.open(png).size == (1100, 400)
    missing = script("plot_run.py", "--out_dir", str(tmp_path), "--png", str(png))
    assert missing.returncode == 2 and "no TensorBoard events" in missing.stderr
    runs = tmp_path / "runs"  # a folder of runs, as out/ or a ladder's folder: every run in it
    for name in ("b", "a"):
        shutil.copytree(run_dir, runs / name)
    (runs / "notes").mkdir()
    every = script("plot_run.py", "--out_dir", str(runs), "--png", str(png))
    assert every.returncode == 0 and every.stdout.strip() == f"wrote {png} (2 runs)", every.stderr
    assert plot_run.run_folders([str(runs), str(run_dir)]) == [runs / "a", runs / "b", run_dir]
    assert plot_run.run_folders([str(run_dir), str(runs), str(runs / "b"), str(run_dir)]) == [run_dir, runs / "a",
                                                                                               runs / "b"]


def test_the_legend_of_many_runs_names_each_once_inside_the_picture_and_clear_of_the_plots(run_dir, tmp_path):
    """Twelve runs (a whole ladder): the legend names each run once, in the order given, and lies inside the picture,
    below both plots (it ran off the top and covered the loss plot, with 24 entries)."""
    import plot_run

    runs = [shutil.copytree(run_dir, tmp_path / f"{i:02d}-rung") for i in range(1, 13)]
    fig = plot_run.draw(runs)
    fig.canvas.draw()
    legend, = fig.legends
    assert [text.get_text() for text in legend.get_texts()] == [run.name for run in runs]
    box, picture = legend.get_window_extent(), fig.bbox
    assert picture.x0 <= box.x0 and box.x1 <= picture.x1 and picture.y0 <= box.y0 and box.y1 <= picture.y1
    assert all(box.y1 < ax.get_tightbbox().y0 for ax in fig.axes)


def test_plot_run_reads_the_loss_tags_of_older_runs(run_dir, tmp_path):
    """Runs made before the loss/ group was named (train/loss, val/loss, train/lr) still plot, point for point."""
    from torch.utils.tensorboard import SummaryWriter
    import plot_run

    now = plot_run.read_scalars(run_dir)
    old_dir = tmp_path / "old_run"
    with SummaryWriter(str(old_dir)) as writer:
        for old, new in plot_run.RENAMED.items():
            for step, value in now[new]:
                writer.add_scalar(old, value, step)
    then = plot_run.read_scalars(old_dir)
    assert set(then) == set(plot_run.RENAMED.values())
    assert all(then[tag] == now[tag] for tag in then)  # float32 in both files, so exactly equal


def test_plot_run_draws_sessions_in_step_order_whatever_their_files_are_named(tmp_path):
    """Two sessions' event files whose names sort against the order they were written (as a counter's 10 sorts
    before 9) are read back as one series in step order, a step written twice keeping its later value."""
    import os

    from torch.utils.tensorboard import SummaryWriter
    import plot_run

    run = tmp_path / "run"
    run.mkdir()
    for session, (name, steps) in enumerate((("events.out.tfevents.1700000000.host.1.9", range(0, 30, 10)),
                                             ("events.out.tfevents.1700000000.host.1.10", range(20, 50, 10)))):
        with SummaryWriter(str(tmp_path / f"s{session}")) as writer:
            for step in steps:
                writer.add_scalar("loss/train", step + session / 2, step, walltime=1700000000 + session * 100 + step)
        written, = (tmp_path / f"s{session}").iterdir()
        os.replace(written, run / name)
    assert sorted(p.name for p in run.iterdir())[0].endswith(".10")  # the second session's file is read first
    assert plot_run.read_scalars(run)["loss/train"] == [(0, 0.0), (10, 10.0), (20, 20.5), (30, 30.5), (40, 40.5)]


def test_walkthrough_prints_what_the_formula_gives(script):
    """Each printed matrix equals the formula computed in numpy; tokens are counted from 1, as the attention page and
    tutorials.py count them, and the text says so where it counts."""
    out = script("attention_walkthrough.py").stdout
    assert "Tokens are counted from 1" in out and "tokens 1..t" in out and "0..t" not in out
    sections = dict(re.findall(r"^(\S[^\n]*):\n((?:  \[.*\]\n)+)", out, flags=re.M))

    def matrix(prefix):
        text = next(v for k, v in sections.items() if k.startswith(prefix))
        return np.array([[float(v) for v in row.strip(" []").split()] for row in text.strip().splitlines()])

    x = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=float)  # tutorial 004's tokens and weights
    wq = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=float)
    wk = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=float)
    wv = np.array([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=float)
    q, k, v = x @ wq, x @ wk, x @ wv
    assert (q[0] @ k.T).tolist() == [2, 4, 4]  # the blog's scores for token 1
    scaled = q @ k.T / np.sqrt(3)
    masked = np.where(np.tril(np.ones((3, 3))) == 1, scaled, -np.inf)
    weights = np.exp(masked - masked.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    for prefix, expected in [("x ", x), ("q ", q), ("k ", k), ("v ", v), ("scores", q @ k.T), ("scaled", scaled),
                             ("masked", masked), ("weights", weights), ("output", weights @ v)]:
        np.testing.assert_allclose(matrix(prefix), expected, atol=1e-4)


def test_walkthrough_says_where_it_parts_from_004_with_004s_numbers_and_speaks_chinese(script):
    """The causal head's token 1 outputs its own value, [1, 2, 3]; the closing lines say so beside 004's unmasked
    figures, which are tutorials.py's own (rounded, exact, scaled); every step names 004's symbol; --lang zh prints
    the same numbers under Chinese names."""
    import tutorials
    english, chinese = script("attention_walkthrough.py"), script("attention_walkthrough.py", "--lang", "zh")
    assert english.returncode == chinese.returncode == 0
    out = english.stdout
    assert "output = weights @ v: 004's bⁱ:\n  [  1.0000    2.0000    3.0000 ]" in out
    made = {step.name: step.value for step in tutorials.tutorial_004()}
    flat = " ".join(out.split())  # (the note folds its lines)
    for name, digits in (("blog_output_1", 1), ("output_1", 4), ("scaled_output_1", 4)):
        assert "[" + ", ".join(f"{v:.{digits}f}" for v in made[name].tolist()) + "]" in flat, name
    assert "v¹ = [1, 2, 3]" in out and "004's blog lets token 1 see all three tokens" in out
    for symbol in ("a¹", "qⁱ", "kⁱ", "vⁱ", "αᵢ,ⱼ", "α̂ᵢ,ⱼ", "bⁱ"):
        assert symbol in out and symbol in chinese.stdout
    numbers = lambda text: re.findall(r"-?\d+\.\d{4}|-inf", text)  # noqa: E731
    assert numbers(chinese.stdout) == numbers(out) and "token 从 1 开始数" in chinese.stdout
    assert "output = weights @ v：004 的 bⁱ：" in chinese.stdout and "what" not in chinese.stdout


def test_characters_are_drawn_by_an_installed_font_or_labelled_by_code_point_without_warnings():
    import shutil
    import subprocess
    import warnings

    import torch
    from common.pictures import missing_note, tick_labels
    from common.pictures import attention_figure
    text = "ab 花落知"
    shown, families, missing = tick_labels(text)
    assert shown[:3] == ["a", "b", "␣"] and families[0] == "DejaVu Sans Mono"
    assert missing_note("to be,\n\tor not") is None  # a newline or a tab is written \n, \t: no font is missing
    for ch, label in zip(text[3:], shown[3:]):
        assert label == (f"{ord(ch):x}" if ch in missing else ch)
        if shutil.which("fc-list"):  # fontconfig's own answer: does any installed font have this character?
            listed = subprocess.run(["fc-list", f":charset={ord(ch):x}", "family"], capture_output=True, text=True)
            assert (ch not in missing) == bool(listed.stdout.strip()), ch
    note = missing_note(text)
    assert (note is None) == (not missing) and (note is None or "fonts-noto-cjk" in note)
    assert missing_note("a\u0380b\u0381\u0380") == (  # two code points Unicode leaves unassigned: no font has them
        "note: no installed font draws 2 of the characters; the pictures show their code points: "
        "\u0380 U+0380, \u0381 U+0381. Fix: install a font that has them (Debian/Ubuntu: sudo apt-get install "
        "fonts-noto-cjk), and run again.")
    unassigned = "\u0378\u0379\u0380\u0381\u0382\u0383\u038b\u038d\u03a2\u0530\u0557\u0558\u058b"  # 13, none drawn
    assert missing_note(unassigned).startswith("note: no installed font draws 13 of the characters")
    assert missing_note(unassigned).endswith(", \u0530 U+0530 and 3 more. Fix: install a font that has them "
                                             "(Debian/Ubuntu: sudo apt-get install fonts-noto-cjk), and run again.")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph ... missing from font(s)" would fail here
        figure = attention_figure(torch.rand(2, 6, 6).softmax(-1), text, 0)
        figure.canvas.draw()


def test_the_runs_attention_pictures_have_the_pixels_of_the_whole_figure():
    """AttentionPictures lays out one figure (characters, colour bar) and draws only the heatmaps, frames and titles
    again: the same pixels as drawing each layer's whole figure, at the first picture and at later ones, for every
    layer in turn (the titles name the picture's layer, up to two digits), and again for a layer drawn before; weights
    with fewer heads, then more again, are laid out afresh."""
    from common.pictures import AttentionPictures, attention_figure, plt

    text = "ROMEO: but soft, what light"
    pick = torch.Generator().manual_seed(0)
    pictures = AttentionPictures(text)
    for layer, heads in ((1, 4), (0, 4), (11, 4), (2, 4), (1, 4), (3, 2), (0, 4)):
        weights = torch.rand(heads, len(text), len(text), generator=pick).tril()
        weights /= weights.sum(-1, keepdim=True)
        whole = attention_figure(weights, text, layer)
        whole.canvas.draw()
        assert np.array_equal(pictures.render(weights, layer), np.asarray(whole.canvas.buffer_rgba())[..., :3])
        plt.close(whole)


def test_a_run_leaves_loss_png_drawing_every_logged_loss_of_all_its_sessions(tmp_path):
    """A run stopped at step 25 and resumed to step 45 leaves loss.png (a valid PNG, said in the closing lines); its
    drawing is loss_figure of the losses the checkpoint keeps, whose every drawn point equals TensorBoard's logged
    scalar at that step, both sessions' (loss/train at each log line, loss/val and loss/train_eval at each
    evaluation), as unsmoothed lines with a marker per point, the y axis covering every point."""
    import io

    import train
    from configs import load_config
    from conftest import play_text
    from common.pictures import loss_figure, plt
    from training import checkpoint

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(play_text(20000), encoding="utf-8")
    out, said = tmp_path / "run", []
    for extra in (["--max_iters", "25"], ["--resume", "--max_iters", "45"]):
        cfg, _, explicit = load_config(["--config", "debug", "--data", str(corpus), "--cache_dir", str(tmp_path / "c"),
                                        "--out_dir", str(out), "--eval_interval", "10", *extra], False)
        train.train(cfg, explicit, say=said.append)
    assert said.count(f"the losses, every point as logged: {out / 'loss.png'}") == 2
    png = out / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    Image.open(png).verify()
    assert Image.open(png).size == (800, 450)

    events = EventAccumulator(str(out), size_guidance={"scalars": 0})
    events.Reload()
    # By step: the reader takes a folder's event files in name order, and two sessions in one process within one
    # second are named by a counter that sorts 10 before 9.
    logged = {tag: sorted((e.step, e.value) for e in events.Scalars(tag)) for tag in ("loss/train", "loss/val",
                                                                                        "loss/train_eval")}
    assert [s for s, _ in logged["loss/train"]] == list(range(5, 46, 5))  # both sessions, no step twice
    assert [s for s, _ in logged["loss/val"]] == [0, 10, 20, 25, 30, 40, 45]
    losses = checkpoint.load(out / "ckpt_last.safetensors")["losses"]
    figure = loss_figure(losses, "run")
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    for label, tag in (("train loss (each log line's batch)", "loss/train"), ("train loss (evaluation)",
                                                                              "loss/train_eval"),
                       ("validation loss (evaluation)", "loss/val")):
        line = lines[label]
        drawn = list(zip(line.get_xdata(), np.float32(line.get_ydata())))  # TensorBoard keeps float32
        assert drawn == logged[tag], label
        assert line.get_marker() not in (None, "", "None") and line.get_linestyle() == "-"
    low, high = figure.axes[0].get_ylim()
    every = [v for series in logged.values() for _, v in series]
    assert low < min(every) and max(every) < high
    again = io.BytesIO()  # the file on disk is that drawing, with the run's title
    loss_figure(losses, "run: debug preset, step 45").savefig(again, format="png")
    assert png.read_bytes() == again.getvalue()
    plt.close("all")


def test_the_masked_future_is_hatched_grey_never_the_colour_of_a_weight_of_0():
    """Every cell of the causal mask (key after query) is drawn hatched grey, a colour no weight takes, and a legend
    says what it is; a weight of exactly 0 before the query (which a model can give) keeps the scale's colour for 0.
    The same in attention_map's figure and TensorBoard's pictures (one drawing)."""
    from matplotlib.colors import to_rgb
    from common.pictures import MASKED_FILL, MASKED_HATCH, MASKED_LABEL, AttentionPictures, attention_figure, plt

    text = "ROMEO: but soft"
    T = len(text)
    weights = torch.rand(2, T, T, generator=torch.Generator().manual_seed(0)).tril()
    weights[:, 5, 2] = 0.0  # a weight of 0 on an earlier character: not masked
    weights /= weights.sum(-1, keepdim=True)
    figure = attention_figure(weights, text, 0)
    figure.canvas.draw()
    pixels = np.asarray(figure.canvas.buffer_rgba())[..., :3].astype(int)
    assert np.array_equal(AttentionPictures(text).render(weights, 0), pixels.astype(np.uint8))
    height = pixels.shape[0]
    scale = plt.get_cmap("viridis")
    weight_colours = np.array([[round(255 * c) for c in scale(x / 255)[:3]] for x in range(256)])
    grey = [np.array([round(255 * c) for c in to_rgb(colour)]) for colour in (MASKED_FILL, MASKED_HATCH)]
    for ax in [ax for ax in figure.axes if ax.images]:
        def cell(i: int, j: int) -> set[tuple[int, ...]]:  # every colour of the inner pixels of cell (query i, key j)
            x0, y0 = ax.transData.transform((j - 0.35, i - 0.35))
            x1, y1 = ax.transData.transform((j + 0.35, i + 0.35))
            rows = slice(int(height - max(y0, y1)) + 1, int(height - min(y0, y1)))
            return {tuple(p) for p in pixels[rows, int(min(x0, x1)) + 1:int(max(x0, x1))].reshape(-1, 3)}
        for i in range(T):
            for j in range(T):
                colours = cell(i, j)
                if j > i:  # the mask: greys from the hatch's to the fill's (antialiased lines), no weight's colour
                    assert all(max(c) - min(c) <= 3 and grey[1][0] - 3 <= c[0] <= grey[0][0] + 3 for c in colours), \
                        (i, j, colours)
                    assert min(np.abs(weight_colours - np.array(c)).max(1).min() for c in colours) > 20, (i, j)
        (zero,) = cell(5, 2)
        assert np.abs(np.array(zero) - weight_colours[0]).max() <= 2  # an earlier character's weight of 0: viridis
    legend_texts = [t.get_text() for legend in figure.legends for t in legend.get_texts()]
    assert legend_texts == [MASKED_LABEL] and "masked" in MASKED_LABEL
    plt.close(figure)
