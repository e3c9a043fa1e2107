"""The three levels of the classic story as objects with one interface: plain PyTorch on one
process, DistributedDataParallel under a launcher, and Hugging Face Accelerate.

The training loop (:mod:`jobs.mnist.loop`) calls only what :class:`Strategy` declares, so the
difference between the levels is exactly what is written here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from clustertrain import checkpoint, runtime
from clustertrain import env as dist_env
from clustertrain.errors import UserError

from .images import TEST_BATCH_SIZE, Images

LossFn = Callable[..., torch.Tensor]


class Strategy:
    """Where this process stands in the world, and how a model trains across it."""

    name: ClassVar[str]

    def __init__(self, launched: dist_env.DistEnv, rank: int, world_size: int, device: Any):
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self.local_rank, self.local_world_size = launched.local_rank, launched.local_world_size
        self.stop = runtime.StopRequest()

    @classmethod
    def start(cls, launched: dist_env.DistEnv) -> Strategy:
        """Join the world the launcher started; refuse a world that does not match it."""
        strategy = cls._start(launched)
        if strategy.world_size != launched.world_size:
            raise UserError(
                f"--strategy {cls.name} formed a world of {strategy.world_size} process(es), "
                f"but the launcher started {launched.world_size}: {launched.describe()}"
            )
        if strategy.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            cpus = len(os.sched_getaffinity(0))
            torch.set_num_threads(max(1, cpus // max(1, launched.local_world_size)))
        return strategy

    @classmethod
    def _start(cls, launched: dist_env.DistEnv) -> Strategy:
        raise NotImplementedError

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return torch.distributed.is_initialized()

    @property
    def sampler_replicas(self) -> int:
        """How many shards the sampler cuts: Accelerate shards the batches itself."""
        return 1

    def log(self, message: str) -> None:
        if self.is_main:
            print(message, flush=True)

    def stop_agreed(self) -> bool:
        return self.stop.agreed(self.device) if self.distributed else self.stop.received is not None

    def prepare(self, model: nn.Module, *rest: Any) -> tuple[Any, ...]:
        """The model (wrapped as the strategy trains it), then the optimizer, loaders..."""
        return (model, *rest)

    def to_device(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(self.device, non_blocking=True) for t in tensors)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def set_epoch(self, sampler: Any, loader: Any, epoch: int) -> None:
        sampler.set_epoch(epoch)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        if self.distributed:
            torch.distributed.all_reduce(tensor)

    def gather(self, mine: dict[str, Any]) -> list[dict[str, Any]]:
        return checkpoint.gather(mine, self.distributed, self.world_size)

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def test_totals(self, model: nn.Module, test: Images, loader: Any, loss: LossFn) -> Any:
        """[loss sum, correct, images] over every test image once, the same on every rank.

        Rank r takes images r, r+W, r+2W...: a partition, so no image is padded or repeated.
        The bare module: DDP's forward would broadcast buffers, a collective, per batch, and
        ranks may differ by one batch here.
        """
        model = self.unwrap(model)
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        shard = torch.arange(self.rank, len(test), self.world_size)
        for start in range(0, len(shard), TEST_BATCH_SIZE):
            indices = shard[start : start + TEST_BATCH_SIZE].tolist()
            x, y = self.to_device(*test.__getitems__(indices))
            logits = model(x)
            count = torch.tensor(len(y), dtype=torch.float64, device=self.device)
            correct = (logits.argmax(1) == y).sum().double()
            totals += torch.stack([loss(logits, y, "sum").double(), correct, count])
        self.all_reduce(totals)
        return totals

    def teardown(self) -> None:
        """After a clean end: every rank leaves together (see clustertrain.runtime)."""
        runtime.teardown()


class Single(Strategy):
    """Level 1: the plain PyTorch loop, one process."""

    name = "single"

    @classmethod
    def _start(cls, launched: dist_env.DistEnv) -> Strategy:
        if launched.world_size > 1:
            raise UserError(
                f"--strategy single, but launched as {launched.describe()}; "
                "use --strategy ddp or accelerate, or start one process"
            )
        return cls(launched, 0, 1, dist_env.pick_device(launched))

    @property
    def distributed(self) -> bool:
        return False


class DDP(Strategy):
    """Level 2: DistributedDataParallel, ranks from torchrun, srun or a notebook launcher."""

    name = "ddp"

    @classmethod
    def _start(cls, launched: dist_env.DistEnv) -> Strategy:
        device = dist_env.pick_device(launched)
        dist_env.init_process_group(launched, device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return cls(launched, launched.rank, torch.distributed.get_world_size(), device)

    @property
    def sampler_replicas(self) -> int:
        return self.world_size

    def prepare(self, model: nn.Module, *rest: Any) -> tuple[Any, ...]:
        ids = [self.device.index] if self.device.type == "cuda" else None
        return (nn.parallel.DistributedDataParallel(model, device_ids=ids), *rest)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


class Accelerate(Strategy):
    """Level 3: Hugging Face Accelerate prepares the model, optimizer, loaders and schedule."""

    name = "accelerate"

    def __init__(self, launched: dist_env.DistEnv, accelerator: Any) -> None:
        super().__init__(
            launched, accelerator.process_index, accelerator.num_processes, accelerator.device
        )
        self.local_rank, self.accelerator = accelerator.local_process_index, accelerator

    @classmethod
    def _start(cls, launched: dist_env.DistEnv) -> Strategy:
        from accelerate import Accelerator

        # Without cpu=True on a host without CUDA, `accelerate launch --multi_gpu` starts
        # unsynchronised single-process copies (seen with Accelerate 1.16).
        accelerator = Accelerator(
            cpu=not torch.cuda.is_available(), step_scheduler_with_optimizer=False
        )
        return cls(launched, accelerator)

    def prepare(self, model: nn.Module, *rest: Any) -> tuple[Any, ...]:
        return tuple(self.accelerator.prepare(model, *rest))

    def to_device(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tensors  # the prepared loaders place each batch

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.accelerator.unwrap_model(model)  # type: ignore[no-any-return]

    def set_epoch(self, sampler: Any, loader: Any, epoch: int) -> None:
        loader.set_epoch(epoch)

    def test_totals(self, model: nn.Module, test: Images, loader: Any, loss: LossFn) -> Any:
        # gather_for_metrics drops the samples that even_batches duplicated as padding.
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        for x, y in loader:
            logits = model(x)
            losses, correct = self.accelerator.gather_for_metrics(
                (loss(logits, y, "none"), logits.argmax(1) == y)
            )
            count = torch.tensor(len(losses), dtype=torch.float64, device=self.device)
            totals += torch.stack([losses.double().sum(), correct.double().sum(), count])
        return totals

    def teardown(self) -> None:
        runtime.teardown(self.accelerator)


STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (Single, DDP, Accelerate)}


def start(name: str, launched: dist_env.DistEnv) -> Strategy:
    return STRATEGIES[name].start(launched)
