"""A training run in this process, as one object: the run (model, data, optimizer), where it is (progress), its
folder, its log, the stop request and the ranks; and what the loop asks of them besides a step: save, evaluate and
record, decide to stop early, hand over the best model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from configs import TrainConfig
from errors import UserError
from training import checkpoint
from training.build import Progress, Run, capture, plateaued
from training.distributed import Dist
from training.evaluation import evaluate
from training.log import Log
from training.report import attention_probe, record_evaluation
from training.run_dir import RunDir
from training.stop import StopRequest

if TYPE_CHECKING:
    from training.pictures import AttentionPictures  # matplotlib: imported only by runs that draw


@dataclass
class Session:
    run: Run
    progress: Progress
    run_dir: RunDir
    log: Log
    stop: StopRequest
    d: Dist
    pictures: AttentionPictures | None = None  # made at the first evaluation that draws

    @property
    def cfg(self) -> TrainConfig:
        return self.run.cfg

    def save(self, name: str) -> None:
        """A checkpoint of this moment (rank 0's work), written atomically."""
        with self.run.phases.timing("checkpoints"):
            checkpoint.save(capture(self.run, self.progress), self.run_dir.path / name)
        if name == checkpoint.LAST:
            self.stop.saved = f"the last checkpoint, {self.run_dir.path / name} (step {self.progress.it}), is intact"

    def evaluation_due(self) -> bool:
        it = self.progress.it
        return (it % self.cfg.eval_interval == 0 or it == self.cfg.max_iters) and not self.progress.eval_done

    def evaluate(self) -> dict[str, float] | None:
        """The quick estimate of both splits at this step; then (rank 0) the sample, the pictures and the checkpoints.
        None when a stop request came during it (resuming does it again: it reads batches of its own, so the training
        stream is where it was)."""
        run, progress, cfg = self.run, self.progress, self.cfg
        val_batches = min(cfg.eval_iters, run.batches.num_val_batches())  # a split that fits is read whole, once
        with self.log.task(f"evaluating at step {progress.it}", cfg.eval_iters + val_batches) as progress_bar, \
                run.phases.timing("evaluations"):
            losses = evaluate(run.eval_model, run.batches, run.rt, cfg.eval_iters, self.d, self.stop, progress_bar)
        if losses is None:
            return None
        improved = losses["val"] < progress.best_val
        progress.best_val, progress.last_eval, progress.eval_done = min(progress.best_val, losses["val"]), losses, True
        progress.evals_since_best = 0 if improved else progress.evals_since_best + 1
        if self.d.is_main:
            record_evaluation(run, progress, self.log, losses, self.attention_pictures(), self.stop)
            if improved:
                self.save(checkpoint.BEST)
            self.save(checkpoint.LAST)
            if progress.it > 0:
                self.keep_new_run()
        self.log.line(f"step {progress.it}: evaluation: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        return losses

    def keep_new_run(self) -> None:
        """--overwrite: the new run has something better to keep than its untrained start (an evaluation after step
        0, or its end), so the run it replaces, kept aside until now, is deleted; said once."""
        if self.run_dir.discard_aside():
            self.stop.ending = None  # a stop now saves this run, as usual
            self.log.say(f"--overwrite: the run this one replaces is deleted now (this run's step {self.progress.it} "
                         f"is saved in {self.run_dir.path})")

    def attention_pictures(self) -> AttentionPictures | None:
        """The run's attention pictures (laid out at the first evaluation, redrawn at each), or None without them."""
        if not self.cfg.log_attention:
            return None
        if self.pictures is None:
            from training.pictures import AttentionPictures  # matplotlib: only for runs that draw
            self.pictures = AttentionPictures(self.run.tokenizer.decode(attention_probe(self.run)))
        return self.pictures

    def plateaued(self) -> bool:
        return plateaued(self.progress.evals_since_best, self.cfg.patience)

    def hand_over_best(self) -> tuple[int, str]:
        """Put the weights of ckpt_best.pt, the lowest validation loss the run measured, into the model: the run's
        model, which the full validation measures and the scripts use. (step, file) of the model handed over."""
        self.d.barrier()  # rank 0 wrote the file; every rank reads it
        path = self.run_dir.path / checkpoint.BEST
        if not path.is_file():  # no evaluation gave a finite loss
            return self.progress.it, checkpoint.LAST
        try:
            state = checkpoint.load(path, self.run.rt.device)
            self.run.model.load_state_dict(state["model"])
        except (UserError, RuntimeError) as err:  # a UserError names the file; a RuntimeError (weights) does not
            what = str(err).splitlines()[0][:200] if isinstance(err, UserError) else f"{path}: {str(err).splitlines()[0][:150]}"
            self.log.say(f"warning: {what}; the run hands over its last model instead")
            return self.progress.it, checkpoint.LAST
        return state["iter"], checkpoint.BEST
