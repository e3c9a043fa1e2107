"""clustertrain.runtime, as a training script uses it under torchrun (2 real CPU processes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from clustertrain import protocol
from tests.rank.test_train import BIN, ROOT, _clean_env

SCRIPT = textwrap.dedent(
    """
    import atexit, glob, os, sys
    import torch, torch.distributed as dist
    from clustertrain import runtime

    def gloo_threads():
        return sorted(t for f in glob.glob("/proc/self/task/*/comm")
                      if "gloo" in (t := open(f).read().strip()))

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    model(torch.randn(4, 8)).sum().backward()
    stop = runtime.StopRequest.install()
    if rank == 1:
        os.kill(os.getpid(), runtime.StopRequest.SIGNALS[0])
    agreed = stop.agreed()
    if rank == 0 and agreed:
        runtime.request_requeue()
    atexit.register(lambda: open(f"{out}/atexit-{rank}", "w").write("ran"))
    runtime.teardown()
    # What makes the plain exit unsafe: DDP keeps the group, and its threads, alive.
    open(f"{out}/threads-{rank}", "w").write(" ".join(gloo_threads()))
    runtime.finish(3 if rank == 1 else 0)
    """
)


def test_finish_after_a_stop_agreed_by_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    requeue = tmp_path / protocol.REQUEUE_FILE
    done = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(script)]
        + [str(tmp_path)],
        cwd=ROOT,
        env=_clean_env(**{protocol.ENV_REQUEUE_FILE: str(requeue)}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Rank 1's code reaches torchrun: finish() ends with the code it was given.
    assert done.returncode != 0 and "exitcode  : 3" in done.stderr, done.stderr[-3000:]
    assert "terminate called" not in done.stderr
    # Only rank 1 was signalled; both agreed to stop, and rank 0 asked for the requeue.
    assert requeue.is_file()
    for rank in (0, 1):
        assert (tmp_path / f"atexit-{rank}").read_text() == "ran"
        assert "pt_gloo_runloop" in (tmp_path / f"threads-{rank}").read_text()


def test_outside_a_job_nothing_is_requeued_and_teardown_is_a_no_op() -> None:
    code = (
        "from clustertrain import runtime\n"
        "stop = runtime.StopRequest.install()\n"
        "assert not stop.agreed() and runtime.request_requeue() is None\n"
        "runtime.teardown()\n"
        "runtime.finish(7)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_clean_env(), timeout=60)
    assert done.returncode == 7
