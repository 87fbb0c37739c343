"""A nanoGPT user's habits at train.py (configs/nanogpt.py): every setting of nanoGPT's train.py is taken or answered in
one line naming this trainer's way (never a guess among look-alike names); its Python config files are refused without
being run, their settings printed as TOML that loads to the same values; --compile=False in any case; its init_from
values; and a preset's min_lr follows a learning rate set alone."""
import re
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from configs import load_config
from configs.nanogpt import TRAIN_SETTINGS
from errors import UserError

# nanoGPT's train.py settings (its globals that configurator.py overrides), with a value of the kind it takes: the
# list as a user of it knows it, written here independently of configs/nanogpt.py.
NANOGPT_TRAIN = {
    "out_dir": "out-x", "eval_interval": "250", "log_interval": "10", "eval_iters": "200", "eval_only": "False",
    "always_save_checkpoint": "True", "init_from": "scratch", "wandb_log": "True", "wandb_project": "owt",
    "wandb_run_name": "gpt2", "dataset": "shakespeare_char", "gradient_accumulation_steps": "40",
    "batch_size": "12", "block_size": "256", "n_layer": "6", "n_head": "4", "n_embd": "384", "dropout": "0.2",
    "bias": "False", "learning_rate": "6e-4", "max_iters": "5000", "weight_decay": "1e-1", "beta1": "0.9",
    "beta2": "0.99", "grad_clip": "1.0", "decay_lr": "True", "warmup_iters": "100", "lr_decay_iters": "5000",
    "min_lr": "6e-5", "backend": "gloo", "device": "cpu", "dtype": "float32", "compile": "False",
}


def outcome(*argv: str):
    try:
        return load_config(list(argv), False)
    except UserError as err:
        return str(err)


@pytest.mark.parametrize("name", NANOGPT_TRAIN)
def test_every_nanogpt_setting_is_taken_or_answered_with_our_way(name):
    """--name=value as nanoGPT's configurator takes it: either a config with that value, or the one line of nanoGPT's
    map that says what this trainer does instead; never a did-you-mean guess among look-alike names (a guess by
    spelling would offer --min_lr for --wandb_log and --cache_dir for --backend)."""
    result = outcome(f"--{name}={NANOGPT_TRAIN[name]}")
    if isinstance(result, str):
        assert result.startswith(f"unknown option --{name}: ") and "\n" not in result, result
        assert "did you mean" not in result and name in TRAIN_SETTINGS, result
    else:
        cfg, _, explicit = result
        assert name in explicit or name == "init_from"  # (scratch: the default, a new run)
        value = getattr(cfg, name)
        expected = {"False": False, "True": True, "scratch": ""}.get(NANOGPT_TRAIN[name], NANOGPT_TRAIN[name])
        if name == "compile":
            expected = "false"
        assert str(value) == str(expected) or value == type(value)(expected), (name, value)


@pytest.mark.parametrize("given, taken", [("False", "false"), ("false", "false"), ("FALSE", "false"), ("0", "false"),
                                          ("True", "true"), ("on", "true"), ("Auto", "auto")])
def test_compile_takes_true_and_false_in_any_case(given, taken):
    assert load_config([f"--compile={given}"], False)[0].compile == taken
    assert outcome("--compile", "sometimes").startswith("--compile 'sometimes': must be one of auto, true, false")


def test_init_from_resume_is_resume_scratch_is_a_new_run_and_gpt2_is_refused_in_one_line():
    cfg, note, _ = load_config(["--init_from=resume", "--out_dir", "out/x"], False)
    assert cfg.resume and cfg.init_from == "" and note.splitlines()[-1] == (
        "note: --init_from resume is --resume here: continuing the run in --out_dir")
    cfg, note, _ = load_config(["--init_from=scratch"], False)
    assert not cfg.resume and cfg.init_from == "" and len(note.splitlines()) == 1
    refused = outcome("--init_from=gpt2-medium")
    assert refused.startswith("--init_from gpt2-medium: GPT-2's weights belong to its 50,257 BPE tokens") and \
        "--init_from out/RUN" in refused


def test_a_misspelt_name_of_ours_still_gets_its_suggestion():
    assert outcome("--lerning_rate", "1e-3") == "unknown option --lerning_rate; did you mean --learning_rate?"


NANOGPT_CONFIG = """# a nanoGPT-style config for a small character model
out_dir = 'out-small'
eval_interval = 100
eval_iters = 20
wandb_log = True
wandb_project = 'small'
dataset = 'shakespeare_char'
gradient_accumulation_steps = 2 * 2
batch_size = 32
n_layer = 4
n_head = 4
n_embd = 128
learning_rate = 2e-3
min_lr = 2e-4
compile = False
init_from = 'scratch'
always_save_checkpoint = False
open({marker!r}, 'w').write('ran')
seed = len('run me')
"""


@pytest.mark.parametrize("given_as", ["--config", "positional"])
def test_a_python_config_is_never_run_and_its_settings_come_back_as_toml_that_loads(tmp_path, capsys, given_as):
    marker = tmp_path / "ran.txt"
    config = tmp_path / "train_small.py"
    config.write_text(NANOGPT_CONFIG.format(marker=str(marker)), encoding="utf-8")
    argv = ["--config", str(config)] if given_as == "--config" else [str(config), "--batch_size=8"]
    with pytest.raises(UserError) as refused:
        load_config(argv, False)
    assert not marker.exists()  # nothing of the file ran
    assert str(refused.value) == (f"{config} is a Python config, which is never run; save the TOML "
                                  f"above as train_small.toml and pass --config train_small.toml")
    toml = capsys.readouterr().out
    assert "# open(" in toml and "# seed = len('run me'): not a plain value" in toml
    assert "# always_save_checkpoint = False: every evaluation saves ckpt_last" in toml
    (tmp_path / "train_small.toml").write_text(toml, encoding="utf-8")
    cfg, _, _ = load_config(["--config", str(tmp_path / "train_small.toml")], False)
    taken = {"out_dir": "out-small", "eval_interval": 100, "eval_iters": 20, "data": "shakespeare",
             "grad_accum_steps": 4, "batch_size": 32, "n_layer": 4, "n_head": 4, "n_embd": 128,
             "learning_rate": 2e-3, "min_lr": 2e-4, "compile": "false", "init_from": "", "config_name": "train_small",
             "wandb": True, "wandb_project": "small"}
    assert {name: getattr(cfg, name) for name in taken} == taken


def test_a_learning_rate_set_alone_takes_the_presets_min_lr_along():
    """--learning_rate 6e-4 alone under the CPU preset takes its floor (0.0015 under its 0.015) along at the same
    ratio, where a floor left at 0.0015 would be above the rate, and says so; a --min_lr given is kept."""
    cfg, note, _ = load_config(["--learning_rate", "6e-4"], False)
    assert cfg.min_lr == pytest.approx(6e-5) and note.splitlines()[-1] == (
        "note: min_lr follows --learning_rate: 6e-05, 0.1 of it as in shakespeare_char_cpu (0.0015 of 0.015); "
        "--min_lr sets it")
    cfg, note, _ = load_config(["--learning_rate", "6e-4", "--min_lr", "1e-5"], False)
    assert cfg.min_lr == 1e-5 and len(note.splitlines()) == 1
    assert outcome("--learning_rate", "6e-4", "--min_lr", "1e-3") == (
        "--min_lr 0.001: must be between 0 and learning_rate (0.0006)")
    assert load_config(["--config", "shakespeare_char_cpu_long", "--learning_rate", "1e-3"], False)[0].min_lr == 0


def test_a_resumed_run_given_a_learning_rate_alone_takes_its_own_min_lr_along():
    """--resume --learning_rate 1e-4 on a run whose floor (1.5e-3) is above it: the floor keeps the run's own ratio,
    said in a line, instead of a config rebuilt with min_lr above the rate (an error)."""
    from configs.loader import resume_config
    saved = load_config(["--max_iters", "100"], False)[0]
    state = {"run_config": saved.to_dict(), "iter": 50, "tokens_per_iter": None}
    cfg, _, explicit = load_config(["--resume", "--out_dir", "out/x", "--learning_rate", "1e-4"], False)
    said = []
    _, resumed = resume_config(cfg, explicit, state, said.append, "out/x/ckpt_last.safetensors")
    assert resumed.learning_rate == 1e-4 and resumed.min_lr == pytest.approx(1e-5)
    assert "resume: min_lr follows --learning_rate: 1e-05, 0.1 of it as in this run (0.0015 of 0.015); --min_lr sets " \
           "it" in said


@pytest.mark.parametrize("line, said", [
    ("block_size = ((((10**64)**64)**64)**64)**64", "# block_size = ((((10**64)**64)**64)**64)**64: not a plain value"),
    ("block_size = ((10**64)**64)**2", "not a plain value; set block_size by hand"),
    ("block_size = " + "+".join(["1"] * 2500), "not a plain value; set block_size by hand"),
    ("block_size = " + "[" * 150 + "]" * 150, "not a plain value; set block_size by hand"),
    ('out_dir = "\\ud800"', "# out_dir = '\\ud800': out_dir here takes str; set it by hand"),
    ('out_dir = "a\\x7fb\\x1b[2J"', 'out_dir = "a\\u007fb\\u001b[2J"'),
    ("dataset = ['shakespeare']", "# dataset = ['shakespeare']: give data = \"FILE\""),
])
def test_a_python_config_whose_values_grow_without_bound_is_one_line_at_once(tmp_path, line, said):
    """A power tower of 42 bytes, a sum of 2,500 terms, deep nesting, a lone surrogate, control characters: each comes
    back at once as TOML that loads (the value left out, or escaped) and one line, exit 2, no control character."""
    config = tmp_path / "hostile.py"
    config.write_text(line + "\n", encoding="utf-8")
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(config)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and time.monotonic() - started < 30, done.stderr
    assert said in done.stdout and not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", done.stdout), done.stdout
    (tmp_path / "hostile.toml").write_text(done.stdout, encoding="utf-8")
    load_config(["--config", str(tmp_path / "hostile.toml")], False)  # TOML this trainer reads
