"""nanoGPT's settings in this trainer's terms, and its Python config files read (never run) as TOML."""
from __future__ import annotations

import ast
import json
import math
import operator
import re
from pathlib import Path

from configs.schema import CONFIG_MAX_BYTES, FIELDS, FIXED, TYPES, checked_types
from data.gate import read_small, utf8_text
from errors import UserError, python_command, shown

# nanoGPT's train.py settings named or done otherwise here: what to give instead.
RENAMED = {"gradient_accumulation_steps": "grad_accum_steps", "wandb_log": "wandb", "dataset": "data"}
TRAIN_SETTINGS = {
    **{name: f"here it is --{ours}" for name, ours in RENAMED.items()},
    "gradient_accumulation_steps": "here it is --grad_accum_steps, per process",
    "wandb_run_name": "here it is the --out_dir folder's name",
    "eval_only": "here it is python scripts/evaluate.py --out_dir RUN",
    "always_save_checkpoint": "every evaluation saves ckpt_last, and ckpt_best at a new best: nothing to set",
    "decay_lr": "the rate always falls to --min_lr; give --min_lr equal to --learning_rate to keep it",
    "beta1": f"AdamW's beta1 is fixed at {FIXED['beta1']} here",
    "backend": "the backend follows the device: nothing to set",
    "sample": "sampling is python scripts/sample.py --out_dir RUN",
    "start": "here it is python scripts/sample.py --out_dir RUN --prompt TEXT",
}
DATASETS = {"shakespeare_char": "shakespeare", "shakespeare": "shakespeare"}  # nanoGPT's data/ folders we have


def init_from(value: str) -> tuple[str, str]:
    """nanoGPT's --init_from: (ours, a note where it means --resume); gpt2* is refused."""
    if Path(value).exists():
        return value, ""
    if value == "resume":
        return "", "note: --init_from resume is --resume here: continuing the run in --out_dir"
    if value.startswith("gpt2"):
        raise UserError(f"--init_from {value}: GPT-2's weights belong to its 50,257 BPE tokens; fine-tune one of our "
                        f"runs: --init_from out/RUN")
    return "" if value == "scratch" else value, ""


ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}
VALUE_BITS, STRING_MAX, NODES_MAX = 256, 4096, 100  # bounds on a setting and every value on the way to it


def plain_value(node: ast.AST, top: bool = True):
    """A literal, or arithmetic on numbers (5 * 8), each value bounded; ValueError for anything else."""
    if top and sum(1 for _ in ast.walk(node)) > NODES_MAX:
        raise ValueError("too long an expression")
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        left, right = plain_value(node.left, False), plain_value(node.right, False)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
            raise ValueError("not numbers")
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or isinstance(left, int)
                                             and left.bit_length() * abs(right) > VALUE_BITS):
            raise ValueError("too large a power")
        value = ARITHMETIC[type(node.op)](left, right)
    else:
        value = ast.literal_eval(node)
    if isinstance(value, int) and value.bit_length() > VALUE_BITS or isinstance(value, str) and len(value) > STRING_MAX:
        raise ValueError("too large a value")
    return value


def toml_value(value: bool | int | float | str) -> str | None:
    """A setting's value as TOML, spelled as JSON; None for a NaN or a lone surrogate, which TOML lacks."""
    surrogate = isinstance(value, str) and re.search("[\ud800-\udfff]", value)
    if surrogate or isinstance(value, float) and not math.isfinite(value):
        return None
    return re.sub("[\x7f-\x9f]", lambda m: f"\\u{ord(m[0]):04x}", json.dumps(value, ensure_ascii=False))


def translate(name: str, value) -> tuple[str | None, str]:
    """One assignment of a nanoGPT config: (our `field = value` line, or None; a comment, or "")."""
    shown = f"{name} = {value!r}"
    if name == "init_from":
        if value == "resume":
            return None, f"{shown}: continue a run with {python_command('train.py')} --out_dir DIR --resume"
        if value == "scratch":
            return None, f"{shown}: a new run, the default"
        if isinstance(value, str) and value.startswith("gpt2"):
            return None, f"{shown}: not for a character-level model; init_from = \"RUN_FOLDER\" fine-tunes ours"
    if name == "dataset":
        if not isinstance(value, str) or value not in DATASETS:
            return None, f"{shown}: give data = \"FILE\", a text file or a folder of them"
        value = DATASETS[value]
    field = RENAMED.get(name, name)
    if field not in FIELDS or field == "config_name":
        return None, f"{shown}: {TRAIN_SETTINGS.get(name, 'no such setting here')}"
    try:
        text = toml_value(checked_types({field: value}, "")[field])
    except UserError:
        text = None
    if text is None:
        return None, f"{shown}: {field} here takes {TYPES[field].__name__}; set it by hand"
    note = "" if field == name else f"nanoGPT's {name}"
    if name == "gradient_accumulation_steps":
        note += ", here per process"
    return f"{field} = {text}", note


def as_toml(path: Path) -> str:
    """A nanoGPT config file as our TOML, a comment for each setting without an equivalent; never run."""
    text = utf8_text(read_small(path, "--config", CONFIG_MAX_BYTES, "give a config file"), f"--config {path}")
    try:
        tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise UserError(f"--config {path}: cannot be read as a Python config ({type(err).__name__}); write it "
                        f"as TOML") from None
    lines = [f"# {path.stem}.toml: the settings of {path}, nanoGPT's Python config"]
    for statement in tree.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring
        source = (ast.get_source_segment(text, statement) or "").splitlines()[0][:100]
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            lines.append(f"# {source}: not a plain setting; left out")
            continue
        name = statement.targets[0].id
        try:
            value = plain_value(statement.value)
        except (ValueError, TypeError, SyntaxError, ZeroDivisionError, OverflowError):
            lines.append(f"# {source}: not a plain value; set {RENAMED.get(name, name)} by hand")
            continue
        line, note = translate(name, value)
        lines.append(f"# {note}" if line is None else f"{line}  # {note}" if note else line)
    return "\n".join(lines) + "\n"


def python_config(spec: str) -> UserError:
    """--config FILE.py, never run: print its settings as TOML; the error says where to save them."""
    path = Path(spec)
    if not path.exists():
        return UserError(f"--config {spec}: no such file; presets are TOML files (see --help)")
    print(shown(as_toml(path).rstrip("\n")))
    return UserError(f"{spec} is a Python config, which is never run; save the TOML above as {path.stem}.toml "
                     f"and pass --config {path.stem}.toml")
