"""A plain DDP script that does not import clustertrain, crashing one rank once, and saying when
each part of its start-up ended: what bench/restart.py reads to break a restart down.

    restart_probe.py OUT_DIR [--steps 120] [--crash-at 60] [--every 20]

Every rank appends one JSON line to ``OUT_DIR/phases.jsonl`` per start (its process start,
torch imported, process group up, DDP built and checkpoint loaded, first step done, each a
``time.time()``); rank 1 writes ``OUT_DIR/crash.json`` with the time it raises, at step
``--crash-at``, on its first run only. Rank 0 saves a checkpoint every ``--every`` steps
(``torch.save``, then ``os.replace``) and every start loads the newest, so a restart resumes
from it as a training script would.
"""

import time

BORN = time.time()  # before any import: the interpreter's own start-up is all that came before

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

IMPORTED = time.time()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--crash-at", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    grouped = time.time()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    saved = args.out / "checkpoint.pt"
    start = 1
    if saved.exists():
        state = torch.load(saved, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"]) + 1
    loaded = time.time()
    crashed = args.out / "crash.json"
    first = None
    for step in range(start, args.steps + 1):
        if rank == 1 and step == args.crash_at and not crashed.exists():
            crashed.write_text(json.dumps({"time": time.time(), "step": step}))
            raise RuntimeError(f"rank 1 crashed at step {step}")
        loss = model(torch.randn(32, 64)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if first is None:
            first = time.time()
            phases = {"rank": rank, "step": step, "born": BORN, "imported": IMPORTED,
                      "grouped": grouped, "loaded": loaded, "first_step": first}  # fmt: skip
            with open(args.out / "phases.jsonl", "a") as handle:
                handle.write(json.dumps(phases) + "\n")
        if rank == 0 and step % args.every == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                     "step": step}  # fmt: skip
            torch.save(state, saved.with_suffix(".tmp"))
            os.replace(saved.with_suffix(".tmp"), saved)
        print(f"step {step} at {time.time():.3f}", flush=True)
        time.sleep(0.05)
    dist.barrier()
    del model
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
