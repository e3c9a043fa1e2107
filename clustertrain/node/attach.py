"""Runs a command (a shell) on a node of a running job, in the job's own environment.

``python -m clustertrain.node.attach HEARTBEAT_DIR [--chdir DIR] [--env NAME=VALUE]... [--path
DIR] -- ARGV...`` is what ``clustertrain attach`` starts inside the allocation (an overlapping
step, ``srun --pty``). The job's environment is what its ranks on this node were given: the
batch script's setup lines, its virtual environment, its variables; so it is read from a rank of
the step found here (clustertrain.node.stacks finds them: never a PID from a file), less what
is a rank's own (its RANK, the launcher's variables) and what is this step's (Slurm's
variables, the GPUs Slurm gave this step, the terminal). Where no rank runs here yet, the
submit side's words stand in: the job's working directory, variables and virtual environment.
Then ARGV replaces this process, as argv: a shell only where the user asked for one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from clustertrain.node.stacks import ranks_here

# A rank's own variables (the launcher's, per process): not the shell's.
_RANKS_OWN = frozenset(
    {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "ROLE_NAME"}
    | {"ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"}
)
# What this step is given by Slurm or the terminal, kept over the rank's.
_THIS_STEPS = ("SLURM_", "SLURMD_", "CUDA_VISIBLE_DEVICES", "TERM", "COLUMNS", "LINES")


def environment(rank: Mapping[str, str], ours: Mapping[str, str]) -> dict[str, str]:
    """The shell's environment: the rank's less its own and this step's, then this step's."""
    kept = {
        name: value
        for name, value in rank.items()
        if name not in _RANKS_OWN and not name.startswith(("TORCHELASTIC_", *_THIS_STEPS))
    }
    kept.update({name: value for name, value in ours.items() if name.startswith(_THIS_STEPS)})
    return kept


def fallback(ours: Mapping[str, str], variables: Sequence[str], path: str | None) -> dict[str, str]:
    """No rank here: this step's environment with the job's variables and virtual environment
    (``path``, its bin folder, first on PATH)."""
    found = dict(ours)
    for word in variables:
        name, _, value = word.partition("=")
        found[name] = value
    if path:
        found["PATH"] = f"{path}:{found.get('PATH', '/usr/bin:/bin')}"
    return found


def _rank_environ(pid: int) -> tuple[dict[str, str], str] | None:
    """A rank's environment and working directory, or None where it ended meanwhile."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    found = {}
    for entry in raw.decode("utf-8", "surrogateescape").split("\0"):
        name, sep, value = entry.partition("=")
        if sep and name:
            found[name] = value
    return found, cwd


def _parse(args: list[str]) -> tuple[Path, str | None, list[str], str | None, list[str]]:
    """HEARTBEAT_DIR, --chdir, --env words, --path, and the argv after ``--``."""
    cut = args.index("--")
    words, argv = args[1:cut], args[cut + 1 :]
    chdir = path = None
    variables = []
    for option, value in zip(words[::2], words[1::2], strict=True):
        if option == "--chdir":
            chdir = value
        elif option == "--path":
            path = value
        elif option == "--env":
            variables.append(value)
        else:
            raise SystemExit(f"clustertrain.node.attach: unknown option {option!r}")
    return Path(args[0]), chdir, variables, path, argv


def main(args: list[str]) -> None:
    heartbeats, chdir, variables, path, argv = _parse(args)
    node = os.environ.get("SLURMD_NODENAME", os.uname().nodename)
    found = next((got for rank in ranks_here(heartbeats) if (got := _rank_environ(rank.pid))), None)
    if found is not None:
        env, chdir = environment(found[0], os.environ), found[1]
    else:
        print(
            f"clustertrain: no rank of the job runs on {node} yet: the job's variables and "
            "working directory, not its ranks' environment",
            file=sys.stderr,
        )
        env = fallback(os.environ, variables, path)
    if chdir:
        try:
            os.chdir(chdir)
        except OSError as exc:
            print(f"clustertrain: cannot enter {chdir}: {exc.strerror}", file=sys.stderr)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise SystemExit(f"clustertrain: {argv[0]}: {exc.strerror}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
