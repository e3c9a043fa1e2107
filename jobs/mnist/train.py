"""Train MNIST with plain PyTorch, DDP or Accelerate; the same file on one CPU or many nodes.

Examples:
  python jobs/mnist/train.py --recipe fast --out-dir out
  torchrun --standalone --nproc-per-node 2 jobs/mnist/train.py --strategy ddp
  accelerate launch --multi_gpu --num_processes 2 jobs/mnist/train.py --strategy accelerate
In a notebook:
  notebook_launcher(train.train, (train.parse_args(["--strategy", "accelerate"]),),
                    num_processes=2)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from clustertrain import checkpoint, runtime
from clustertrain import env as dist_env
from clustertrain.errors import UserError

# Run as a script, the siblings are found beside this file, before any same-named module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import data as mnist  # noqa: E402
import model as mnist_model  # noqa: E402

# Values each recipe starts from; flags override them.
RECIPES: dict[str, dict[str, Any]] = {
    # pytorch/examples mnist/main.py.
    "reference": {"model": "classic", "epochs": 14, "batch_size": 64, "lr": 1.0},
    # Strided conv+BN net, SGD+Nesterov, one-cycle, label smoothing: 99 % in 1-2 epochs.
    "fast": {"model": "lean", "epochs": 2, "batch_size": 128, "lr": 0.2},
}
TEST_BATCH_SIZE = 1000


@dataclass(frozen=True)
class Config:
    strategy: str = "single"
    recipe: str = "reference"
    epochs: int = 14
    batch_size: int = 64
    lr: float = 1.0
    seed: int = 1
    target_acc: float | None = None
    limit_train: int | None = None
    data_dir: Path = mnist.default_data_dir()
    out_dir: Path = Path("out")
    resume: bool = True
    log_every: int = 100

    @property
    def model(self) -> str:
        return str(RECIPES[self.recipe]["model"])


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> Config:
    parser = _Parser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--strategy",
        choices=["single", "ddp", "accelerate"],
        help="default: ddp when a launcher started several processes, else single",
    )
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="reference")
    parser.add_argument("--epochs", type=_positive(int), help="default: the recipe's")
    parser.add_argument("--batch-size", type=_positive(int), help="per process")
    parser.add_argument("--lr", type=_positive(float), help="peak learning rate")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--target-acc", type=_fraction, help="stop once the test accuracy (0..1) reaches it"
    )
    parser.add_argument(
        "--limit-train", type=_positive(int), metavar="N", help="train on the first N images only"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=mnist.default_data_dir(),
        help="default: $CLUSTERTRAIN_DATA_DIR or ~/.cache/clustertrain/mnist",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path(os.environ.get("CLUSTERTRAIN_OUT_DIR", "out")),
        help="default: $CLUSTERTRAIN_OUT_DIR (set in clustertrain jobs) or ./out",
    )
    parser.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="continue from the newest checkpoint in --out-dir (default)",
    )
    parser.add_argument(
        "--log-every",
        type=_positive(int),
        default=100,
        metavar="N",
        help="steps between progress lines when stderr is not a terminal",
    )
    args = vars(parser.parse_args(argv))
    if args["strategy"] is None:
        args["strategy"] = "ddp" if dist_env.from_environ().world_size > 1 else "single"
    recipe = RECIPES[args["recipe"]]
    for key in ("epochs", "batch_size", "lr"):
        if args[key] is None:
            args[key] = recipe[key]
    return Config(**args)


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"is a fraction in (0, 1], got {text} (99 %% is 0.99)")
    return value


class Images(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """uint8 images and labels; a whole batch is indexed and normalised in one operation."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices)
        x = self.images[idx].float().div_(255).sub_(mnist.MEAN).div_(mnist.STD)
        return x, self.labels[idx]


def _whole_batch(batch: Any) -> Any:
    """The DataLoader's collate_fn: __getitems__ already returns the batch."""
    return batch


class _RankPrefixed:
    """A text stream that starts every line with ``[rank N] ``."""

    def __init__(self, stream: IO[str], rank: int) -> None:
        self._stream, self._prefix, self._at_line_start = stream, f"[rank {rank}] ", True

    def write(self, text: str) -> int:
        out = []
        for line in text.splitlines(keepends=True):
            out.append(self._prefix + line if self._at_line_start else line)
            self._at_line_start = line.endswith("\n")
        self._stream.write("".join(out))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@dataclass
class Runtime:
    """What the training loop needs to know about the strategy it runs under."""

    strategy: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    accelerator: Any = None
    stop: runtime.StopRequest = field(default_factory=runtime.StopRequest)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.strategy != "single" and torch.distributed.is_initialized()

    def log(self, message: str) -> None:
        if self.is_main:
            print(message, flush=True)

    def stop_agreed(self) -> bool:
        return self.stop.agreed(self.device) if self.distributed else self.stop.received is not None


def start_runtime(config: Config, launched: dist_env.DistEnv) -> Runtime:
    if config.strategy == "single":
        if launched.world_size > 1:
            raise UserError(
                f"--strategy single, but launched as {launched.describe()}; "
                "use --strategy ddp or accelerate, or start one process"
            )
        rt = Runtime("single", 0, 0, 1, 1, dist_env.pick_device(launched))
    elif config.strategy == "ddp":
        device = dist_env.pick_device(launched)
        dist_env.init_process_group(launched, device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        rt = Runtime(
            "ddp",
            launched.rank,
            launched.local_rank,
            torch.distributed.get_world_size(),
            launched.local_world_size,
            device,
        )
    else:
        from accelerate import Accelerator

        # Without cpu=True on a host without CUDA, `accelerate launch --multi_gpu` starts
        # unsynchronised single-process copies (seen with Accelerate 1.16).
        accelerator = Accelerator(
            cpu=not torch.cuda.is_available(), step_scheduler_with_optimizer=False
        )
        rt = Runtime(
            "accelerate",
            accelerator.process_index,
            accelerator.local_process_index,
            accelerator.num_processes,
            launched.local_world_size,
            accelerator.device,
            accelerator,
        )
    if rt.world_size != launched.world_size:
        raise UserError(
            f"--strategy {config.strategy} formed a world of {rt.world_size} process(es), "
            f"but the launcher started {launched.world_size}: {launched.describe()}"
        )
    if rt.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cpus = len(os.sched_getaffinity(0))
        torch.set_num_threads(max(1, cpus // max(1, launched.local_world_size)))
    return rt


def build_training(
    config: Config, model: nn.Module, steps_per_epoch: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    if config.recipe == "reference":
        optimizer: torch.optim.Optimizer = torch.optim.Adadelta(model.parameters(), lr=config.lr)
        scheduler: torch.optim.lr_scheduler.LRScheduler = torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=1, gamma=0.7
        )
    else:
        optimizer = torch.optim.SGD(
            model.parameters(), lr=config.lr, momentum=0.9, nesterov=True, weight_decay=5e-4
        )
        # OneCycleLR divides by zero when its warm-up is under one step (tiny --limit-train runs).
        total_steps = max(config.epochs * steps_per_epoch, 8)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=config.lr, total_steps=total_steps, pct_start=0.25
        )
    return optimizer, scheduler


def _schedule_per_step(config: Config) -> bool:
    return config.recipe == "fast"


def _loss(
    config: Config, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    smoothing = 0.1 if config.recipe == "fast" else 0.0
    return F.cross_entropy(logits, labels, label_smoothing=smoothing, reduction=reduction)


def evaluate(
    config: Config, rt: Runtime, model: nn.Module, test: Images, loader: Any
) -> tuple[float, float]:
    """Loss and accuracy over every test image exactly once, identical on every rank."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=rt.device)
    with torch.no_grad():
        if rt.strategy == "accelerate":
            # gather_for_metrics drops the samples that even_batches duplicated as padding.
            for x, y in loader:
                logits = model(x)
                losses, correct = rt.accelerator.gather_for_metrics(
                    (_loss(config, logits, y, "none"), logits.argmax(1) == y)
                )
                count = torch.tensor(len(losses), dtype=torch.float64, device=rt.device)
                totals += torch.stack([losses.double().sum(), correct.double().sum(), count])
        else:
            # Rank r takes images r, r+W, r+2W...: a partition, so no image is padded or repeated.
            # The bare module: DDP's forward would broadcast buffers, a collective, per batch,
            # and ranks may differ by one batch here.
            model = _unwrap(rt, model)
            shard = torch.arange(rt.rank, len(test), rt.world_size)
            for start in range(0, len(shard), TEST_BATCH_SIZE):
                x, y = test.__getitems__(shard[start : start + TEST_BATCH_SIZE].tolist())
                x, y = x.to(rt.device), y.to(rt.device)
                logits = model(x)
                totals += torch.stack(
                    [
                        _loss(config, logits, y, "sum").double(),
                        (logits.argmax(1) == y).sum().double(),
                        torch.tensor(len(y), dtype=torch.float64, device=rt.device),
                    ]
                )
            if rt.distributed:
                torch.distributed.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    if int(count) != len(test):
        raise RuntimeError(f"evaluated {int(count)} test images instead of {len(test)}")
    return loss_sum / count, correct / count


def _progress(rt: Runtime, total: int, epoch: int, config: Config, done: int) -> Any:
    if rt.is_main and sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=done, desc=f"epoch {epoch}/{config.epochs}", leave=False)
    return None


def train(config: Config, started_at: float | None = None) -> dict[str, Any]:
    """Train as ``config`` says; returns the final metrics record (the same on every rank)."""
    phases = {"process_start": started_at if started_at is not None else time.time()}
    launched = dist_env.from_environ()
    saved_streams = sys.stdout, sys.stderr
    # torchrun and accelerate already prefix each line when clustertrain's job sets this.
    if launched.rank != 0 and "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" not in os.environ:
        sys.stdout = _RankPrefixed(sys.stdout, launched.rank)  # type: ignore[assignment]
        sys.stderr = _RankPrefixed(sys.stderr, launched.rank)  # type: ignore[assignment]
    rt = None
    stop = runtime.StopRequest.install()
    try:
        rt = start_runtime(config, launched)
        rt.stop = stop
        phases["process_group_ready"] = time.time()
        # One line from every rank, so a job's log shows where each one landed.
        print(
            f"rank {rt.rank}/{rt.world_size} (local {rt.local_rank}) on "
            f"{os.environ.get('SLURMD_NODENAME') or os.uname().nodename}: {rt.device}",
            flush=True,
        )
        result = _train(config, rt, phases)
        runtime.teardown(rt.accelerator)
        return result
    finally:
        stop.uninstall()
        sys.stdout, sys.stderr = saved_streams
        # After a failure, without the barrier: the peers may be gone.
        dist_env.destroy_process_group()


def _train(config: Config, rt: Runtime, phases: dict[str, float]) -> dict[str, Any]:
    raw = mnist.ensure_mnist(config.data_dir, log=rt.log)
    train_set = Images(*mnist.load_split(raw, train=True, limit=config.limit_train))
    test_set = Images(*mnist.load_split(raw, train=False))
    phases["data_ready"] = time.time()
    rt.log(
        f"{config.strategy}: {rt.world_size} process(es) on {rt.device}, "
        f"{len(train_set)} training images, recipe {config.recipe}"
    )

    # One sampler for every strategy: reshuffled by (seed, epoch) only, so a resumed run sees
    # the same order. Accelerate shards its batches itself, so it gets a 1-replica sampler.
    replicas = rt.world_size if rt.strategy == "ddp" else 1
    sampler: DistributedSampler[int] = DistributedSampler(
        train_set, num_replicas=replicas, rank=rt.rank % replicas, shuffle=True, seed=config.seed
    )
    train_loader: Any = DataLoader(
        train_set, batch_size=config.batch_size, sampler=sampler, collate_fn=_whole_batch
    )
    test_loader: Any = DataLoader(test_set, batch_size=TEST_BATCH_SIZE, collate_fn=_whole_batch)

    torch.manual_seed(config.seed)
    model: nn.Module = mnist_model.build(config.model).to(rt.device)
    steps_per_epoch = -(-len(train_set) // (config.batch_size * rt.world_size))
    store = checkpoint.Store(config.out_dir / "checkpoints")
    key = _resume_key(config, rt)
    state = store.load_newest(rt.log) if config.resume else None
    if state is not None and state["key"] != key:
        raise UserError(
            f"the checkpoint in {store.directory} was written by another setup ({state['key']}), "
            f"not ({key}); pass --no-resume or another --out-dir"
        )
    if state is None and rt.is_main:
        store.clear()
    if state is not None:
        model.load_state_dict(state["model"])

    if rt.strategy == "ddp":
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None
        )
    optimizer, scheduler = build_training(config, model, steps_per_epoch)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    if rt.strategy == "accelerate":
        model, optimizer, train_loader, test_loader, scheduler = rt.accelerator.prepare(
            model, optimizer, train_loader, test_loader, scheduler
        )
    start_epoch, resume_at = 1, None
    if state is not None and state["step"] is None:
        start_epoch = state["epoch"] + 1
        # Restored after building and preparing, which may draw from the RNG: the first attempt
        # drew the same before its first epoch.
        checkpoint.restore_rng(state["ranks"][rt.rank]["rng"])
        rt.log(f"resuming at epoch {start_epoch} from {store.directory}")
    elif state is not None:
        start_epoch, mine = state["epoch"], state["ranks"][rt.rank]
        resume_at = EpochPosition(
            state["step"],
            mine["loss_sum"].to(rt.device),
            mine["train_s"],
            state["epoch_s"],
            mine["rng"],
        )
        rt.log(f"resuming at epoch {start_epoch} step {state['step'] + 1} from {store.directory}")

    # The checkpoint carries the metrics so far: metrics.jsonl is rewritten from it on resume,
    # so a kill between the checkpoint and the metrics line can neither lose nor repeat one.
    history: list[dict[str, Any]] = state["history"] if state is not None else []
    metrics_path = config.out_dir / "metrics.jsonl"
    if rt.is_main:
        config.out_dir.mkdir(parents=True, exist_ok=True)
        metrics_path.write_text("".join(json.dumps(r) + "\n" for r in history))
    target = config.target_acc if config.target_acc is not None else 0.99
    time_to_target: float | None = state["time_to_target_s"] if state is not None else None
    test_acc = history[-1]["test_acc"] if history else None

    def training_state(ranks: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "key": key,
            "history": history,
            "time_to_target_s": time_to_target,
            "ranks": ranks,
            "model": _unwrap(rt, model).state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        }

    for epoch in range(start_epoch, config.epochs + 1):
        epoch_start = time.time()
        (train_loader if rt.strategy == "accelerate" else sampler).set_epoch(epoch)
        at, total = _train_epoch(
            config, rt, model, optimizer, scheduler, train_loader, epoch, phases, resume_at
        )
        resume_at = None
        epoch_s = at.epoch_s + time.time() - epoch_start
        if at.step < total:
            # Stopped inside the epoch: every rank's running sums and RNG go into the checkpoint.
            ranks = checkpoint.gather(
                {
                    "rng": checkpoint.rng_state(),
                    "loss_sum": at.loss_sum.cpu(),
                    "train_s": at.train_s,
                },
                rt.distributed,
                rt.world_size,
            )
            saved, write_s = None, 0.0
            if rt.is_main:
                mid = {"epoch": epoch, "step": at.step, "epoch_s": epoch_s}
                write_s = time.time()
                saved = store.save(epoch, {**mid, **training_state(ranks)}, step=at.step)
                write_s = time.time() - write_s
            where = f"at epoch {epoch} step {at.step}/{total}"
            return _stopped(config, rt, where, f"{saved} written in {write_s:.2f} s")
        if rt.distributed:
            torch.distributed.all_reduce(at.loss_sum)
        train_loss, images = float(at.loss_sum[0] / at.loss_sum[1]), int(at.loss_sum[1])
        if not _schedule_per_step(config):
            scheduler.step()
        test_loss, test_acc = evaluate(config, rt, model, test_set, test_loader)
        now = time.time()
        if test_acc >= target and time_to_target is None:
            time_to_target = now - phases["process_start"]
        record = {
            "epoch": epoch,
            "train_loss": train_loss,
            "test_loss": test_loss,
            "test_acc": test_acc,
            "images_per_s": images / at.train_s,
            "epoch_s": at.epoch_s + now - epoch_start,
            "world_size": rt.world_size,
            "strategy": config.strategy,
        }
        history.append(record)
        ranks = checkpoint.gather({"rng": checkpoint.rng_state()}, rt.distributed, rt.world_size)
        saved = None
        if rt.is_main:
            end = {"epoch": epoch, "step": None}
            saved = store.save(epoch, {**end, **training_state(ranks)})
            _append_json(metrics_path, record)
        rt.log(
            f"epoch {epoch}/{config.epochs}: train_loss {train_loss:.4f} test_loss "
            f"{test_loss:.4f} test_acc {test_acc:.2%} {record['images_per_s']:.0f} img/s "
            f"{record['epoch_s']:.1f} s"
        )
        if config.target_acc is not None and test_acc >= config.target_acc:
            rt.log(f"reached --target-acc {config.target_acc:.2%}; stopping")
            break
        if epoch < config.epochs and rt.stop_agreed():
            return _stopped(config, rt, f"after epoch {epoch}", f"{saved}")
    phases["end"] = time.time()
    done = {
        "event": "done",
        "test_acc": test_acc,
        "target_acc": target,
        "time_to_target_s": time_to_target,
        "world_size": rt.world_size,
        "strategy": config.strategy,
        "phases": phases,
    }
    if rt.is_main:
        _append_json(metrics_path, done)
    return done


@dataclass
class EpochPosition:
    """One rank's way through an epoch: what a mid-epoch checkpoint adds to the model's state."""

    step: int
    loss_sum: torch.Tensor  # [sum of loss x images, images] over this rank's steps so far
    train_s: float = 0.0  # seconds in training steps, over every attempt
    epoch_s: float = 0.0  # wall seconds of this epoch in earlier attempts
    rng: dict[str, Any] | None = None  # restored once the steps already done are skipped


def _stopped(config: Config, rt: Runtime, where: str, saved: str) -> dict[str, Any]:
    """After a stop request: rank 0 has checkpointed; it asks the batch script for a requeue.

    The barrier keeps every rank alive until the checkpoint is durable; then all exit 0.
    """
    if rt.is_main:
        requeue = runtime.request_requeue()
        # The signal may have reached another rank only (they agree at every step boundary).
        why = rt.stop.received or "a signal to another rank"
        then = f"requeue requested ({requeue})" if requeue else "start it again to resume"
        rt.log(f"stopping on {why} {where}: checkpoint {saved}; {then}")
    if rt.distributed:
        torch.distributed.barrier()
    return {
        "event": "stopped",
        "where": where,
        "checkpoint": saved,
        "world_size": rt.world_size,
        "strategy": config.strategy,
    }


def _train_epoch(
    config: Config,
    rt: Runtime,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    loader: Any,
    epoch: int,
    phases: dict[str, float],
    resume_at: EpochPosition | None,
) -> tuple[EpochPosition, int]:
    """One pass, or its rest after ``resume_at``, until its end or a stop all ranks agreed on.

    Returns where this rank stopped and the number of steps in the epoch.
    """
    model.train()
    total = len(loader)
    at = resume_at or EpochPosition(0, torch.zeros(2, dtype=torch.float64, device=rt.device))
    bar = _progress(rt, total, epoch, config, at.step)
    # Starting the iterator draws from the RNG as in an uninterrupted epoch; the batches already
    # done are then read and dropped (the sampler's order depends on seed and epoch only), and
    # only then are the RNG states restored. Reading is cheap for in-memory MNIST; a dataset
    # with costly decoding would skip the indices in its sampler instead.
    batches: Iterator[Any] = iter(loader)
    for _ in range(at.step):
        next(batches)
    if at.rng is not None:
        checkpoint.restore_rng(at.rng)
    start = time.time()
    for step, (x, y) in enumerate(batches, at.step + 1):
        if rt.strategy != "accelerate":
            x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
        loss = _loss(config, model(x), y)
        optimizer.zero_grad(set_to_none=True)
        if rt.accelerator is not None:
            rt.accelerator.backward(loss)
        else:
            loss.backward()
        optimizer.step()
        if _schedule_per_step(config):
            scheduler.step()
        phases.setdefault("first_step", time.time())
        at.loss_sum += torch.stack(
            [
                loss.detach().double() * len(y),
                torch.tensor(len(y), dtype=torch.float64, device=rt.device),
            ]
        )
        at.step = step
        if bar is not None:
            bar.update()
        elif rt.is_main and (step % config.log_every == 0 or step == total):
            rate = int(at.loss_sum[1]) * rt.world_size / (at.train_s + time.time() - start)
            print(
                f"epoch {epoch}/{config.epochs} step {step}/{total} loss {loss.item():.4f} "
                f"{rate:.0f} img/s",
                flush=True,
            )
        # At the last step the epoch finishes first: its own checkpoint serves.
        if step < total and rt.stop_agreed():
            break
    at.train_s += time.time() - start
    if bar is not None:
        bar.close()
    return at, total


def _unwrap(rt: Runtime, model: nn.Module) -> nn.Module:
    if rt.accelerator is not None:
        return rt.accelerator.unwrap_model(model)  # type: ignore[no-any-return]
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _resume_key(config: Config, rt: Runtime) -> dict[str, Any]:
    """What must match for a resumed run to continue exactly where the last one stopped."""
    key = {
        k: v
        for k, v in asdict(config).items()
        if k in ("recipe", "batch_size", "lr", "seed", "limit_train")
    }
    key["world_size"] = rt.world_size
    if _schedule_per_step(config):
        key["epochs"] = config.epochs  # the one-cycle schedule spans all of them
    return key


def _append_json(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def _process_start() -> float:
    """When this process started (Linux), so the phase times include interpreter and imports."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        stat = Path("/proc/stat").read_text().splitlines()
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        train(config, started_at=_process_start())
    except UserError as exc:
        rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        prefix = "" if rank == "0" else f"[rank {rank}] "
        print(f"{prefix}error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    runtime.finish(main())
