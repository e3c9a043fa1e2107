"""`clustertrain doctor`: what the cluster offers, and whether this host can submit jobs to it."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from clustertrain.spec.fields import format_time

from .cluster_info import ClusterInfo
from .commands import Slurm


def cluster_lines(info: ClusterInfo, accounting: bool, conf: str) -> list[str]:
    lines = [
        f"Slurm: {info.version or 'unknown version'} (SLURM_CONF={conf})",
        "accounting (sacct): "
        + (
            "available"
            if accounting
            else "unavailable; status reads scontrol and the job-completion log instead"
        ),
    ]
    for part in info.partitions:
        members = [n for n in info.nodes if part.name in n.partitions]
        usable = sum(n.usable for n in members)
        lines.append(
            f"partition {part.name}{' (default)' if part.default else ''}: {part.state}, "
            f"{usable}/{len(members)} nodes usable, MaxNodes="
            f"{part.max_nodes or 'UNLIMITED'}, MaxTime="
            f"{format_time(part.max_time_s) if part.max_time_s else 'UNLIMITED'}"
        )
        for node in members:
            lines.append(
                f"  {node.name:<12} {node.cpus:>4} CPUs {node.memory_mb:>8} MB "
                f"{node.gpus:>2} GPUs  {node.state}"
            )
    return lines


def host_problems(runs_root: Path) -> list[str]:
    """What this host lacks for the jobs it submits (empty when all is well)."""
    problems = []
    for command in ("sbatch", "srun", "scontrol"):
        if shutil.which(command) is None:
            problems.append(f"{command} is not on PATH: install Slurm's client commands")
    for module in ("torch", "accelerate"):
        if importlib.util.find_spec(module) is None:
            problems.append(
                f"Python package {module} is missing: pip install 'clustertrain[train]'"
            )
    for launcher in ("torchrun", "accelerate"):
        if shutil.which(launcher) is None:
            problems.append(f"{launcher} is not on PATH: activate the environment jobs use")
    probe = runs_root if runs_root.exists() else runs_root.parent
    if not os.access(probe, os.W_OK):
        problems.append(f"runs dir {runs_root} is not writable: pick another with --runs-dir")
    return problems


def report(slurm: Slurm, runs_root: Path) -> tuple[list[str], list[str]]:
    """(lines describing the cluster, problems found on this host)."""
    conf = slurm.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    lines = cluster_lines(slurm.cluster_info(), slurm.accounting_works(), conf)
    return lines, host_problems(runs_root)
