"""Checkpoints: one safetensors file of dotted tensor names and one JSON document; load() checks before it allocates."""
from __future__ import annotations

import json
import math
import re
import shlex
import struct
import typing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from common.machine import check_free_memory, usable_device
from common.run_folder import BEST, LAST, old_format, write_atomic
from configs.choices import OPTIMIZERS
from configs.schema import FIELDS, TYPES, checked_types
from data.gate import open_regular
from data.tokenizer import CharTokenizer
from errors import UserError, in_one_line, shown
from training.device import Dist, random_states, set_random_states
from training.optim import configure_optimizer

FORMAT = 2
META = "chargpt"  # the metadata key of the JSON document
HEADER_MAX = 16 << 20  # the header: each tensor's name and shape, and the JSON (about 15 bytes per logged loss)
DEPTH_MAX = 16  # the JSON's nesting (a checkpoint's deepest is 6: optimizer.muon.param_groups[0].betas)
CONTAINERS_MAX = 2_000_000  # the JSON's lists and objects: one per logged loss, besides a few
# The JSON's keys -> (types, who needs it): "sample" every reader, "resume" --resume too, "later" none (has a default)
CONTENTS = {"format": (int, "sample"), "model_config": (dict, "sample"),
            "run_config": (dict, "sample"), "vocab": (str, "sample"), "iter": (int, "sample"),
            "optimizer": (dict, "resume"), "rng": (dict, "resume"), "best_val_loss": ((int, float), "resume"),
            "scaler": ((dict, type(None)), "later"), "train_seconds": ((int, float), "later"),
            "eval_done": (bool, "later"), "last_eval": (dict, "later"), "evals_since_best": (int, "later"),
            "data": (dict, "later"), "tokens_per_iter": (int, "later"), "losses": (dict, "later")}
OPTIMIZER_STATE = {"AdamW": ("step", "exp_avg", "exp_avg_sq"), "Muon": ("momentum_buffer",)}  # per stepped weight
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.uint8: "U8"}
NUMBER = (int, float)  # JSON's numbers, exactly: a bool is none
COUNT = (lambda v: type(v) is int and v >= 0, "a count, 0 or more")
POSITIVE = (lambda v: type(v) in NUMBER and math.isfinite(v) and v > 0, "a finite positive number")
NON_NEGATIVE = (lambda v: type(v) in NUMBER and math.isfinite(v) and v >= 0, "a finite number, 0 or more")
FRACTION = (lambda v: type(v) in NUMBER and 0 <= v < 1, "a number in [0, 1)")
SCALER = {"scale": POSITIVE, "growth_factor": POSITIVE, "backoff_factor": POSITIVE, "growth_interval": COUNT,
          "_growth_tracker": COUNT}
DATA = {"source": (lambda v: isinstance(v, str), "the name of a text"),
        "sha256": (lambda v: isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v) is not None, "a sha256 checksum"),
        "first_char": (lambda v: isinstance(v, str) and len(v) == 1, "one character"),
        **{key: COUNT for key in ("n_chars", "n_train", "n_val", "vocab_size", "bytes")}}
LATER = {"iter": COUNT, "evals_since_best": COUNT, "tokens_per_iter": (lambda v: v >= 1, "1 or more"),
         "train_seconds": NON_NEGATIVE, "last_eval": (lambda v: set(v) <= {"train", "val"} and all(
             type(x) in NUMBER for x in v.values()), "losses (train, val)")}
# Settings a run or device may change; any other must be configure_optimizer's (ns_steps=10**9 would hang a step).
ON_OFF = (lambda v: v is None or isinstance(v, bool), "true, false or None")
FREE_SETTINGS = {"lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "momentum": FRACTION, "fused": ON_OFF,
                 "foreach": ON_OFF, "betas": (lambda v: isinstance(v, list) and len(v) == 2
                                              and all(map(FRACTION[0], v)), "two numbers in [0, 1)")}


@dataclass
class Progress:
    """The loop's state in every checkpoint. losses: "train" (step, loss) and "eval" (step, train, val) points."""
    it: int = 0
    best_val: float = math.inf
    train_seconds: float = 0.0
    eval_done: bool = False
    last_eval: dict = field(default_factory=dict)
    evals_since_best: int = 0
    losses: dict = field(default_factory=lambda: {"train": [], "eval": []})


def capture(run, progress: Progress) -> dict:
    """What a checkpoint holds (CONTENTS) of run, a training.opening.Run; restore() inverts it."""
    return {
        "model": run.model.state_dict(), "model_config": run.model_cfg.to_dict(), "run_config": run.cfg.to_dict(),
        "vocab": run.tokenizer.chars, "optimizer": run.optimizer.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler.is_enabled() else None,
        "iter": progress.it, "best_val_loss": progress.best_val, "train_seconds": progress.train_seconds,
        "eval_done": progress.eval_done, "last_eval": progress.last_eval, "evals_since_best": progress.evals_since_best,
        "data": run.data_info, "tokens_per_iter": run.tokens_per_iter, "losses": progress.losses,
        "rng": dict(zip(("torch", "cuda"), random_states(run.rt.device)), batches=run.batches.state_dict()),
    }


def restore(run, state: dict, d: Dist = Dist()) -> Progress:
    """A checkpoint's state (load(resume=True)) into run (a training.opening.Run); returns where the run is."""
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    if state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    run.batches.load_state_dict(state["rng"]["batches"])  # the same stream, whatever the number of ranks
    if d.world_size == 1:  # (ranks draw their own dropout streams: seed + rank)
        set_random_states(run.rt.device, (state["rng"]["torch"], state["rng"].get("cuda", None)
                                          if run.rt.device.type == "cuda" else None))
    losses = state.get("losses", {"train": [], "eval": []})
    return Progress(it=state["iter"], best_val=state["best_val_loss"], train_seconds=state.get("train_seconds", 0.0),
                    eval_done=state.get("eval_done", True), last_eval=state.get("last_eval", {}),
                    evals_since_best=state.get("evals_since_best", 0),
                    losses={name: [tuple(point) for point in losses[name]] for name in ("train", "eval")})


def non_finite(weights: dict) -> str | None:  # the first weight holding NaN or inf
    return next((name for name, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)


def optimizer_parts(saved: dict) -> list[tuple[str, dict]]:
    """(dotted name, state) per optimizer: Muon with AdamW keeps one of each."""
    two = set(saved) == {"muon", "adamw"}
    return [(f"optimizer.{name}", saved[name]) for name in ("muon", "adamw")] if two else [("optimizer", saved)]


def save(state: dict, path: Path) -> None:
    """state written as a checkpoint, whole or not at all (write_atomic); weights that are not finite are refused."""
    if bad := non_finite(state["model"]):
        raise UserError(f"not writing {path}: {bad} holds NaN or inf (training diverged), so the last one is kept; "
                        f"try a lower --learning_rate or --dtype float32, then --resume")
    tied = state.get("model_config", {}).get("tie_weights")  # lm_head.weight is wte.weight: safetensors stores it once
    tensors = {f"model.{k}": t for k, t in state["model"].items() if not (tied and k == "lm_head.weight")}
    doc = {"format": FORMAT, **{k: v for k, v in state.items() if k not in ("model", "optimizer", "rng")}}
    if "optimizer" in state:
        doc["optimizer"] = {}
        for where, part in optimizer_parts(state["optimizer"]):
            tensors.update({f"{where}.state.{i}.{k}": t for i, one in part["state"].items() for k, t in one.items()})
            (doc["optimizer"].setdefault(where[10:], {}) if "." in where else doc["optimizer"])["param_groups"] = \
                part["param_groups"]
    if "rng" in state:
        rng, doc["rng"] = state["rng"], {}
        tensors.update({"rng.torch": rng["torch"], "rng.batches.generator": rng["batches"]["generator"]})
        tensors.update({"rng.cuda": rng["cuda"]} if rng.get("cuda") is not None else {})
    tensors = {k: t.detach().to("cpu", copy=False).contiguous() for k, t in tensors.items()}
    write_atomic(path, lambda f: write_safetensors(f, tensors, {META: json.dumps(doc)}), "checkpoint")


def write_safetensors(f, tensors: dict, metadata: dict) -> None:
    """tensors streamed into f in safetensors' layout, without one bytes object of them all as its save() makes."""
    header, end = {"__metadata__": metadata}, 0
    tensors = dict(sorted(tensors.items(), key=lambda item: (-item[1].element_size(), item[0])))  # each one aligned
    for name, t in tensors.items():
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [end, end := end + t.nbytes]}
    text = json.dumps(header).encode()
    f.write(struct.pack("<Q", len(text) + -len(text) % 8) + text + b" " * (-len(text) % 8))
    for t in tensors.values():
        f.write(t.reshape(-1).view(torch.uint8).numpy().data)


def refused(path: Path, why: str) -> UserError:  # a file that is no checkpoint of this format
    return UserError(f"{path} is not a readable checkpoint ({why}): it may be truncated, or not a checkpoint; take "
                     f"another checkpoint or train again")


def damaged(path: Path, name: str, value, rule: str) -> UserError:  # a field whose value breaks its rule
    seen = repr(value) if isinstance(value, (bool, int, float, str, type(None))) else f"a {type(value).__name__}"
    return UserError(f"{path} is damaged: {shown(name[:80])} is {shown(seen[:80])}, where it must be {rule}; take "
                     f"another checkpoint or train again")


def check_values(values: dict, rules: dict, path: Path, prefix: str = "") -> None:  # name -> (test, what it is)
    for key, (ok, rule) in rules.items():
        if key in values and not ok(values[key]):
            raise damaged(path, f"{prefix}{key}", values[key], rule)


def check_document(path: Path, resume: bool) -> tuple[dict, object, safe_open]:
    """(the JSON document, its model config, the open file): the file, its header's length and the JSON's nesting
    bounded before each is parsed, then every field present where needed, of its type and in range."""
    from model import ModelConfig
    try:
        f, size = open_regular(path, "the checkpoint")
    except FileNotFoundError:
        raise UserError(f"no checkpoint at {path}; train one first or pass --ckpt FILE") from None
    with f:
        start = f.read(8)
    if start.startswith(b"PK\x03\x04"):
        raise old_format(path)
    length = struct.unpack("<Q", start)[0] if len(start) == 8 else size
    if length > HEADER_MAX or length > size - 8:
        raise refused(path, "it is empty" if not size else f"its header says {length:,} bytes, in a file of {size:,}; "
                                                           f"a checkpoint's takes at most {HEADER_MAX:,}")
    try:
        st = safe_open(path, "pt")  # the one open of the file: load() reads its tensors from it
        text = (st.metadata() or {}).get(META)
    except Exception as err:  # safetensors' own refusal of its header
        raise refused(path, shown(in_one_line(err)[:120])) from None
    if not isinstance(text, str):
        raise refused(path, "its header holds no settings")
    brackets = np.frombuffer(re.sub(r'"[^"\\]*(?:\\.[^"\\]*)*"', "", text).encode("utf-8", "surrogatepass"), np.uint8)
    opens = np.isin(brackets, (91, 123))  # [ and {: a list or an object each, ~100 bytes once parsed
    depth = np.cumsum(opens.astype(np.int32) - np.isin(brackets, (93, 125)), dtype=np.int32)
    if depth.size and (depth.max() > DEPTH_MAX or opens.sum() > CONTAINERS_MAX):
        raise refused(path, f"its settings are nested {depth.max():,} deep (at most {DEPTH_MAX}), in {opens.sum():,} "
                            f"lists and objects (at most {CONTAINERS_MAX:,})")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as err:  # (an integer of more than 4,300 digits is a ValueError)
        raise refused(path, f"its settings are not JSON: {shown(in_one_line(err)[:80])}") from None
    if not isinstance(doc, dict):
        raise refused(path, "its settings are not a JSON object")
    if missing := [k for k, (_, who) in CONTENTS.items()
                   if k not in doc and (who == "sample" or resume and who == "resume")]:
        raise UserError(f"{path} is not a complete checkpoint (missing {', '.join(missing)})")
    for key, (kind, _) in CONTENTS.items():  # (a bool is no number)
        if key in doc and (not isinstance(doc[key], kind) or (type(doc[key]) is bool) != (kind is bool)):
            raise damaged(path, key, doc[key], "as this trainer writes it")
    if doc["format"] != FORMAT:
        raise UserError(f"{path} is format {doc['format']}; this version reads {FORMAT}: use the version that wrote it")
    check_values(doc, LATER, path)
    check_values(doc.get("data", {}), DATA, path, "data.")
    check_values(doc.get("scaler") or {}, SCALER, path, "scaler.")
    losses, it = doc.get("losses", {"train": [], "eval": []}), doc["iter"]

    def points(name: str, width: int) -> bool:  # (step from 0 to the checkpoint's, then losses)
        return isinstance(losses[name], list) and all(isinstance(p, list) and len(p) == width and type(p[0]) is int
                                                      and 0 <= p[0] <= it and all(type(x) in NUMBER for x in p[1:])
                                                      for p in losses[name])
    if not (set(losses) == {"train", "eval"} and points("train", 2) and points("eval", 3)):
        raise UserError(f"{path} is damaged: its record of the losses so far is malformed; take another or train again")
    checked_types({k: v for k, v in doc["run_config"].items() if k in FIELDS}, f"{path} is damaged")
    values, types = doc["model_config"], typing.get_type_hints(ModelConfig)
    if unknown := [shown(key[:40]) for key in values if key not in types]:
        raise UserError(f"{path} is damaged: in its model config, {', '.join(unknown[:5])} unknown")
    checked_types(values, f"{path} is damaged: in its model config", {**TYPES, "vocab_size": int})
    try:
        config, tokenizer = ModelConfig(**values), CharTokenizer(doc["vocab"])
    except ValueError as err:
        raise UserError(f"{path} has an inconsistent model config or vocabulary ({shown(in_one_line(err))})") from None
    if tokenizer.vocab_size != config.vocab_size:
        raise UserError(f"{path} is inconsistent: {tokenizer.vocab_size} characters for a model of {config.vocab_size}")
    return doc, config, st


def expected_tensors(doc: dict, config, model, names: set[str], path: Path) -> dict[str, tuple[tuple, tuple]]:
    """name -> (shape, dtypes) of each tensor the settings imply: the weights (a tied head once), the stepped weights'
    optimizer state, the random states. The optimizer's groups in doc become configure_optimizer's, with only the
    FREE_SETTINGS read from the file."""
    wanted = {f"model.{k}": (tuple(t.shape), ("F32", "F16", "BF16", "F64")) for k, t in model.state_dict().items()
              if not (config.tie_weights and k == "lm_head.weight")}
    if "rng" in doc:
        size = (torch.get_rng_state().numel(),)
        wanted.update({"rng.torch": (size, ("U8",)), "rng.batches.generator": (size, ("U8",))})
        wanted.update({"rng.cuda": (None, ("U8",))} if "rng.cuda" in names else {})  # a short byte vector
    if "optimizer" not in doc:
        return wanted
    kind = doc["run_config"].get("optimizer", "adamw")
    if kind not in OPTIMIZERS:
        raise damaged(path, "run_config.optimizer", kind, " or ".join(OPTIMIZERS))
    built = configure_optimizer(model, 1e-3, 0.0, (0.9, 0.99), "meta", kind, "float32")
    built_parts = optimizer_parts(built.state_dict())
    if set(doc["optimizer"]) != ({"muon", "adamw"} if len(built_parts) == 2 else {"param_groups"}):
        raise damaged(path, "optimizer", doc["optimizer"], f"the settings of the optimizer --optimizer {kind} writes")
    for (where, want), (_, found) in zip(built_parts, optimizer_parts(doc["optimizer"])):
        optimizer, shapes = getattr(built, where[10:]) if "." in where else built, {}
        groups = found.get("param_groups") if isinstance(found, dict) else None
        if not (isinstance(groups, list) and len(groups) == len(want["param_groups"])
                and all(isinstance(group, dict) for group in groups)):
            raise damaged(path, where, found, f"an optimizer with {len(want['param_groups'])} groups")
        for i, (group, built_group) in enumerate(zip(groups, want["param_groups"])):
            check_values(group, FREE_SETTINGS, path, f"{where}.param_groups.{i}.")
            groups[i] = {**built_group, **{key: group[key] for key in FREE_SETTINGS if key in group}}
            weights = optimizer.param_groups[i]["params"]
            shapes.update((n, tuple(p.shape)) for n, p in zip(built_group["params"], weights))
        stepped = {int(m[1]) for n in names if (m := re.fullmatch(rf"{where}\.state\.(\d{{1,9}})\.\w+", n))}
        wanted.update({f"{where}.state.{i}.{key}": (() if key == "step" else shapes[i],
                                                    ("F32", "F64") if key == "step" else ("F32",))
                       for i in stepped & shapes.keys() for key in OPTIMIZER_STATE[type(optimizer).__name__]})
    return wanted


def load(path: Path, device: torch.device | str = "cpu", resume: bool = False) -> dict:
    """A checkpoint's state, checked: document, tensors' specs, free memory, values. resume: optimizer and rng too."""
    from model import GPT
    target = usable_device(device, f"load {path} onto", "load it onto cpu")  # (before the file: a missing device)
    doc, config, st = check_document(path, resume)
    try:
        with torch.device("meta"):  # the model's skeleton: shapes, no memory
            model = GPT(config)
    except (OverflowError, RuntimeError, ValueError) as err:
        raise UserError(f"{path}: its model config describes a model that cannot be built "
                        f"({shown(in_one_line(err)[:120])}); it is damaged") from None
    with st:
        wanted = expected_tensors(doc, config, model, set(st.keys()), path)
        # the file's tensors are exactly those wanted, each of its shape and dtype (read from the header alone)
        for name in sorted(set(st.keys()) ^ wanted.keys()):
            held = f"a tensor {tuple(st.get_slice(name).get_shape())}" if name not in wanted else "no such tensor"
            raise UserError(f"{path}: its tensors do not fit its settings ({shown(name[:80])}: the settings give "
                            f"{'no such tensor' if name not in wanted else wanted[name][0]}, the file holds {held})")
        for name, (shape, dtypes) in wanted.items():
            found, dtype = tuple(st.get_slice(name).get_shape()), st.get_slice(name).get_dtype()
            if (found != shape if shape is not None else len(found) != 1 or found[0] > 4096) or dtype not in dtypes:
                raise UserError(f"{path}: its tensors do not fit its settings ({name}: the settings give "
                                f"{shape or '(a short vector)'} of {'/'.join(dtypes)}, the file holds {found} of "
                                f"{dtype})")
        reading = [name for name in wanted if resume or name.startswith("model.")]
        need = sum(t.numel() * 4 for t in [*model.parameters(), *model.buffers()])  # float32
        need += sum(math.prod(wanted[name][0] or (4096,)) * 4 for name in reading if not name.startswith("model."))
        check_free_memory(need, "cpu", f"{path}: its model", "use it on a machine with more memory")  # read on the host
        tensors = {name: st.get_tensor(name) for name in reading}
    weights = {name[6:]: t for name, t in tensors.items() if name.startswith("model.")}
    if config.tie_weights:
        weights["lm_head.weight"] = weights["wte.weight"]
    if bad := non_finite(weights):
        raise UserError(f"{path} holds weights that are not finite (NaN or inf in {bad}); it cannot be used: take "
                        f"another checkpoint ({BEST} or {LAST}) or train again")
    state, it = {k: v for k, v in doc.items() if k not in ("optimizer", "rng")}, doc["iter"]
    if resume:  # each step count a whole number in [0, iter], each moment finite (a second one not negative)
        parts = {where: {"state": {}, "param_groups": part["param_groups"]}
                 for where, part in optimizer_parts(doc["optimizer"])}
        for name, t in tensors.items():
            if not (m := re.fullmatch(r"(optimizer(?:\.muon|\.adamw)?)\.state\.(\d+)\.(\w+)", name)):
                continue
            if m[3] == "step" and not (math.isfinite(value := float(t)) and value == int(value) and 0 <= value <= it):
                raise damaged(path, name, value, f"a whole number from 0 to the checkpoint's step, {it}")
            if m[3] != "step" and (not torch.isfinite(t).all() or m[3] == "exp_avg_sq" and (t < 0).any()):
                raise damaged(path, name, t, "finite" + " and not negative" * (m[3] == "exp_avg_sq"))
            parts[m[1]]["state"].setdefault(int(m[2]), {})[m[3]] = t
        state["optimizer"] = {w[10:]: part for w, part in parts.items()} if len(parts) == 2 else parts["optimizer"]
        state["rng"] = {"torch": tensors["rng.torch"], "batches": {"generator": tensors["rng.batches.generator"]},
                        **({"cuda": tensors["rng.cuda"]} if "rng.cuda" in tensors else {})}
    try:
        state["model"] = {name: t.to(target) for name, t in weights.items()}
    except (RuntimeError, TypeError) as err:  # the file passed every check: the device (or its dtypes) cannot hold it
        raise UserError(f"{path} is readable, but {target} cannot hold its weights ({in_one_line(err)}); load it "
                        f"onto cpu") from None
    return state


def step_of(path: Path) -> int | None:  # a checkpoint's step, None where its settings cannot be read
    try:
        return check_document(path, False)[0]["iter"]
    except (UserError, OSError):
        return None


def load_model(path: Path, device: torch.device | str = "cpu"):
    """(model in eval mode, tokenizer, state); a refused ckpt_best names a readable ckpt_last."""
    from model import GPT, ModelConfig
    device = usable_device(device, f"load {path} onto", "load it onto cpu")  # (a device it lacks: not the file's fault)
    try:
        state = load(path, device)
    except UserError as err:
        last = Path(path).parent / LAST
        if Path(path).name != BEST or step_of(last) is None:
            raise
        raise UserError(f"{err}; the run's last checkpoint reads well: --ckpt {shlex.quote(str(last))}") from None
    model = GPT(ModelConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model.to(device).eval(), CharTokenizer(state["vocab"]), state
