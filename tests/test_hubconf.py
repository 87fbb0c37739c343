"""The Python API (hubconf.py, through torch.hub): the docs' example runs as written from a program outside the
checkout that has a module of its own named `model`, gives sample.py's text for the same settings, and leaves the
program's own module in place; a damaged checkpoint is a ValueError naming the problem."""
import re
import subprocess
import sys

import pytest

from conftest import ROOT, module_corpus, patient, train_debug


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    corpus = module_corpus(tmp_path_factory, "hubconf")
    out = corpus.parent / "run"
    train_debug(corpus, out, "--max_iters", "20")
    return out


def test_the_docs_example_runs_from_a_program_elsewhere_and_matches_sample_py(run_dir, tmp_path):
    example = re.search(r"## From your own Python code.*?```python\n(.*?)```",
                        (ROOT / "docs" / "sampling.md").read_text(encoding="utf-8"), flags=re.S).group(1)
    assert len(example.strip().splitlines()) <= 5
    program = example.replace("path/to/chargpt/out/shakespeare_char_cpu-shakespeare", str(run_dir)).replace(
        "path/to/chargpt", str(ROOT)).replace("max_new_tokens=200", "max_new_tokens=60")
    program = "import model\n" + program + "print(model.MINE)\n"  # the program's own module named model
    (tmp_path / "model.py").write_text("MINE = 'the program keeps its own model module'\n")
    (tmp_path / "program.py").write_text(program)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "program.py"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=patient(120))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"TrainedRun('{run_dir / 'ckpt_best.pt'}', step ")
    assert lines[-1] == "the program keeps its own model module"
    text = "\n".join(lines[1:-1])
    sample = subprocess.run([sys.executable, str(ROOT / "scripts" / "sample.py"), "--out_dir", str(run_dir),
                             "--prompt", "ROMEO:", "--max_new_tokens", "60", "--seed", "1337", "--temperature", "0.8",
                             "--stream"], capture_output=True, text=True, timeout=patient(120))
    assert sample.returncode == 0 and sample.stdout.rstrip("\n") == "ROMEO:" + text


def test_a_damaged_checkpoint_is_a_value_error_with_the_scripts_reason(tmp_path):
    import torch

    (tmp_path / "ckpt_last.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="is not a readable checkpoint"):
        torch.hub.load(str(ROOT), "chargpt", str(tmp_path), source="local")
