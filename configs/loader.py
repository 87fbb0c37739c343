"""A TrainConfig from a preset or .toml file and --field overrides, or from a checkpoint (resume, fine-tune)."""
from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import shlex
import tomllib
from pathlib import Path

from configs import nanogpt
from configs.schema import (CONFIG_MAX_BYTES, FIELDS, FIXED, HELP_GROUPS, SHAPE_FIELDS, TYPES, TrainConfig,
                            checked_types)
from data.corpus import NAMED
from data.gate import read_small, utf8_text
from errors import ArgumentParser, UserError, parse_bool, python_command
from model.config import ModelConfig

PRESET_DIR = Path(__file__).resolve().parent


def presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


PARSERS = {bool: (parse_bool, "true or false"), int: (int, "an integer"), float: (float, "a number"), str: (str, "")}


def parse_value(name: str, text) -> object:
    if not isinstance(text, str):  # a bare boolean flag
        return text
    if name == "compile":  # auto | true | false
        with contextlib.suppress(ValueError):
            return "auto" if text.strip().lower() == "auto" else str(parse_bool(text)).lower()
        return text  # TrainConfig names the choices
    parse, expected = PARSERS[TYPES[name]]
    try:
        return parse(text)
    except ValueError:
        raise UserError(f"--{name}: expected {expected}, got {text!r}") from None


def suggest(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return f"; did you mean {close[0]}?" if close else ""


def unknown_option(option: str) -> UserError:
    name = option.split("=", 1)[0]
    if name.startswith("--") and (answer := nanogpt.TRAIN_SETTINGS.get(name[2:])):
        return UserError(f"unknown option {name}: {answer}")
    hint = suggest(name, [f"--{n}" for n in FIELDS if n != "config_name"] + ["--config"])
    return UserError(f"unknown option {name}{hint or '; see ' + python_command('train.py') + ' --help'}")


def build_parser(preset: str, values: dict, why: str) -> ArgumentParser:
    """The command line; --help shows each field's value under the preset."""
    parser = ArgumentParser(prog="train.py", allow_abbrev=False, epilog=f"presets: {', '.join(presets())}",
                            description=f"Train a character-level GPT. --config picks a preset; --field value overrides "
                                        f"it. The defaults below are preset {preset}'s{why}.")
    parser.add_argument("--config", default=argparse.SUPPRESS,
                        help="a preset's name or a .toml file (default: shakespeare_char_gpu with CUDA, else "
                             "shakespeare_char_cpu)")
    for heading, names in HELP_GROUPS.items():
        group = parser.add_argument_group(heading)
        for name in names:
            f, kind = FIELDS[name], TYPES[name]
            extra = {"nargs": "?", "const": True} if kind is bool else {}  # a bare --resume means true
            here = f"; here {values[name]}, from {preset}" if name in values and values[name] != f.default else ""
            group.add_argument(f"--{name}", default=argparse.SUPPRESS, metavar=kind.__name__.upper(),
                               help=f"{f.metadata['help']}{here} (default: {f.default})", **extra)
    return parser


def read_preset(spec: str) -> tuple[Path, dict]:
    """The --config file (a preset or a path) and its settings."""
    path = Path(spec)
    if path.suffix == ".py":  # nanoGPT's Python configs: never run
        raise nanogpt.python_config(spec)
    if not path.suffix and not path.is_file() and (PRESET_DIR / f"{spec}.toml").is_file():
        path = PRESET_DIR / f"{spec}.toml"
    if path.is_dir():
        raise UserError(f"--config {spec}: a folder; give a .toml file or a preset: {', '.join(presets())}")
    if not path.exists():
        raise UserError(f"--config {spec}: no such preset or file{suggest(spec, presets())}; "
                        f"presets: {', '.join(presets())}")
    try:
        data = read_small(path, "--config", CONFIG_MAX_BYTES, "give a TOML file of settings")
    except OSError as err:
        raise UserError(f"--config {spec}: cannot be read ({err.strerror})") from None
    try:
        values = tomllib.loads(utf8_text(data, f"--config {spec}"))
    except (tomllib.TOMLDecodeError, RecursionError, MemoryError) as err:
        raise UserError(f"--config {spec}: not valid TOML ({err if isinstance(err, ValueError) else 'nested too deep'})"
                        f"; give a TOML file of settings") from None
    for key in [key for key in values if key not in FIELDS]:
        if isinstance(values[key], dict):  # a [table], or a dotted key
            raise UserError(f"{path}: [{key}] is a table; move its settings to the top level as name = value lines")
        raise UserError(f"{path}: unknown field {key}{suggest(key, FIELDS)}")
    return path, checked_types(values, str(path))


def load_config(argv: list[str] | None, cuda_available: bool) -> tuple[TrainConfig, str, set[str]]:
    """The config, a line naming the preset and why, and the fields the user set."""
    first = ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument("--config", action="append")
    named = first.parse_known_args(argv)[0].config or []
    if len({read_preset(spec)[0].resolve() for spec in named}) > 1:
        raise UserError(f"--config is given {len(named)} times ({', '.join(named)}); give one")
    given = named[-1] if named else None
    why = "" if given else f" (no --config given; CUDA is {'' if cuda_available else 'not '}available)"
    path, values = read_preset(given or ("shakespeare_char_gpu" if cuda_available else "shakespeare_char_cpu"))
    name = path.stem
    parser = build_parser(name, values, why)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if python := next((u for u in unknown if not u.startswith("-") and u.endswith(".py")), None):
            raise nanogpt.python_config(python)
        if toml := next((u for u in unknown if not u.startswith("-") and u.endswith(".toml")), None):
            raise UserError(f"{toml}: a config file is given with --config: {python_command('train.py')} --config "
                            f"{shlex.quote(toml)}")
        raise unknown_option(next((u for u in unknown if u.startswith("-")), unknown[0]))
    overrides = {name: parse_value(name, text) for name, text in vars(args).items() if name != "config"}
    notes = [f"config: {name}{why}"]
    if "init_from" in overrides:  # nanoGPT's resume | scratch | gpt2*
        overrides["init_from"], said = nanogpt.init_from(overrides["init_from"])
        if said:
            overrides["resume"] = True
            notes.append(said)
    explicit = set(overrides) | (set(values) if given else set())
    said = follow_learning_rate(values, overrides, set(overrides), name)
    if said and not overrides.get("resume") and not overrides.get("init_from"):
        notes.append(said)
    values = {"config_name": name, **values, **overrides}
    if "data" in explicit and values["data"] not in NAMED and values["data"].strip():  # a path, recorded whole
        values["data"] = os.path.abspath(os.path.expanduser(values["data"]))
    try:
        return TrainConfig(**values), "\n".join(notes), explicit
    except ValueError as err:
        raise UserError(where_from(str(err), set(overrides), path if given else None)) from None


def where_from(problem: str, typed: set[str], path: Path | None) -> str:
    """A setting's problem, named where the user set it: a --config key or a flag."""
    name = problem.split(" ", 1)[0].removeprefix("--")
    if name not in FIELDS or sum(re.search(rf"\b{field}\b", problem) is not None for field in FIELDS) > 1:
        return problem
    if name in typed:
        return problem if problem.startswith("--") else f"--{problem}"
    if path is None or path.resolve().parent == PRESET_DIR.resolve():
        return problem
    if problem.startswith("--"):
        problem = problem[2:].replace(" ", " = ", 1)
    return f"{path}: {problem}; correct it there, or give --{name} to set it"


def follow_learning_rate(base: dict, values: dict, given: set[str], name: str) -> str:
    """Scale min_lr with learning_rate when only the rate is given; the note saying so, or ""."""
    if "learning_rate" not in given or "min_lr" in given:
        return ""
    rate, floor = (base.get(field, FIELDS[field].default) for field in ("learning_rate", "min_lr"))
    if floor == 0 or rate <= 0 or values["learning_rate"] == rate:
        return ""
    values["min_lr"] = values["learning_rate"] * floor / rate
    return (f"note: min_lr follows --learning_rate: {values['min_lr']:.3g}, {floor / rate:.3g} of it as in "
            f"{name} ({floor:g} of {rate:g}); --min_lr sets it")


def config_from_dict(values: dict, where: str, say) -> TrainConfig:
    """A checkpoint's saved config; unknown fields are ignored and said."""
    ignored = sorted(k for k, v in values.items() if k not in FIELDS and (k, v) not in FIXED.items())
    if ignored:
        say(f"note: {where} has settings this version does not know, ignored: {', '.join(ignored)}")
    known = checked_types({k: v for k, v in values.items() if k in FIELDS}, where)
    try:
        return TrainConfig(**known)
    except ValueError as err:
        raise UserError(f"{where}: its saved config is invalid ({err})") from None


# What a fine-tuning run takes from its own command, never from its first model's run.
OWN_SETTINGS = ("data", "cache_dir", "val_fraction", "encoding", "encoding_errors", "out_dir", "resume", "overwrite",
                "init_from", "device", "num_threads", "ddp")


# What a resumed run keeps, and why.
KEPT_ON_RESUME = {**dict.fromkeys((*SHAPE_FIELDS, "optimizer"), "the saved weights and optimizer state fix it"),
                  "val_fraction": "it fixes the validation split", "encoding": "it fixes the text",
                  "encoding_errors": "it fixes the text", "seed": "it fixes the windows evaluations measure",
                  "init_from": "a run's first model is read only at its start"}


def same_model(given: str, saved: str | None) -> bool:
    """Whether two --init_from values name one model: one path, or a folder and a file in it."""
    if not given or not saved:
        return False
    one, other = (Path(value).expanduser().resolve() for value in (given, saved))
    return one == other or one.parent == other or other.parent == one


def saved_model_config(state: dict) -> dict:  # defaults fill settings it predates
    return {**ModelConfig().to_dict(), **state["model_config"]}


def init_config(cfg: TrainConfig, explicit: set[str], state: dict, where: Path, say) -> TrainConfig:
    """A fine-tuning config: the model's shape and its run's settings, under the command's."""
    saved = saved_model_config(state)
    base = config_from_dict(state["run_config"], str(where), say).to_dict()
    values = cfg.to_dict()
    for name in SHAPE_FIELDS:
        if name in explicit and values[name] != saved[name]:
            raise UserError(f"{name} {values[name]!r} does not fit the model in {where} ({name} {saved[name]!r}); "
                            f"leave it out")
        values[name] = saved[name]
    kept = explicit | set(OWN_SETTINGS) | set(SHAPE_FIELDS)
    values.update({name: value for name, value in base.items() if name not in kept})
    if note := follow_learning_rate(base, values, explicit, f"{where}'s run"):
        say(note)
    try:
        return TrainConfig(**values)
    except ValueError as err:
        raise UserError(f"--init_from {where}: {err}") from None


def resume_config(cfg: TrainConfig, explicit: set[str], state: dict, say, where: Path, world_size: int = 1
                  ) -> tuple[TrainConfig, TrainConfig]:
    """(the saved config, the resumed one): only the fields the user set change."""
    old = config_from_dict(state["run_config"], str(where), say)
    values = {**old.to_dict(), "out_dir": cfg.out_dir, "cache_dir": cfg.cache_dir, "ddp": cfg.ddp}
    for name in sorted(explicit - {"resume", "overwrite"}):
        new_value = getattr(cfg, name)
        if new_value == values.get(name) or name == "init_from" and same_model(new_value, values.get(name)):
            continue
        if name == "max_iters" and new_value < state["iter"]:
            raise UserError(f"--resume: max_iters {new_value} is behind this run's step {state['iter']}; give "
                            f"--max_iters {state['iter']} or more")
        if name in KEPT_ON_RESUME:
            raise UserError(f"--resume: {name} was {values[name]!r} in this run and cannot change to {new_value!r}: "
                            f"{KEPT_ON_RESUME[name]}; leave --{name} out, or fine-tune it with --init_from "
                            f"{shlex.quote(cfg.out_dir)}")
        if name == "num_threads" and new_value == 0:
            say(f"resume: the thread count is measured again (--num_threads 0; this run had {values.get(name)})")
        else:
            say(f"resume: {name} changed from {values.get(name)!r} to {new_value!r}")
        values[name] = new_value
    if note := follow_learning_rate(old.to_dict(), values, explicit, "this run"):
        say(note.replace("note: ", "resume: ", 1))
    try:
        new = TrainConfig(**{**values, "resume": True, "overwrite": False})
    except ValueError as err:
        raise UserError(f"--resume: {err}") from None
    return old, keep_global_batch(new, explicit, state, world_size, say)


def check_same_model(cfg: TrainConfig, state: dict, where: Path) -> None:
    """Refuse a run config that does not build the checkpoint's model."""
    built, saved = cfg.model_config(len(state["vocab"])).to_dict(), saved_model_config(state)
    if name := next((name for name in SHAPE_FIELDS if built[name] != saved[name]), None):
        raise UserError(f"{where} is damaged: its run config and its model config disagree on {name} "
                        f"({built[name]!r} and {saved[name]!r}); sample from it, or start a new run")


def keep_global_batch(cfg: TrainConfig, explicit: set[str], state: dict, world_size: int, say) -> TrainConfig:
    """Keep the tokens per step when resuming under another process count."""
    saved = state.get("tokens_per_iter")
    micro = cfg.batch_size * cfg.block_size
    now = micro * cfg.grad_accum_steps * world_size
    if saved is None or saved == now or {"grad_accum_steps", "batch_size"} & explicit or saved % micro:
        return cfg
    per_step = saved // micro
    processes = f"{world_size} process{'es' if world_size > 1 else ''}"
    if per_step % world_size:
        raise UserError(f"--resume: {processes} cannot share {per_step} micro-batches evenly; use a process count "
                        f"that divides {per_step}, or give --grad_accum_steps")
    accum = per_step // world_size
    say(f"resume: {processes} now, so grad_accum_steps {cfg.grad_accum_steps} -> {accum}, keeping {saved:,} "
        f"tokens per step")
    return TrainConfig(**{**cfg.to_dict(), "grad_accum_steps": accum})
