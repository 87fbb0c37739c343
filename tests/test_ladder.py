"""scripts/ladder.py: the rungs train with one budget, the table, ladder.json and ladder.png are written, finished
rungs are reused byte for byte, changed settings retrain, and a Chinese corpus works as well as an English one."""
import json
import subprocess
import sys

from PIL import Image

from conftest import ROOT

SENTENCES = ["注意力让每个字回头看前面的字。", "查询和键的点积决定权重。", "值按权重相加，得到新的表示。",
             "缩放让梯度不会消失。", "掩码挡住未来，只看过去。"]


def ladder(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "ladder.py"), "--config", "debug", *args],
                          capture_output=True, text=True, timeout=300)


def test_a_small_ladder_on_chinese_text_writes_its_table_and_reuses_finished_rungs(tmp_path):
    corpus = tmp_path / "zh.txt"
    corpus.write_text("\n".join(SENTENCES[i % 5] + SENTENCES[(i * 3) % 5] for i in range(400)), encoding="utf-8")
    out = tmp_path / "ladder"
    common = ["--data", str(corpus), "--out_dir", str(out), "--cache_dir", str(tmp_path / "cache"),
              "--rungs", "bigram,one_head", "--max_iters", "6"]
    first = ladder(*common)
    assert first.returncode == 0, first.stderr
    rows = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    assert [row["name"] for row in rows] == ["bigram", "one_head"]
    assert all(row["full_val_loss"] > 0 and row["steps"] == 6 for row in rows)
    assert rows[0]["parameters"] < rows[1]["parameters"]  # a table of odds is smaller than a transformer
    for row in rows:
        assert f"{row['full_val_loss']:.4f}" in first.stdout  # the printed table
        assert any((ROOT / row["out_dir"]).glob("events.out.tfevents.*"))  # each rung is its own TensorBoard run
    assert Image.open(out / "ladder.png").format == "PNG"
    checkpoints = {path: path.read_bytes() for path in out.glob("*/ckpt_last.pt")}
    assert len(checkpoints) == 2

    again = ladder(*common)
    assert again.returncode == 0 and again.stderr.count("reused") == 2, again.stderr
    assert {path: path.read_bytes() for path in out.glob("*/ckpt_last.pt")} == checkpoints
    assert json.loads((out / "ladder.json").read_text(encoding="utf-8")) == rows

    longer = ladder(*common[:-1], "8")  # another budget: the rungs are trained again, not reused
    assert longer.returncode == 0 and "reused" not in longer.stderr, longer.stderr
    rows = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    assert all(row["steps"] == 8 for row in rows)

    damaged = next(out.glob("01-bigram/ckpt_last.pt"))
    damaged.write_bytes(damaged.read_bytes()[:100])  # cut short
    healed = ladder(*common[:-3], "bigram", "--max_iters", "8")
    assert healed.returncode == 0 and "not a readable checkpoint" in healed.stderr, healed.stderr
    again = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    figures = [{k: v for k, v in row.items() if k != "train_seconds"} for row in (again[0], rows[0])]
    assert figures[0] == figures[1]  # trained again to exactly the same loss


def test_an_unknown_rung_is_one_line(tmp_path):
    wrong = ladder("--out_dir", str(tmp_path / "l"), "--rungs", "bigram,trigram")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "no rung trigram" in wrong.stderr
