"""The training loop: epochs, evaluation, checkpoints, stop requests and metrics.

It calls only the :class:`~jobs.mnist.strategies.Strategy` interface, so it is the same loop
on one CPU and on many nodes, and it uses clustertrain's runtime library like any user script:
a stop request agreed at step boundaries, atomic checkpoints, and the requeue handshake.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from clustertrain import checkpoint, events, protocol, runtime
from clustertrain.errors import UserError

from . import data, model, recipes
from .config import Config
from .images import TEST_BATCH_SIZE, Images, whole_batch
from .strategies import Strategy


@dataclass
class EpochPosition:
    """One rank's way through an epoch: what a mid-epoch checkpoint adds to the model's state."""

    step: int
    loss_sum: torch.Tensor  # [sum of loss x images, images] over this rank's steps so far
    train_s: float = 0.0  # seconds in training steps, over every attempt
    epoch_s: float = 0.0  # wall seconds of this epoch in earlier attempts
    rng: dict[str, Any] | None = None  # restored once the steps already done are skipped


class Trainer:
    """One training run of ``config`` under ``strategy``, from scratch or from a checkpoint."""

    def __init__(
        self, config: Config, strategy: Strategy, phases: dict[str, float], raw: Path
    ) -> None:
        """``raw``: the verified MNIST folder (:func:`jobs.mnist.data.require_mnist`)."""
        self.config, self.s, self.phases, self.recipe = config, strategy, phases, config.plan
        self.batching = recipes.batching(
            self.recipe, strategy.world_size, config.batch_size, config.lr
        )
        self.train_set = Images(*data.load_split(raw, train=True, limit=config.limit_train))
        self.test_set = Images(*data.load_split(raw, train=False))
        phases["data_ready"] = time.time()
        runtime.milestone("data_ready", seconds=phases["data_ready"] - phases["process_start"])
        strategy.log(
            f"{config.strategy}: {strategy.world_size} process(es) on {strategy.device}, "
            f"{len(self.train_set)} training images, recipe {config.recipe}, global batch "
            f"{self.batching.global_batch} ({self.batching.per_process} per process), "
            f"lr {self.batching.lr:g}"
        )
        self.store = checkpoint.Store(config.out_dir / protocol.CHECKPOINTS_DIR)
        self.metrics_path = config.out_dir / protocol.METRICS_FILE
        self.key = self._resume_key()

    def _resume_key(self) -> dict[str, Any]:
        """What must match for a resumed run to continue exactly where the last one stopped."""
        wanted = ("recipe", "seed", "limit_train")
        key = {k: v for k, v in asdict(self.config).items() if k in wanted}
        key.update(batch_size=self.batching.per_process, lr=self.batching.lr)
        key["world_size"] = self.s.world_size
        if self.recipe.schedule_per_step:
            key["epochs"] = self.config.epochs  # the one-cycle schedule spans all of them
        return key

    def build(self) -> dict[str, Any] | None:
        """Model, optimizer, schedule and loaders, from the newest checkpoint if any."""
        s, config = self.s, self.config
        # One sampler for every strategy: reshuffled by (seed, epoch) only, so a resumed run
        # sees the same order. Accelerate shards its batches itself: a 1-replica sampler.
        replicas = s.sampler_replicas
        self.sampler: DistributedSampler[int] = DistributedSampler(
            self.train_set, replicas, s.rank % replicas, shuffle=True, seed=config.seed
        )
        train_loader: Any = DataLoader(
            self.train_set, self.batching.per_process, sampler=self.sampler, collate_fn=whole_batch
        )
        test_loader: Any = DataLoader(self.test_set, TEST_BATCH_SIZE, collate_fn=whole_batch)
        torch.manual_seed(config.seed)
        net = model.build(self.recipe.model).to(s.device)
        runtime.time_forward(net)  # this rank's own work, inside DDP: the stragglers' measure
        state = self.store.load_newest(s.log) if config.resume else None
        if state is not None and state["key"] != self.key:
            raise UserError(
                f"the checkpoint in {self.store.directory} was written by another setup "
                f"({state['key']}), not ({self.key}); pass --no-resume or another --out-dir"
            )
        if state is None and s.is_main:
            self.store.clear()
        if state is not None:
            net.load_state_dict(state["model"])
        steps_per_epoch = -(-len(self.train_set) // self.batching.global_batch)
        optimizer, scheduler = recipes.build_training(
            self.recipe, self.batching.lr, config.epochs, net, steps_per_epoch
        )
        if state is not None:
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        self.model, self.optimizer, self.train_loader, self.test_loader, self.scheduler = s.prepare(
            net, optimizer, train_loader, test_loader, scheduler
        )
        return state

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> Any:
        return recipes.loss(self.recipe, logits, labels, reduction)

    def evaluate(self) -> tuple[float, float]:
        """Loss and accuracy over every test image exactly once, identical on every rank."""
        self.model.eval()
        with torch.no_grad():
            totals = self.s.test_totals(self.model, self.test_set, self.test_loader, self.loss)
        loss_sum, correct, count = totals.tolist()
        if int(count) != len(self.test_set):
            raise RuntimeError(
                f"evaluated {int(count)} test images instead of {len(self.test_set)}"
            )
        return loss_sum / count, correct / count

    def run(self) -> dict[str, Any]:
        """Every epoch from where the checkpoint left off; the final record or a stop record."""
        state = self.build()
        start_epoch, resume_at = self._resume(state)
        # The checkpoint carries the metrics so far: metrics.jsonl is rewritten from it on
        # resume, so a kill between the checkpoint and the metrics line can neither lose nor
        # repeat one.
        self.history: list[dict[str, Any]] = state["history"] if state is not None else []
        self.time_to_target = state["time_to_target_s"] if state is not None else None
        if self.s.is_main:
            self.config.out_dir.mkdir(parents=True, exist_ok=True)
            self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in self.history))
        for epoch in range(start_epoch, self.config.epochs + 1):
            epoch_start = time.time()
            self.s.set_epoch(self.sampler, self.train_loader, epoch)
            at, total = self.train_epoch(epoch, resume_at)
            resume_at = None
            if at.step < total:
                return self._stop_mid_epoch(epoch, at, at.epoch_s + time.time() - epoch_start)
            record, saved = self._end_epoch(epoch, at, epoch_start)
            target = self.config.target_acc
            if target is not None and record["test_acc"] >= target:
                self.s.log(f"reached --target-acc {target:.2%}; stopping")
                break
            if epoch < self.config.epochs and self.s.stop_agreed():
                return self._stopped(f"after epoch {epoch}", f"{saved}")
        return self._done()

    def _resume(self, state: dict[str, Any] | None) -> tuple[int, EpochPosition | None]:
        if state is None:
            return 1, None
        s, where = self.s, self.store.directory
        if state["step"] is None:
            # Restored after building and preparing, which may draw from the RNG: the first
            # attempt drew the same before its first epoch.
            checkpoint.restore_rng(state["ranks"][s.rank]["rng"])
            s.log(f"resuming at epoch {state['epoch'] + 1} from {where}")
            return state["epoch"] + 1, None
        mine = state["ranks"][s.rank]
        s.log(f"resuming at epoch {state['epoch']} step {state['step'] + 1} from {where}")
        loss_sum = mine["loss_sum"].to(s.device)
        return state["epoch"], EpochPosition(
            state["step"], loss_sum, mine["train_s"], state["epoch_s"], mine["rng"]
        )

    def _training_state(self, ranks: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "key": self.key,
            "history": self.history,
            "time_to_target_s": self.time_to_target,
            "ranks": ranks,
            "model": self.s.unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def _stop_mid_epoch(self, epoch: int, at: EpochPosition, epoch_s: float) -> dict[str, Any]:
        """Stopped inside the epoch: every rank's running sums and RNG go into the checkpoint."""
        mine = {"rng": checkpoint.rng_state(), "loss_sum": at.loss_sum.cpu(), "train_s": at.train_s}
        ranks = self.s.gather(mine)
        saved, write_s = None, 0.0
        if self.s.is_main:
            mid = {"epoch": epoch, "step": at.step, "epoch_s": epoch_s}
            write_s = time.time()
            saved = self.store.save(epoch, {**mid, **self._training_state(ranks)}, step=at.step)
            write_s = time.time() - write_s
            events.record("checkpoint", epoch=epoch, step=at.step, seconds=write_s)
        where = f"at epoch {epoch} step {at.step}/{len(self.train_loader)}"
        return self._stopped(where, f"{saved} written in {write_s:.2f} s")

    def _end_epoch(
        self, epoch: int, at: EpochPosition, epoch_start: float
    ) -> tuple[dict[str, Any], Path | None]:
        """Evaluate, checkpoint and record a finished epoch."""
        self.s.all_reduce(at.loss_sum)
        train_loss, images = float(at.loss_sum[0] / at.loss_sum[1]), int(at.loss_sum[1])
        if not self.recipe.schedule_per_step:
            self.scheduler.step()
        test_loss, test_acc = self.evaluate()
        now = time.time()
        if test_acc >= self.target and self.time_to_target is None:
            self.time_to_target = now - self.phases["process_start"]
        record = {
            "epoch": epoch,
            "train_loss": train_loss,
            "test_loss": test_loss,
            "test_acc": test_acc,
            "images_per_s": images / at.train_s,
            "epoch_s": at.epoch_s + now - epoch_start,
            "world_size": self.s.world_size,
            "strategy": self.config.strategy,
        }
        self.history.append(record)
        ranks = self.s.gather({"rng": checkpoint.rng_state()})
        saved = None
        if self.s.is_main:
            end = {"epoch": epoch, "step": None}
            written = time.time()
            saved = self.store.save(epoch, {**end, **self._training_state(ranks)})
            events.record("checkpoint", epoch=epoch, seconds=time.time() - written)
            _append_json(self.metrics_path, record)
            events.record(
                "epoch", epoch=epoch, epochs=self.config.epochs, step=epoch * at.step,
                steps=at.step, loss=train_loss, test_loss=test_loss, test_acc=test_acc,
            )  # fmt: skip
            runtime.log_metrics(
                epoch * at.step, epoch=epoch, train_loss=train_loss, test_loss=test_loss,
                test_acc=test_acc, images_per_s=record["images_per_s"],
                world_size=self.s.world_size,
            )  # fmt: skip
        self.s.log(
            f"epoch {epoch}/{self.config.epochs}: train_loss {train_loss:.4f} test_loss "
            f"{test_loss:.4f} test_acc {test_acc:.2%} {record['images_per_s']:.0f} img/s "
            f"{record['epoch_s']:.1f} s"
        )
        return record, saved

    @property
    def target(self) -> float:
        """The accuracy whose first crossing is reported as time to target (default 99 %)."""
        return self.config.target_acc if self.config.target_acc is not None else 0.99

    def _done(self) -> dict[str, Any]:
        self.phases["end"] = time.time()
        done = {
            "event": "done",
            "test_acc": self.history[-1]["test_acc"] if self.history else None,
            "target_acc": self.target,
            "time_to_target_s": self.time_to_target,
            "world_size": self.s.world_size,
            "strategy": self.config.strategy,
            "global_batch": self.batching.global_batch,
            "phases": self.phases,
        }
        if self.s.is_main:
            _append_json(self.metrics_path, done)
        return done

    def _stopped(self, where: str, saved: str) -> dict[str, Any]:
        """After a stop request: rank 0 has checkpointed; it asks the batch script for a
        requeue. The barrier keeps every rank alive until the checkpoint is durable."""
        if self.s.is_main:
            requeue = runtime.request_requeue()
            # The signal may have reached another rank only (they agree at every step boundary).
            why = self.s.stop.received or "a signal to another rank"
            then = f"requeue requested ({requeue})" if requeue else "start it again to resume"
            self.s.log(f"stopping on {why} {where}: checkpoint {saved}; {then}")
            events.record("stop", why=why)
        self.s.barrier()
        return {
            "event": "stopped",
            "where": where,
            "checkpoint": saved,
            "world_size": self.s.world_size,
            "strategy": self.config.strategy,
        }

    def train_epoch(self, epoch: int, resume_at: EpochPosition | None) -> tuple[EpochPosition, int]:
        """One pass, or its rest after ``resume_at``, until its end or a stop all ranks agreed
        on. Returns where this rank stopped and the number of steps in the epoch."""
        s, config = self.s, self.config
        self.model.train()
        total = len(self.train_loader)
        at = resume_at or EpochPosition(0, torch.zeros(2, dtype=torch.float64, device=s.device))
        bar = _progress(s, total, epoch, config, at.step)
        # Starting the iterator draws from the RNG as in an uninterrupted epoch; the batches
        # already done are then read and dropped (the sampler's order depends on seed and epoch
        # only), and only then are the RNG states restored. Reading is cheap for in-memory
        # MNIST; a dataset with costly decoding would skip the indices in its sampler instead.
        batches: Iterator[Any] = iter(self.train_loader)
        for _ in range(at.step):
            next(batches)
        if at.rng is not None:
            checkpoint.restore_rng(at.rng)
        start = time.time()
        for step, batch in enumerate(batches, at.step + 1):
            x, y = s.to_device(*batch)
            loss = self.loss(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            s.backward(loss)
            self.optimizer.step()
            if self.recipe.schedule_per_step:
                self.scheduler.step()
            self.phases.setdefault("first_step", time.time())
            count = torch.tensor(len(y), dtype=torch.float64, device=s.device)
            at.loss_sum += torch.stack([loss.detach().double() * len(y), count])
            at.step = step
            runtime.heartbeat((epoch - 1) * total + step, samples=len(y))
            if bar is not None:
                bar.update()
            elif s.is_main and (step % config.log_every == 0 or step == total):
                rate = int(at.loss_sum[1]) * s.world_size / (at.train_s + time.time() - start)
                events.record(
                    "step", epoch=epoch, step=(epoch - 1) * total + step, steps=total,
                    epochs=config.epochs, loss=loss.item(),
                )  # fmt: skip
                print(
                    f"epoch {epoch}/{config.epochs} step {step}/{total} loss {loss.item():.4f} "
                    f"{rate:.0f} img/s",
                    flush=True,
                )
            # At the last step the epoch finishes first: its own checkpoint serves.
            if step < total and s.stop_agreed():
                break
        at.train_s += time.time() - start
        if bar is not None:
            bar.close()
        return at, total


def _progress(s: Strategy, total: int, epoch: int, config: Config, done: int) -> Any:
    if s.is_main and sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=done, desc=f"epoch {epoch}/{config.epochs}", leave=False)
    return None


def _append_json(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
