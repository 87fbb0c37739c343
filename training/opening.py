"""Opening a run: every check that can fail comes before anything in the folder changes; then the folder is owned,
the checkpoint to resume is read and checked, the data prepared and the run built."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from configs import TrainConfig
from configs.loader import config_from_dict
from configs.schema import ARCHITECTURE_FIELDS, SHAPE_FIELDS
from data import Corpus, Prepared, default_cache_dir, prepare, resolve
from data.corpus import NAMED
from errors import UserError
from model.config import ModelConfig
from training import checkpoint, runtime
from training.build import build_run, plateaued
from training.distributed import Dist
from training.estimate import refuse_if_too_big
from training.log import Log
from training.phases import Phases
from training.run_dir import RunDir
from training.stop import StopRequest


def check_paths(cfg: TrainConfig) -> None:
    data = Path(cfg.data).expanduser()
    for option, value in (("--cache_dir", cfg.cache_dir), ("--out_dir", cfg.out_dir)):
        path = Path(value).expanduser()
        if value and path.exists() and not path.is_dir():
            raise UserError(f"{option} {value} is a file, not a folder; choose another {option}")
        if value and data.is_dir() and path.resolve().is_relative_to(data.resolve()):
            raise UserError(f"{option} {value} is inside the --data folder {cfg.data}: the run would train on its own "
                            f"files; choose an {option} outside it")
    try:
        cfg.out_dir.encode("utf-8")
    except UnicodeEncodeError:  # bytes the file system took, but not UTF-8 (Python holds them as surrogates)
        raise UserError(f"--out_dir {cfg.out_dir}: the name is not valid UTF-8, which TensorBoard needs for its event "
                        f"files; choose a name in UTF-8") from None


def cache_dir_of(cfg: TrainConfig) -> Path:
    return Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()


def choose_corpus(cfg: TrainConfig, say) -> tuple[TrainConfig, Corpus]:
    """Find the corpus now (downloading a named one), so that the run is named and recorded after the text it
    really trains on: offline, "shakespeare" falls back to "pystdlib", and the config then says pystdlib (a resume
    later, online, must not switch to Shakespeare). Without --out_dir the run goes to out/<preset>-<corpus>."""
    corpus = resolve(cfg.data, cache_dir_of(cfg), say=say, fallback=True)
    if cfg.data in NAMED and corpus.name != cfg.data:
        cfg.data = corpus.name
    if not cfg.out_dir:
        path = Path(corpus.name)
        label = corpus.name if corpus.name in NAMED else (path.stem if path.is_file() else path.name)
        label = re.sub(r"[^\w.-]+", "_", label)[:40] or "corpus"  # letters of any script, digits, . _ -
        cfg.out_dir = f"out/{cfg.config_name}-{label}"
        if cfg.init_from:  # a fine-tuned model is named after the one it starts from: out/<that run>+<corpus>
            start = Path(cfg.init_from)
            cfg.out_dir = f"out/{(start if start.is_dir() else start.parent).resolve().name}+{label}"
    return cfg, corpus


def prepare_data(cfg: TrainConfig, say, corpus: Corpus | None = None, base_vocab: str = "",
                 check=None) -> Prepared:
    """The token files of the run's corpus (found here unless choose_corpus already found it)."""
    cache_dir = cache_dir_of(cfg)
    corpus = corpus or resolve(cfg.data, cache_dir, say=say)
    return prepare(corpus, cache_dir, cfg.val_fraction, cfg.encoding, cfg.encoding_errors, say=say,
                   base_vocab=base_vocab, check=check)


def same_text(resumed: dict, source: Path, data_named: bool):
    """prepare()'s check for --resume, before any token file is written: the text has the checkpoint's vocabulary,
    and, where the checkpoint named the text itself (no --data now), the checksum its record holds. A run folder or
    checkpoint may come from someone else: a text it names is only read after it proves to be the one it trained on."""
    record = resumed.get("data") if isinstance(resumed.get("data"), dict) else {}

    def check(sha256: str, vocab: str) -> None:
        recorded = record.get("sha256")
        if not data_named and isinstance(recorded, str) and recorded != sha256:
            raise UserError(f"--resume: the text {source} names is not the text it was trained on (its checksum "
                            f"differs from the checkpoint's record), so nothing was prepared; put the original text "
                            f"back, or give --data to go on with another text")
        if vocab != resumed["vocab"]:
            raise UserError(f"--resume: the corpus has a different vocabulary from the checkpoint's "
                            f"({len(vocab)} characters, {len(resumed['vocab'])} in {source}), so nothing was "
                            f"prepared; resume with the same --data")
    return check


def init_config(cfg: TrainConfig, explicit: set[str], state: dict, where: Path) -> TrainConfig:
    """A fine-tuning run's config: the trained model's architecture, whatever the preset says; a shape given
    explicitly that differs is refused (the weights would not fit)."""
    saved = {**ModelConfig().to_dict(), **state["model_config"]}  # older checkpoints: the forms added since
    values = cfg.to_dict()
    for name in SHAPE_FIELDS:
        if name in explicit and values[name] != saved[name]:
            raise UserError(f"{name} {values[name]!r} (set on the command line or by --config) does not fit the "
                            f"model in {where} ({name} {saved[name]!r}); leave it out, or choose a --config without "
                            f"it: --init_from keeps that model's architecture")
        values[name] = saved[name]
    return TrainConfig(**values)


def resume_config(cfg: TrainConfig, explicit: set[str], saved: dict, say, where: Path) -> TrainConfig:
    """The saved run's config, with only the fields the user set now; architecture changes are refused."""
    old = config_from_dict(saved, str(where), say)
    values = old.to_dict()
    # Where a run writes is the user's word, never a checkpoint's: the folder being resumed, and the cache the command
    # line names (or the default one).
    values["out_dir"], values["cache_dir"] = cfg.out_dir, cfg.cache_dir
    for name in sorted(explicit - {"resume", "overwrite"}):
        new_value = getattr(cfg, name)
        if new_value == values.get(name):
            continue
        if name in ARCHITECTURE_FIELDS or name == "optimizer":  # the saved weights / optimizer state would not fit
            what = "the optimizer" if name == "optimizer" else "the architecture"
            raise UserError(f"--resume: {name} was {values[name]!r} in this run and cannot change to {new_value!r}; "
                            f"leave --{name} (and any --config that sets it) out, as --resume keeps the run's own "
                            f"settings, or start a new run in another --out_dir to change {what}")
        say(f"resume: {name} changed from {values.get(name)!r} to {new_value!r}")
        values[name] = new_value
    return TrainConfig(**{**values, "resume": True, "overwrite": False})


def check_same_model(cfg: TrainConfig, state: dict, where: Path) -> None:
    """The model --resume builds (from the run's config) is the one the weights were checked against (the
    checkpoint's model config): a run config that asks for more is refused before it is built."""
    built = cfg.model_config(len(state["vocab"])).to_dict()
    saved = {**ModelConfig().to_dict(), **state["model_config"]}  # older checkpoints: the forms added since
    differ = [name for name in SHAPE_FIELDS if built[name] != saved[name]]
    if differ:
        name = differ[0]
        raise UserError(f"{where} is damaged: its run config and its model config disagree on {name} "
                        f"({built[name]!r} and {saved[name]!r}); sample from it, or start a new run")


def finished_run(run_dir: RunDir, state: dict, cfg: TrainConfig) -> str | None:
    """For --resume of a run that has nothing left to do: where it finished and how to train further."""
    summary_path = run_dir.path / "summary.json"
    since_best = state.get("evals_since_best", 0)  # its type was checked with the rest (check_resumable)
    if (state["iter"] < cfg.max_iters and not plateaued(since_best, cfg.patience)) or not summary_path.is_file():
        return None
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        loss = f", full validation {summary['full_val_loss']:.4f}" if "full_val_loss" in summary else ""
        model = f" (its model: step {summary['model_step']}, {summary['model_checkpoint']})" if "model_step" in summary else ""
    except (OSError, ValueError, TypeError, KeyError):
        return None  # a damaged summary is written again by finishing the run
    where = shlex.quote(str(run_dir.path))
    if state["iter"] < cfg.max_iters:
        return (f"{run_dir.path} stopped early at step {state['iter']}{model}{loss}: {since_best} evaluations in a row "
                f"did not improve on its best; nothing to do. To train on anyway: python train.py --out_dir {where} "
                f"--resume --patience 0")
    return (f"{run_dir.path} finished at step {state['iter']}{model}{loss}; nothing to do. To train further: "
            f"python train.py --out_dir {where} --resume --max_iters {max(state['iter'], cfg.max_iters) * 2}")


def open_run(cfg: TrainConfig, explicit: set[str], d: Dist, run_dir: RunDir, log: Log, stop: StopRequest,
             phases: Phases, corpus: Corpus | None = None):
    """Own the folder, read the checkpoint to resume, prepare the data (timed as phases' "data") and build the run;
    or, for a finished run, the line that says so. Under torchrun rank 0 goes first, and a failure anywhere is one
    line from rank 0."""
    resumed, source, init = None, None, None
    with d.together():
        if d.is_main:
            check_paths(cfg)
            run_dir.claim(log.say, cfg.resume)
            if not cfg.resume:
                run_dir.check_new_run(cfg.overwrite)
    with d.together():
        if cfg.resume:
            if cfg.overwrite:
                raise UserError("--resume continues the run in --out_dir and --overwrite replaces it: give one")
            source = run_dir.resume_from()
            resumed = checkpoint.load(source)
            checkpoint.check_resumable(resumed, source)
            stop.saved = f"{source} (step {resumed['iter']}) is untouched"
            cfg = resume_config(cfg, explicit, resumed["run_config"], log.say, source)
            check_same_model(cfg, resumed, source)
            done = finished_run(run_dir, resumed, cfg)
            if done:
                return done
            if "data" not in explicit and cfg.data not in NAMED and not Path(cfg.data).expanduser().exists():
                raise UserError(f"--resume: the text this run trained on, {cfg.data}, is no longer there; put it back, "
                                f"or give its new place with --data (the same text)")
        elif cfg.init_from:
            start = Path(cfg.init_from)
            start = checkpoint.find(str(start), "") if start.is_dir() else start
            init = checkpoint.load(start)
            cfg = init_config(cfg, explicit, init, start)
        # A fine-tuned run's vocabulary begins with its first model's, so that the old ids keep their meaning.
        base_vocab = (resumed if resumed is not None else init)["vocab"] if cfg.init_from else ""
        check = same_text(resumed, source, "data" in explicit) if resumed is not None else None
        with phases.timing("data"):
            prepared = prepare_data(cfg, log.say, corpus, base_vocab, check) if d.is_main else None
        if d.is_main and prepared.tokenizer.vocab_size == 1:
            log.say(f"note: {prepared.meta['source']} holds one distinct character, {prepared.tokenizer.chars!r}, so "
                    f"every next character is certain and the loss falls to 0: there is nothing to learn; give a text "
                    f"with more than one character")
        if init is not None and d.is_main:
            new = prepared.tokenizer.chars[len(init["vocab"]):]
            shown = "".join(f" {ch!r}" for ch in new[:12]) + (" ..." if len(new) > 12 else "")
            log.say(f"fine-tuning {start} (step {init['iter']}), with its architecture; vocabulary: its "
                    f"{len(init['vocab'])} characters + {len(new)} new{':' + shown if new else ''}")
    with d.together():
        if not d.is_main:
            with phases.timing("data"):
                prepared = prepare_data(cfg, log.say, base_vocab=base_vocab, check=check)  # rank 0's, in the cache
        trained_on = resumed.get("data") if resumed is not None else None  # the corpus's facts, as the run saved them
        changed = isinstance(trained_on, dict) and trained_on.get("sha256") not in (None, prepared.meta["sha256"])
        if d.is_main and changed:
            log.say(f"note: the text of {prepared.meta['source']} is not the text step {resumed['iter']} was trained "
                    f"on (its checksum differs); the run goes on with this text, so it will not match an uninterrupted "
                    f"run")
        rt = runtime.setup(cfg.device, cfg.dtype, cfg.num_threads, d.local_rank)
        refuse_if_too_big(cfg, rt, stop.saved)  # on a CPU the system would end the process, wordlessly
        try:
            run, progress = build_run(cfg, rt, prepared, d, log.say, resumed, init)
        except (RuntimeError, KeyError, ValueError, TypeError) as err:
            if resumed is None or runtime.is_out_of_memory(err):
                raise
            raise UserError(f"{source} does not fit this model or optimizer ({str(err).splitlines()[0][:150]}); "
                            f"it is damaged or from another version") from None
    return run, progress, source
