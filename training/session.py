"""The training run in this process (Session): evaluating, saving, the clock, the end of a finished run."""
from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from dataclasses import dataclass

import torch

from common.machine import for_sampling
from common.run_folder import ASIDE, BEST, LAST, LOSS_PICTURE, SUMMARY, RunDir, WriteFailed, write_text_atomic
from configs import TrainConfig
from errors import UserError
from model.attention import attention_weights
from model.generate import generate
from training import checkpoint
from training.checkpoint import Progress
from training.device import Dist, SlowdownWatch
from training.evaluation import began_overfitting, evaluate, full_validation_loss
from training.opening import Run
from training.report import Log, TrainClock, overfitting_line, resume_command, stopped_line
from training.stop import StopRequest


SAMPLE_TIMED_CHARS = 16  # the sample characters the estimate times


@dataclass
class Session:
    run: Run
    progress: Progress
    run_dir: RunDir
    log: Log
    stop: StopRequest
    d: Dist
    clock: TrainClock | None = None
    pictures: object = None  # common.pictures.AttentionPictures, made when first needed
    watch: SlowdownWatch | None = None  # rank 0 on a CPU
    saved: bool = False  # whether this process has written a checkpoint

    @property
    def cfg(self) -> TrainConfig:
        return self.run.cfg

    def start_clock(self) -> TrainClock:
        self.clock = TrainClock(self.progress.it, self.progress.train_seconds, self.run.rt.device, self.run.phases)
        return self.clock

    def pause_clock(self) -> None:
        self.progress.train_seconds = self.clock.pause()

    def evaluate(self) -> dict[str, float] | None:
        """Both splits' loss; rank 0 records it and saves. None if a stop came."""
        run, progress, cfg = self.run, self.progress, self.cfg
        batches = run.batches.num_evaluation_batches(cfg.eval_iters)  # on each rank
        with self.log.task(f"evaluating at step {progress.it}", batches) as progress_bar, \
                run.phases.timing("evaluations"):
            losses = evaluate(run.eval_model, run.batches, run.rt, cfg.eval_iters, self.d, self.asked_to_stop,
                              progress_bar)
        if losses is None:
            return None
        improved = losses["val"] < progress.best_val
        progress.best_val, progress.last_eval, progress.eval_done = min(progress.best_val, losses["val"]), losses, True
        progress.evals_since_best = 0 if improved else progress.evals_since_best + 1
        progress.losses["eval"].append((progress.it, losses["train"], losses["val"]))
        if began_overfitting(progress.losses["eval"]):
            self.log.say(overfitting_line(progress.losses["eval"]))
        if self.d.is_main:
            self.record(losses)
            if improved:
                self.save(BEST)
            self.save(LAST)
            if progress.it > 0:
                self.keep_new_run()
        self.log.line(f"step {progress.it}: evaluation: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        return losses

    def slowdown_watch(self) -> SlowdownWatch | None:
        threads = self.run.threads
        if threads is None or not threads.steady or not self.d.is_main:
            return None
        self.watch = SlowdownWatch(statistics.median(threads.steady), threads.count, resume_command(self.run_dir.path))
        return self.watch

    def asked_to_stop(self) -> bool:
        return self.stop.requested

    def save(self, name: str) -> None:
        """Rank 0: checkpoint `name`; on failure an --overwrite's old run is put back."""
        try:
            with self.run.phases.timing("checkpoints"):
                checkpoint.save(checkpoint.capture(self.run, self.progress), self.run_dir.path / name)
        except WriteFailed as err:
            if self.run_dir.aside_pending():
                raise UserError(err.line(self.put_back())) from None
            best, last = self.run_dir.path / BEST, self.run_dir.path / LAST
            if name == LAST and best.is_file() and not last.exists():
                raise UserError(err.line(f"only {best} was written")) from None
            raise
        self.saved = True
        if name == LAST:
            self.stop.saved = f"the last checkpoint, {self.run_dir.path / name} (step {self.progress.it}), is intact"
            self.stop.resume = resume_command(self.run_dir.path)

    def save_stopped(self) -> bool:
        """Rank 0 saves ckpt_last, or puts back an --overwrite's old run (True)."""
        if not self.d.is_main:
            return False
        if not self.run_dir.aside_pending():
            self.save(LAST)
            return False
        self.log.say(f"stopped at step {self.progress.it}, before this run's first evaluation after step 0: "
                     f"{self.put_back()}")
        return True

    def say_stopped(self, in_final_validation: bool) -> None:
        self.draw_losses()
        advice = self.watch.advice if self.watch else ""
        self.log.say(stopped_line(self.progress.it, self.run_dir.path, in_final_validation, advice))

    def put_back(self) -> str:
        """An --overwrite's old run put back: the words that say so, or where it waits."""
        with contextlib.suppress(UserError):  # the log's event file moves apart with this run's files
            self.log.close()
        try:
            kept = self.run_dir.put_back()
        except UserError as why:
            return (f"the run --overwrite was replacing waits in {self.run_dir.path / ASIDE}, untouched, and the next "
                    f"run in this folder puts it back ({why})")
        apart = f"; this run's files are kept apart in {kept}" if kept else "; this run is discarded"
        return f"the run --overwrite was replacing is back in {self.run_dir.path}, as it was{apart}"

    def keep_new_run(self) -> None:
        if self.run_dir.keep_new_run(self.log.say, self.progress.it):
            self.stop.ending = None

    def record(self, losses: dict) -> None:
        run, cfg, it = self.run, self.cfg, self.progress.it
        self.log.evaluation(it, losses)
        with run.phases.timing("samples and pictures"):
            if cfg.sample_chars and (text := self.sample(cfg.sample_chars)) is not None:
                self.log.sample(it, text)
            if cfg.log_attention:
                for layer, weights in enumerate(self.attention_weights()):
                    self.log.attention(it, layer, self.pictures.render(weights, layer))

    def sample(self, chars: int) -> str | None:
        """chars characters from the default prompt, seeded with --seed; None if a stop came."""
        run = self.run
        prompt = run.tokenizer.encode(run.tokenizer.default_prompt(run.data_info["first_char"]))
        generator = torch.Generator(device=run.rt.device).manual_seed(self.cfg.seed)
        run.model.eval()

        def stop_if_asked(tokens: torch.Tensor) -> None:
            if self.stop.requested:
                raise SampleStopped

        try:
            with for_sampling(run.rt, self.cfg.dtype).autocast():
                text = generate(run.model, [prompt], chars, generator=generator, on_tokens=stop_if_asked)
            return run.tokenizer.decode(text[0])
        except SampleStopped:
            return None
        finally:
            run.model.train()

    def attention_weights(self) -> list[torch.Tensor]:
        from common.pictures import AttentionPictures  # matplotlib only where needed
        probe = attention_probe(self.run)
        if self.pictures is None:
            self.pictures = AttentionPictures(self.run.tokenizer.decode(probe))
        return attention_weights(self.run.model, probe)

    def record_seconds(self) -> float:
        """For the estimate: an evaluation's seconds of sample and pictures, timed on a part."""
        cfg, seconds = self.cfg, 0.0
        if cfg.sample_chars:
            chars = min(cfg.sample_chars, SAMPLE_TIMED_CHARS)
            start = time.perf_counter()
            self.sample(chars)
            seconds += (time.perf_counter() - start) * cfg.sample_chars / chars
        weights = self.attention_weights() if cfg.log_attention else []
        if weights:
            self.pictures.lay_out(weights[0], 0)
            start = time.perf_counter()
            picture = self.pictures.render(weights[0], 0)
            seconds += (time.perf_counter() - start + self.log.picture_seconds(picture)) * len(weights)
        return seconds

    def draw_losses(self) -> None:
        losses = self.progress.losses
        if not self.d.is_main or not (losses["train"] or losses["eval"]):
            return
        from common.pictures import save_loss_picture
        path = self.run_dir.path / LOSS_PICTURE
        title = f"{self.run_dir.path.resolve().name}: {self.cfg.config_name} preset, step {self.progress.it}"
        with self.run.phases.timing("samples and pictures"):
            save_loss_picture(path, losses, title)
        self.log.say(f"the losses, every point as logged: {path}")

    def hand_over_best(self) -> tuple[int, str]:
        """ckpt_best into the model: (step, file) of the model handed over."""
        self.d.barrier()  # rank 0 wrote the file; every rank reads it
        path = self.run_dir.path / BEST
        if not path.is_file():  # no finite loss was evaluated
            return self.progress.it, LAST
        try:
            state = checkpoint.load(path, self.run.rt.device)
            self.run.model.load_state_dict(state["model"])
        except (UserError, RuntimeError) as err:
            first = str(err).splitlines()[0]
            what = first[:200] if isinstance(err, UserError) else f"{path}: {first[:150]}"
            self.log.say(f"warning: {what}; the run hands over its last model instead")
            return self.progress.it, LAST
        return state["iter"], BEST

    def finish(self, wall: float) -> dict:
        """The best model handed over and fully validated, and summary.json."""
        run, progress, cfg = self.run, self.progress, self.cfg
        if self.d.is_main:
            self.keep_new_run()  # a run of max_iters 0 has had no evaluation after step 0
            if not self.saved:  # ckpt_last holds the settings the run ended with
                self.save(LAST)
        model_step, model_file = self.hand_over_best()
        trained = progress.train_seconds
        summary = {
            "config": cfg.config_name, "corpus": run.data_info["source"], "iterations": progress.it,
            "model_step": model_step, "model_checkpoint": model_file,
            "stopped_early": progress.it < cfg.max_iters,
            "train_loss": progress.last_eval.get("train"), "val_loss": progress.last_eval.get("val"),
            "best_val_loss": progress.best_val, "tokens_seen": progress.it * run.tokens_per_iter,
            "train_seconds": trained, "wall_seconds": wall,
            "tokens_per_sec": progress.it * run.tokens_per_iter / trained if trained > 0 else None,
            "device": run.rt.describe(), "processes": self.d.world_size,
        }
        if run.threads is not None:
            summary["threads"] = run.threads.count
        if cfg.full_val:
            self.stop.ending = f"ending the final validation; step {progress.it} is saved already"
            task = self.log.task(f"full validation of step {model_step}'s model", run.batches.num_val_batches())
            with task as progress_bar, run.phases.timing("full validation"):
                loss = full_validation_loss(run.eval_model, run.batches, run.rt, self.d, self.asked_to_stop,
                                            progress_bar)
            if loss is None:
                return {**summary, "stopped": True}
            summary["full_val_loss"], summary["full_val_bits_per_char"] = loss, loss / math.log(2)
        if self.d.is_main:
            self.log.final(cfg, summary, progress.it)
            self.log.close()
            summary["seconds"] = run.phases.report()
            summary["first_step_seconds"] = run.phases.first_step
            if run.phases.expected is not None:
                summary["expected_seconds"] = list(run.phases.expected)
            write_text_atomic(self.run_dir.path / SUMMARY, json.dumps(summary, indent=1) + "\n", "summary")
        return summary


class SampleStopped(Exception):
    pass


def attention_probe(run: Run) -> list[int]:
    """The text whose attention is pictured."""
    return [int(t) for t in run.batches.data["val"][: min(run.cfg.block_size, 48)]]
