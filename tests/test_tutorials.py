"""The tutorials' worked examples (scripts/tutorials.py) against the numbers the tutorials print, to 4 decimals; what
the script says about them, and its pictures (--png)."""
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common import pictures
from model.scoring import additive_scores, attend, dot_product_scores
from model.textbook import masked_softmax
import tutorials


def steps(number: str) -> dict:
    return {step.name: step.value for step in tutorials.TUTORIALS[number][1]()}


def names(make) -> set[str]:
    return {step.name for step in make()}


def printed(value) -> list[str]:
    return [f"{v:.4f}" for v in torch.as_tensor(value).detach().flatten().tolist()]


def assert_prints(value, expected) -> None:
    assert printed(value) == [f"{v:.4f}" for v in np.asarray(expected, dtype=float).flatten()]


# The figures as tutorial 001 prints them.
EMBEDDING = [[0.3374, -0.1778, -0.3035], [0.1794, 1.8951, 0.4954], [0.2692, -0.0770, -1.0205],
             [-0.2196, -0.3792, 0.7671], [-0.5880, 0.3486, 0.6603], [-1.1925, 0.6984, -1.4097]]
CONTEXT = [[-0.1564, 0.1028, -0.0763, -0.0764], [0.5313, 1.3607, 0.7891, 1.3110], [-0.3542, -0.1234, -0.2626, -0.3706],
           [0.0071, 0.3345, 0.0969, 0.1998], [0.1008, 0.4780, 0.2021, 0.3674], [-0.5296, -0.2799, -0.4107, -0.6006]]
MULTI_HEAD = [[-0.0185, 0.0170, 0.1999, -0.0860], [0.4003, 1.7137, 1.3981, 1.0497], [-0.1103, -0.1609, 0.0079, -0.2416],
              [0.0668, 0.3534, 0.2322, 0.1008], [0.1180, 0.6949, 0.3157, 0.2807], [-0.1827, -0.2060, -0.2393, -0.3167]]
CROSS = [[0.4231, 0.8665, 0.6503, 1.0042], [0.4874, 0.9718, 0.7359, 1.1353], [0.4054, 0.8359, 0.6258, 0.9667],
         [0.4357, 0.8886, 0.6678, 1.0311], [0.4429, 0.9006, 0.6775, 1.0460], [0.3860, 0.8021, 0.5985, 0.9250]]
RENORMALISED = [[1, 0, 0, 0, 0, 0], [0.0532, 0.9468, 0, 0, 0, 0], [0.3862, 0.1214, 0.4924, 0, 0, 0],
                [0.2232, 0.3242, 0.2078, 0.2449, 0, 0], [0.1536, 0.3145, 0.1325, 0.1849, 0.2145, 0],
                [0.1973, 0.0247, 0.3102, 0.1132, 0.0751, 0.2794]]


def test_001_life_is_short_eat_dessert_first():
    s = steps("001")
    assert s["vocabulary"].tolist() == [0, 4, 5, 2, 1, 3]
    assert_prints(s["embedding"], EMBEDDING)
    assert_prints(s["W_q"], [[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]])
    assert_prints(s["W_v"], [[0.0756, 0.1966, 0.3164, 0.4017], [0.1186, 0.8274, 0.3821, 0.6605],
                             [0.8536, 0.5932, 0.6367, 0.9826]])
    assert_prints(s["q_2"], [0.5667, 1.8269])
    assert_prints(s["omega_24"], 1.2903)
    assert_prints(s["omega_2"], [-0.6004, 3.4707, -1.5023, 0.4991, 1.2903, -1.3374])
    assert_prints(s["alpha_2"], [0.0386, 0.6870, 0.0204, 0.0840, 0.1470, 0.0229])
    assert_prints(s["z_2"], [0.5313, 1.3607, 0.7891, 1.3110])
    assert_prints(s["Z"], CONTEXT)
    assert_prints(s["multi_head"], MULTI_HEAD)
    assert_prints(s["cross"], CROSS)
    assert_prints(s["renormalised"], RENORMALISED)
    assert_prints(s["causal"], RENORMALISED)  # masking before the softmax = masking after it and renormalising


def test_002_valid_lengths_padding_on_the_right_and_the_two_scoring_functions():
    s = steps("002")
    assert s["sequence_mask"].tolist() == [[True, False, False, False], [True, True, False, False],
                                           [True, True, True, False]]
    scores = s["scores"]
    for name, lens in (("per_row", [[2, 2], [3, 3]]), ("per_query", [[1, 3], [2, 4]])):
        for b in range(2):
            for q in range(2):  # a reference written out row by row: softmax over the first n keys, zeros after
                n = lens[b][q]
                expected = torch.cat([F.softmax(scores[b, q, :n], dim=0), torch.zeros(4 - n)])
                torch.testing.assert_close(s[name][b, q], expected)
    assert s["per_query"][0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]  # the tutorial's 1.0000 for a valid length of 1
    for b, n in enumerate([2, 3]):  # the sampler's convention: the LAST n keys are real
        torch.testing.assert_close(s["left"][b, :, 4 - n:], F.softmax(scores[b, :, 4 - n:], dim=-1))
        assert torch.all(s["left"][b, :, :4 - n] == 0)
    assert_prints(s["additive"], [[[2, 3, 4, 5]], [[10, 11, 12, 13]]])  # the tutorial's printed output
    assert_prints(s["dot_product"], [[[2, 3, 4, 5]], [[10, 11, 12, 13]]])


def test_masked_softmax_padding_side_must_be_named():
    with pytest.raises(TypeError):
        masked_softmax(torch.zeros(2, 3), torch.tensor([1, 2]))  # noqa: the keyword is required
    with pytest.raises(ValueError, match="padding must be one of left, right"):
        masked_softmax(torch.zeros(2, 3), torch.tensor([1, 2]), padding="top")


def test_additive_scores_match_a_loop_over_every_query_key_pair():
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 5), torch.randn(2, 4, 7)
    w_q, w_k, w_v = torch.randn(5, 6), torch.randn(7, 6), torch.randn(6)
    expected = torch.tensor([[[float(w_v @ torch.tanh(q[b, i] @ w_q + k[b, j] @ w_k)) for j in range(4)]
                              for i in range(3)] for b in range(2)])
    torch.testing.assert_close(additive_scores(q @ w_q, k @ w_k, w_v), expected)


def test_attend_handles_values_wider_than_keys_and_cross_lengths():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2), torch.randn(5, 2), torch.randn(5, 7)
    out, weights = attend(dot_product_scores(q, k), v)
    expected = np.exp(q.numpy() @ k.numpy().T / math.sqrt(2))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(out.numpy(), expected @ v.numpy(), rtol=1e-5, atol=1e-6)


def test_003_softmax_of_a_a_2a_and_the_gradient_the_scale_keeps():
    s = steps("003")
    assert s["y3"].tolist() == pytest.approx([0.5761168847658291, 0.9999092083843412, 1.0], abs=1e-15)
    scaled, unscaled = s["gradient_norms"].tolist()
    assert unscaled < scaled / 100  # without 1/√d most rows are nearly one-hot, and almost no gradient gets through
    assert s["peak"][1] > 0.9 > 0.5 > s["peak"][0]
    assert s["score_std"][1] / s["score_std"][0] == pytest.approx(math.sqrt(512))


def test_004_the_blog_example_without_its_rounding():
    s = steps("004")
    assert s["scores_1"].tolist() == [2.0, 4.0, 4.0]
    assert_prints(s["blog_output_1"], [2.0, 7.0, 1.5])
    assert_prints(s["weights_1"], [0.0634, 0.4683, 0.4683])
    assert_prints(s["output_1"], [1.9366, 6.6831, 1.5951])
    weights = np.exp(np.array([2.0, 4.0, 4.0]) / math.sqrt(3))
    weights /= weights.sum()
    np.testing.assert_allclose(s["scaled_output_1"].numpy(), weights @ s["values"].numpy(), rtol=1e-6)
    assert_prints(s["all_outputs"][0], s["scaled_output_1"])


def test_000_averaging_three_ways_and_the_scale_in_the_wrong_place():
    s = steps("000")
    assert s["averaging_gap"].max() < 1e-6
    torch.testing.assert_close(s["averaging"], s["softmax_average"])
    assert s["head_gap"] < 1e-6  # this project's Head scales before the softmax
    assert s["scale_gap"] > 0.1  # 000's "out = wei @ v * head_size**-0.5" is a different result
    assert s["sharpest"][1] > s["sharpest"][0]
    var_q, var_k, var_raw, var_scaled = s["variance"].tolist()
    assert var_raw == pytest.approx(16, rel=0.1) and var_scaled == pytest.approx(1, rel=0.1)


def test_the_script_prints_the_tutorials_numbers_and_refuses_an_unknown_one(script):
    done = script("tutorials.py", "001", "004")
    assert done.returncode == 0, done.stderr
    assert "  [  0.5313    1.3607    0.7891    1.3110 ]" in done.stdout
    assert "  [  1.9366    6.6831    1.5951 ]" in done.stdout and "tutorial 002" not in done.stdout
    wrong = script("tutorials.py", "009")
    assert wrong.returncode == 2 \
        and wrong.stderr.strip() == "error: no tutorial 009; choose from 000, 001, 002, 003, 004"


def test_000_softmax_of_the_tutorials_a_and_of_a_times_10():
    """Tutorial 000's scale demonstration on its own printed a: softmax(a) to the tutorial's 4 decimals, and
    softmax(10a) to its printed figures (within 0.1%: a itself is printed to 4 decimals), the largest taking 0.9920."""
    s = steps("000")
    assert_prints(s["softmax_a"], [0.0668, 0.2538, 0.0513, 0.0489, 0.4110, 0.0878, 0.0252, 0.0552])
    printed_by_the_tutorial = [1.2716e-08, 8.0136e-03, 9.1273e-10, 5.6675e-10, 9.9199e-01, 1.9629e-07, 7.5872e-13,
                               1.8981e-09]
    np.testing.assert_allclose(s["softmax_10a"].numpy(), printed_by_the_tutorial, rtol=1e-3)


def test_003_the_softmax_jacobian_is_printed_whole_and_is_the_closed_form():
    """003's Jacobians, one 3 x 3 matrix per input [a, a, 2a], equal diag(y) - y yᵀ written out in numpy, and the
    script prints each as a matrix (three rows), the small ones in scientific notation rather than as 0.0000."""
    s = steps("003")
    for a in (1, 10, 100):
        x = np.array([a, a, 2 * a], dtype=float)
        y = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        np.testing.assert_allclose(s[f"jacobian_{a}"].numpy(), np.diag(y) - np.outer(y, y), rtol=1e-9, atol=1e-300)
    text = tutorials.show(s["jacobian_10"]).splitlines()
    assert len(text) == 3 and text[0].split()[1:4] == ["4.5394e-05", "-2.0608e-09", "-4.5392e-05"]
    assert tutorials.show(s["jacobian_1"]).splitlines()[2].split()[1:4] == ["-0.1221", "-0.1221", "0.2442"]


def test_the_text_says_what_to_see_names_the_seed_where_a_tutorial_had_none_and_prints_integers(script):
    """Every printed value is followed by one sentence saying what to see in it; tutorials 000 and 002 (which drew
    random numbers without a seed) say so in one line naming the seed used and the figure that differs, the script's
    own figure as it prints it; shapes and ids print as integers; the counting convention is said first."""
    done = script("tutorials.py")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    all_steps = [step for _, make in tutorials.TUTORIALS.values() for step in make()]
    assert text.count("\n  what to see: ") == len(all_steps) and all(step.see.strip() for step in all_steps)
    for step in all_steps:  # the sentence comes right after its value
        cell = f" [{next(n for n, (_, make) in tutorials.TUTORIALS.items() if step.name in names(make))} {step.cell}]" \
            if step.cell else ""
        assert f"{step.formula}{cell}:\n{tutorials.show(step.value)}\n  what to see: {step.see}\n" in text
    notes = [line for line in text.splitlines() if line.startswith("note: tutorial")]
    assert [line.split()[2] for line in notes] == ["000", "002"]
    assert "torch.manual_seed(1337) (x[0][0] = 0.0783 here)" in notes[0] and "0.0687 there" in notes[0]
    assert f"{steps('000')['x'][0, 0]:.4f}" == "0.0783"  # the note's figure is the printed one
    assert "torch.manual_seed(0)" in notes[1] and f"{steps('002')['per_row'][0, 0, 0]:.4f}" != "0.4497"
    assert "  [  4   8  32 ]\n" in text and "4.0000" not in tutorials.show(steps("000")["no_values_shape"])
    assert "  [ 0  4  5  2  1  3 ]\n" in text  # the vocabulary's ids
    assert text.startswith("Tokens, rows and columns are counted from 1 here, as on the attention page and in the "
                           "walkthrough")  # one convention, said where it is used


DRAWN = {"000": ["averaging", "softmax_average", "kq_weights"],
         "001": ["alpha_2", "cross_weights", "weights", "masked_simple", "renormalised", "causal"],
         "002": ["sequence_mask", "per_row", "per_query", "left", "additive_weights"],
         "003": ["y3_curve", "jacobian_1", "jacobian_10", "jacobian_100"],
         "004": ["weights_1", "scaled_weights_1"]}


def test_png_draws_one_picture_per_printed_attention_matrix_and_leaves_the_text_as_it_was(script, tmp_path):
    """--png DIR writes one valid PNG of a readable size per printed attention matrix (every tutorial's, 002's padded
    masks, 001's cross-attention and 003's Jacobians included) and names each under its matrix; the text is byte for
    byte the text without --png once those lines are taken out."""
    from PIL import Image

    plain = script("tutorials.py")
    drawn = script("tutorials.py", "--png", str(tmp_path / "pictures"))
    assert plain.returncode == drawn.returncode == 0, drawn.stderr
    expected = sorted(f"{number}-{name}.png" for number, names in DRAWN.items() for name in names)
    assert sorted(p.name for p in (tmp_path / "pictures").iterdir()) == expected
    named = [line for line in drawn.stdout.splitlines() if line.startswith("  picture: ")]
    assert sorted(Path(line.split(": ", 1)[1]).name for line in named) == expected
    assert "".join(line + "\n" for line in drawn.stdout.splitlines() if not line.startswith("  picture: ")) \
        == plain.stdout
    for name in expected:
        with Image.open(tmp_path / "pictures" / name) as image:
            assert image.format == "PNG" and 500 <= image.width <= 1600 and 250 <= image.height <= 1200, name
            image.verify()
    for number, names in DRAWN.items():  # the steps with a picture are exactly those drawn
        assert [step.name for step in tutorials.TUTORIALS[number][1]() if step.picture] == names


def test_a_picture_hatches_exactly_the_masked_cells_in_no_colour_of_the_weights_and_labels_every_row(tmp_path):
    """The causal mask is drawn as masked (one hatched grey patch per future cell: 28 of 64 in 000's 8 x 8), its grey
    far from every colour of the weights' scale (a weight of 0 included); 002's padding the same way; every row and
    column carries its label (words for 001)."""
    import matplotlib

    from common.pictures import plt

    by_name = {f"{number}-{step.name}": step for number, (_, make) in tutorials.TUTORIALS.items() for step in make()}
    grey = np.array(matplotlib.colors.to_rgb(pictures.MASKED_FILL))
    scale = matplotlib.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3]
    assert np.abs(scale - grey).sum(1).min() > 0.3  # not a weight's colour, 0 included
    for name, hatched in (("000-kq_weights", 28), ("001-causal", 15), ("002-per_row", 2 * 2 + 2 * 1),
                          ("002-additive_weights", 8 + 4), ("001-cross_weights", 0)):
        fig = tutorials.figure_of(by_name[name])
        patches = [p for ax in fig.axes for p in ax.patches if p.get_hatch() == "///"]
        assert len(patches) == hatched, name
        heatmaps = [ax for ax in fig.axes if ax.images and ax.get_xticklabels()]
        picture = by_name[name].picture
        for ax in heatmaps:
            assert [t.get_text() for t in ax.get_yticklabels()] == picture.rows
            assert [t.get_text() for t in ax.get_xticklabels()] == picture.columns
        plt.close(fig)
    assert by_name["001-cross_weights"].picture.rows == ["Life", "is", "short", "eat", "dessert", "first"]


def test_png_into_a_file_is_one_line(script, tmp_path):
    """--png naming a file (not a folder) is refused in one line, before anything is printed, and the file is kept."""
    taken = tmp_path / "notes.txt"
    taken.write_text("mine", encoding="utf-8")
    done = script("tutorials.py", "000", "--png", str(taken))
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1 and "is a file" in done.stderr
    assert taken.read_text(encoding="utf-8") == "mine"


def test_png_on_a_full_disk_is_one_line_and_removes_only_the_empty_folders_it_made(tmp_path, capsys, monkeypatch):
    """--png DIR on a full disk: one line naming the picture, the disk and the fix, exit 2; the folders it made for DIR
    (DIR and its missing parents) are gone again, a folder that was there before stays, and so does a folder that
    already holds a picture this command drew before the disk filled."""
    import errno
    import os

    from common import run_folder
    from errors import run_cli

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    there = tmp_path / "there"
    there.mkdir()
    monkeypatch.setattr(run_folder.os, "fsync", full)  # each picture is written, then the disk is found full
    for folder in (tmp_path / "new" / "pictures", there / "pictures"):
        code = run_cli(tutorials.main, ["000", "--png", str(folder)])
        assert code == 2 and capsys.readouterr().err == (
            f"error: could not write the picture {folder / '000-averaging.png'} (No space left on device); nothing "
            f"was written; free some disk space or choose another --png\n")
        assert sorted(path.name for path in tmp_path.iterdir()) == ["there"] and not any(there.iterdir())
    written = []
    monkeypatch.setattr(run_folder.os, "fsync", lambda fd: full() if written else written.append(fd))
    assert run_cli(tutorials.main, ["000", "--png", str(tmp_path / "some")]) == 2
    assert [path.name for path in (tmp_path / "some").iterdir()] == ["000-averaging.png"]  # (a whole picture)


# 001's whole matrices as it prints them: the scores In [29] and the weights In [30] (masked_simple, In [33], is the
# weights' lower triangle).
SCORES_29 = [[0.0613, -0.3491, 0.1443, -0.0437, -0.1303, 0.1076], [-0.6004, 3.4707, -1.5023, 0.4991, 1.2903, -1.3374],
             [0.2432, -1.3934, 0.5869, -0.1851, -0.5191, 0.4730], [-0.0794, 0.4487, -0.1807, 0.0518, 0.1677, -0.1197],
             [-0.1510, 0.8626, -0.3597, 0.1112, 0.3216, -0.2787], [0.4344, -2.5037, 1.0740, -0.3509, -0.9315, 0.9265]]
WEIGHTS_30 = [[0.1772, 0.1326, 0.1879, 0.1645, 0.1547, 0.1831], [0.0386, 0.6870, 0.0204, 0.0840, 0.1470, 0.0229],
              [0.1965, 0.0618, 0.2506, 0.1452, 0.1146, 0.2312], [0.1505, 0.2187, 0.1401, 0.1651, 0.1793, 0.1463],
              [0.1347, 0.2758, 0.1162, 0.1621, 0.1881, 0.1231], [0.1973, 0.0247, 0.3102, 0.1132, 0.0751, 0.2794]]


def test_001_whole_scores_weights_and_masked_simple_are_the_tutorials_cells():
    """The intermediates 001 prints, whole: all of ω (In [29]), all of α (In [30]), mask_simple (In [32]) and
    masked_simple (In [33]), each to the tutorial's 4 decimals and named by its cell."""
    s = steps("001")
    assert_prints(s["scores"], SCORES_29)
    assert_prints(s["weights"], WEIGHTS_30)
    assert s["mask_simple"].tolist() == [[j <= i for j in range(6)] for i in range(6)]
    assert_prints(s["masked_simple"], np.tril(WEIGHTS_30))
    cells = {step.name: step.cell for step in tutorials.tutorial_001()}
    assert (cells["scores"], cells["weights"], cells["mask_simple"], cells["masked_simple"], cells["omega_24"]) == \
        ("In [29]", "In [30]", "In [32]", "In [33]", "In [11]")


def test_004_prints_the_blogs_inputs_and_weights_and_003_its_curve():
    """004's three inputs and its W_q, W_k, W_v as the blog writes them; 003's curve of y₃ against a equals the closed
    form 1 / (1 + 2e^-a) at every printed a, and is drawn with its fine line."""
    s = steps("004")
    assert s["x"].tolist() == [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]]
    assert s["W_q"].tolist() == [[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]]
    assert s["W_k"].tolist() == [[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]]
    assert s["W_v"].tolist() == [[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]]
    a, y3 = steps("003")["y3_curve"]
    torch.testing.assert_close(y3, 1 / (1 + 2 * torch.exp(-a)), atol=1e-12, rtol=0)
    assert a[0] == 0 and a[-1] == 100 and y3[0] == pytest.approx(1 / 3)


def test_002_names_the_cell_it_never_ran_and_the_minus_1e6_it_replaces():
    """002's DotProductAttention cell was never run (In [None]): the step says so; the tutorial's -1e6 padding gives
    exactly the weights of this project's -inf."""
    made = {step.name: step for step in tutorials.tutorial_002()}
    assert made["dot_product"].cell == "In [None]" and "never run" in made["dot_product"].formula
    assert made["minus_1e6_gap"].value == 0 and "-1e6" in made["minus_1e6_gap"].formula


def test_000_learned_weights_follow_the_tutorials_cell_without_the_scale():
    """000's In [33] has no 1/√16: the step computes softmax(q kᵀ) as the cell does and says the scale comes later."""
    s = steps("000")
    expected = F.softmax(s["kq_scores"].masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf")), -1)
    torch.testing.assert_close(s["kq_weights"], expected)
    step = next(step for step in tutorials.tutorial_000() if step.name == "kq_weights")
    assert "no 1/√16" in step.formula and step.cell == "In [33]"


# Each tutorial's own symbols, which its legend must name beside the attention page's S, A and A·V.
SYMBOLS = {"000": ["wei", "xbow", "out = wei @ v"], "001": ["ω", "α", "z (context_vector_2, context_vec)"],
           "002": ["valid_lens", "attention weights", "masked_softmax"], "003": ["y₃", "shared_qk", "no_values"],
           "004": ["α₁,ⱼ", "α̂", "b¹"]}


def test_every_tutorial_is_printed_in_chinese_with_its_legend_and_cells(script):
    """--lang zh prints each tutorial: its counting line, title, legend (the tutorial's symbols against the page's),
    every step's Chinese formula and sentence with its cell; no English frame words are left; the numbers are the
    English run's, and each English legend names the tutorial's own symbols."""
    english, chinese = script("tutorials.py"), script("tutorials.py", "--lang", "zh")
    assert english.returncode == chinese.returncode == 0, chinese.stderr
    text = chinese.stdout
    assert text.startswith("这里的 token、行和列都从 1 开始数") and "what to see" not in text and "=== tutorial" not in text
    zh = tutorials.speaker("zh")
    for number, (titles, make) in tutorials.TUTORIALS.items():
        assert f"=== 教程 {number}：{titles[1]}\n\n{tutorials.LEGENDS[number][1]}\n" in text
        for part in SYMBOLS[number]:
            assert part in tutorials.LEGENDS[number][0], (number, part)
        assert "On the attention page" in tutorials.LEGENDS[number][0] or number == "003"
        for step in make(zh):
            cell = f" [{number} {step.cell}]" if step.cell else ""
            assert f"{step.formula}{cell}：\n{tutorials.show(step.value)}\n  要点：{step.see}\n" in text
            assert any("\u4e00" <= ch <= "\u9fff" for ch in step.formula + step.see), step.name
    numbers = lambda out: re.findall(r"-?\d+\.\d{4}(?:e[-+]\d+)?", out)  # noqa: E731
    assert numbers(text) == numbers(english.stdout)


def test_chinese_pictures_need_a_chinese_font_and_say_so_in_one_line(script, tmp_path, monkeypatch):
    """--png --lang zh where no installed font draws Chinese: one line naming the fix, nothing printed or drawn."""
    from common import pictures
    monkeypatch.setattr(pictures, "font_for", lambda ch: None)
    done = script("tutorials.py", "003", "--lang", "zh", "--png", str(tmp_path / "p"))
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "no installed font draws Chinese" in done.stderr and "fonts-noto-cjk" in done.stderr
    assert not (tmp_path / "p").exists()
