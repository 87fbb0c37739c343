"""The end of a finished run: the run's model (its best) handed over and fully validated, TensorBoard's HParams
figures, and summary.json."""
from __future__ import annotations

import json
import math

from training.evaluation import full_validation_loss
from training.files import write_text_atomic
from training.session import Session

HPARAMS = ("learning_rate", "max_iters", "n_embd", "n_layer", "optimizer")


def finish(s: Session, wall: float) -> dict:
    """The summary of the run: with "stopped" when a stop request came during the full validation."""
    run, progress, cfg = s.run, s.progress, s.cfg
    if s.d.is_main:
        s.keep_new_run()  # (a run of max_iters 0 has had no evaluation after step 0)
    model_step, model_file = s.hand_over_best()
    summary = {
        "config": cfg.config_name, "corpus": run.data_info["source"], "iterations": progress.it,
        "model_step": model_step, "model_checkpoint": model_file,
        "stopped_early": progress.it < cfg.max_iters,
        "train_loss": progress.last_eval.get("train"), "val_loss": progress.last_eval.get("val"),
        "best_val_loss": progress.best_val, "tokens_seen": progress.it * run.tokens_per_iter,
        "train_seconds": progress.train_seconds, "wall_seconds": wall,
        "tokens_per_sec": progress.it * run.tokens_per_iter / progress.train_seconds if progress.train_seconds > 0 else None,
        "device": run.rt.describe(), "processes": s.d.world_size,
    }
    if cfg.full_val:
        s.stop.ending = f"ending the final validation; step {progress.it} is saved already"
        task = s.log.task(f"full validation of step {model_step}'s model", run.batches.num_val_batches())
        with task as progress_bar, run.phases.timing("full validation"):
            loss = full_validation_loss(run.eval_model, run.batches, run.rt, s.d, s.stop, progress_bar)
        if loss is None:
            return {**summary, "stopped": True}
        summary["full_val_loss"], summary["full_val_bits_per_char"] = loss, loss / math.log(2)
    if s.d.is_main:
        # TensorBoard's HParams table sorts the settings by name and shows the first five: these five, so the
        # model's shape, learning rate, optimizer and steps are all in view, then the figures. The figures are
        # summary/ scalars at the final step, so their single dots come last in the Scalars tab, after loss.
        metrics = {"summary/full_val_loss": summary.get("full_val_loss"), "summary/best_val_loss": summary["best_val_loss"],
                   "summary/last_val_loss": summary["val_loss"]}
        s.log.hparams({name: getattr(cfg, name) for name in HPARAMS},
                      {tag: value for tag, value in metrics.items() if value is not None}, progress.it)
        s.log.close()
        summary["seconds"] = run.phases.report()
        summary["first_step_seconds"] = run.phases.first_step  # this session's first step, compilation not included
        write_text_atomic(s.run_dir.path / "summary.json", json.dumps(summary, indent=1) + "\n", "summary")
    return summary
