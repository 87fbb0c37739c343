"""The README's commands: every train.py line parses, every script it names exists, every preset it lists loads."""
import re
import shlex
import subprocess

from conftest import README, README_COMMANDS as COMMANDS, ROOT
from configs import load_config
from configs.loader import presets


def test_every_train_command_in_the_readme_parses():
    train_lines = [c for c in COMMANDS if "train.py" in c]
    assert len(train_lines) >= 6
    for line in train_lines:
        words = shlex.split(line)
        argv = words[words.index("train.py") + 1:]
        if "--help" in argv:
            continue
        cfg, _, _ = load_config(argv, cuda_available=False)  # raises UserError on any unknown or bad field
        assert cfg.max_iters > 0


def test_every_script_the_readme_names_exists_and_every_preset_is_listed():
    for line in COMMANDS:
        for path in re.findall(r"scripts/\w+\.py", line):
            assert (ROOT / path).is_file(), line
    for name in presets():
        assert f"`{name}`" in README, name
    for image in re.findall(r"\]\((docs/[^)]+\.png)\)", README):
        assert (ROOT / image).is_file(), image


def test_the_pictures_the_readme_draws_are_not_added_to_git(tmp_path):
    pictures = [word for line in COMMANDS for word in re.findall(r"--(?:png|html) (\S+)", line)]
    assert pictures
    # the repository's .gitignore in a repository of its own: a copy of this one without .git/ can run the test
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_bytes((ROOT / ".gitignore").read_bytes())
    for path in pictures:
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=tmp_path, capture_output=True)
        assert ignored.returncode == 0, f"{path} would show up in git status"
