"""The README's and the docs' commands: every train.py line parses, every script they name exists, every preset is
listed, every link and picture is there, and no stale name (a preset, a folder, a tag the code does not have)."""
import re
import shlex
import subprocess

from conftest import PAGES, README_COMMANDS as COMMANDS, ROOT
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
    every_page = "".join(PAGES.values())
    for name in presets():
        assert f"`{name}`" in every_page, name
    for page, text in PAGES.items():  # pictures and links, relative to the page
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert ((ROOT / page).parent / target).exists(), (page, target)


def test_no_page_names_what_the_code_does_not_have():
    """A preset, a run-folder entry or a TensorBoard tag named in backticks must exist: a reader who copies one
    gets a preset --config accepts, a folder a run writes, a tag a run logs."""
    folders = ("common", "training", "scripts", "configs", "data", "model")
    code = "".join(p.read_text(encoding="utf-8") for folder in folders
                   for p in (ROOT / folder).rglob("*.py")) + (ROOT / "train.py").read_text(encoding="utf-8")
    every_page = "".join(PAGES.values())
    for name in set(re.findall(r"`(shakespeare_char\w*|debug)`", every_page)):
        assert name in presets(), name
    for tag in set(re.findall(r"`((?:loss|optim|perf|summary|where_attention_looks)/[a-z_]+)", every_page)):
        assert f'"{tag}' in code or f"'{tag}" in code, tag
    for entry in set(re.findall(r"`([a-z_]+/)`", every_page)):  # a folder a run writes
        assert entry.rstrip("/") in code, entry


def test_the_chinese_readme_is_linked_both_ways_and_runs_only_commands_the_walk_runs():
    """README.md's first line links README.zh-CN.md and that page's first line links back; its links are there, and
    each of its commands is one that README.md or the docs give, so the README walk runs it too."""
    chinese = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    assert PAGES["README.md"].splitlines()[0] == "[中文说明](README.zh-CN.md)"
    assert chinese.splitlines()[0] == "[English](README.md)"
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", chinese):
        assert (ROOT / target).exists(), target
    commands = [line.split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", chinese, flags=re.S)
                for line in block.splitlines() if line.strip()]
    assert len(commands) >= 8 and set(commands) <= set(COMMANDS), set(commands) - set(COMMANDS)


def test_the_checkpoint_names_the_pages_give_are_the_ones_a_run_writes():
    """A reader who types a checkpoint's name from a page finds that file in the run folder (the old .pt names
    appear only where the pages say how to convert them)."""
    from common.run_folder import BEST, LAST
    pages = [*PAGES.values(), (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")]
    named = {name for text in pages for name in re.findall(r"ckpt_(?:best|last)\.\w+", text)}
    assert {BEST, LAST} <= named and named - {"ckpt_best.pt", "ckpt_last.pt"} <= {BEST, LAST}, named


def test_the_pictures_the_readme_draws_are_not_added_to_git(tmp_path):
    pictures = [word for line in COMMANDS for word in re.findall(r"--(?:png|html) (\S+)", line)]
    assert pictures
    # the repository's .gitignore in a repository of its own: a copy of this one without .git/ can run the test
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_bytes((ROOT / ".gitignore").read_bytes())
    for path in pictures:
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=tmp_path, capture_output=True)
        assert ignored.returncode == 0, f"{path} would show up in git status"


def test_the_tensorboard_address_draws_every_point_and_the_guide_says_how():
    """The address a run prints and the README and docs/training.md give sets smoothing to 0 and draws SVG (without
    WebGL, TensorBoard's Time Series draws no line at all); both pages say how to untick "Ignore outliers" and point
    to the run's loss.png."""
    from training.report import TENSORBOARD_URL
    assert TENSORBOARD_URL == "http://localhost:6006/?smoothing=0&forceSVG=true#timeseries"
    for page in ("README.md", "docs/training.md"):
        text = " ".join(PAGES[page].split())
        assert f"`{TENSORBOARD_URL}`" in text and "6006/?smoothing=0#" not in text, page
        assert 'untick "Ignore outliers in chart scaling"' in text and "`loss.png`" in text, page


def test_the_readme_points_a_small_text_to_what_to_try():
    """The README's guide, where it trains on your own text, points to docs/training.md's "Small texts" (what to try
    when the run warns of overfitting) and to the walkthrough; that section is there and names each remedy."""
    readme = " ".join(PAGES["README.md"].split())
    assert "(docs/training.md#small-texts)" in readme and "python scripts/attention_walkthrough.py" in readme
    section = PAGES["docs/training.md"].split("### Small texts", 1)[1].split("\n## ", 1)[0]
    for remedy in ("--max_iters", "--dropout 0.2", "--n_embd 64", "more text", "loss.png"):
        assert remedy in section, remedy


def test_the_patience_each_preset_has_is_the_one_the_guide_gives():
    """docs/training.md names every preset's own --patience, the one its config sets (the default preset's 25)."""
    text = " ".join(PAGES["docs/training.md"].split())
    sentence = text[text.index("have not beaten its best (each preset sets its own:"):]
    sentence = sentence[:sentence.index(")")]
    given = {}
    for number, names in re.findall(r"(\d+) in ([\w ]+?)(?:[,;]|$)", sentence.replace("patience ", "")):
        for name in re.split(r" and |, ", names.split(",")[0]):
            given[name.strip()] = int(number)
    assert given == {name: load_config(["--config", name], False)[0].patience for name in presets()}, given


def test_every_picture_the_docs_show_is_there_and_its_alt_text_names_what_it_shows():
    """Every image of the README and the docs is a PNG in the repository, and its alt text says what it shows,
    checked against the code that decides it: the page section it shows is the page's (its number and heading), the
    attention picture's layer and heads are the last layer and the heads of the preset it names, the loss picture's
    presets exist, the ladder's picture is the ladder's."""
    from PIL import Image

    from configs.loader import presets
    images = [(page, alt, target) for page, text in PAGES.items()
              for alt, target in re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", text)]
    assert {target.rsplit("/", 1)[-1] for _, _, target in images} == {"attention_page.png", "attention.png", "loss.png",
                                                                      "ladder.png"}
    headings = re.findall(r"<h2[^>]*>(?:<span[^>]*>)?(\d+)\. ([^<:]+)", (ROOT / "scripts/attention_page/page.html")
                          .read_text(encoding="utf-8"))
    for page, alt, target in images:
        with Image.open((ROOT / page).parent / target) as image:
            assert image.format == "PNG" and image.width >= 600, target
            image.verify()
        name = target.rsplit("/", 1)[-1]
        if name == "attention_page.png":
            number, section = re.search(r"section (\d+), ([a-z ]+)", alt).groups()
            assert (number, section.capitalize()) in [(n, h.strip()) for n, h in headings], (page, alt)
        elif name == "attention.png":
            layer, heads, preset = re.search(r"layer (\d+), (\w+) heads\) of a model trained with (\w+)", alt).groups()
            cfg, _, _ = load_config(["--config", preset], cuda_available=False)
            assert int(layer) == cfg.n_layer and heads == ["one", "two", "three", "four"][cfg.n_head - 1], alt
            assert "hatched" in alt and "last layer" in alt
        elif name == "loss.png":
            named = re.findall(r"shakespeare_char\w*", alt)
            assert named and set(named) <= set(presets()), named
        else:
            assert "ladder" in alt


# docs/code.md's order of the packages: a module imports from its own level or below, never above (configs reads the
# model's settings, never the other way).
LEVELS = {"errors": 0, "data": 1, "model": 2, "configs": 3, "common": 3, "training": 4, "train": 5, "hubconf": 5,
          "scripts": 6}


def imported(path) -> set[str]:
    """The top-level names a file imports: import and from-import statements anywhere in it (inside functions too), and
    importlib.import_module("...") calls with a written name."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
    return {name.split(".")[0] for name in names}


def test_imports_run_one_way_as_the_map_says():
    """docs/code.md's order (data -> model -> common -> training -> scripts) holds in every file of the project: no
    import runs back up, so that common/ and the packages below it can be read, and used, without training/."""
    files = [ROOT / "train.py", ROOT / "hubconf.py", ROOT / "errors.py"]
    files += [p for folder in LEVELS if (ROOT / folder).is_dir() for p in (ROOT / folder).rglob("*.py")]
    upward = []
    for path in files:
        part = path.relative_to(ROOT).parts[0].removesuffix(".py")
        upward += [f"{path.relative_to(ROOT)} imports {name}" for name in imported(path) & LEVELS.keys()
                   if LEVELS[name] > LEVELS[part]]
    assert len(files) > 40 and not upward, upward
    assert "data -> model -> common -> training -> scripts" in PAGES["docs/code.md"]
