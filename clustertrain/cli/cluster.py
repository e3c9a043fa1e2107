"""``clustertrain cluster ...``: the local Slurm cluster (up, down, fail, degrade, heal, status).

Each command parses, calls :mod:`clustertrain.localcluster`, prints.
"""

from __future__ import annotations

import os

import click


@click.group()
def cluster() -> None:
    """A real multi-node Slurm cluster on this one machine (root, Debian or Ubuntu)."""


@cluster.command(epilog="\b\nExample:\n  clustertrain cluster up --nodes 4 --gpus-per-node 2")
@click.option("--nodes", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option(
    "--cpus-per-node",
    type=click.IntRange(1, 1024),
    default=None,
    help="CPUs each node declares (default: this machine's; Slurm binds steps to real CPUs).",
)
@click.option("--gpus-per-node", type=click.IntRange(0, 16), default=2, show_default=True)
@click.option(
    "--layout",
    "network",
    type=click.Choice(["namespaces", "loopback"]),
    default="namespaces",
    show_default=True,
    help="namespaces: every node a host of its own on a private bridge; "
    "loopback: every node on 127.0.0.1 (where namespaces cannot be made).",
)
@click.option(
    "--slurmd-timeout",
    type=click.IntRange(10, 3600),
    default=30,
    show_default=True,
    help="Seconds a node may not answer before Slurm declares it down (sites: 300 or more).",
)
@click.option(
    "--slurm",
    default="22.05",
    show_default=True,
    help="22.05: this host's packages (Debian 12); 24.11: Debian 13's, from a root filesystem "
    "made once with mmdebstrap (its commands: export the PATH printed). Checked by the layout.",
)
@click.option(
    "--no-accounting",
    is_flag=True,
    help="No slurmdbd and MariaDB: finished jobs only in Slurm's job-completion log, as at "
    "sites without accounting (saves a few seconds at up).",
)
def up(
    nodes: int,
    cpus_per_node: int | None,
    gpus_per_node: int,
    network: str,
    slurmd_timeout: int,
    slurm: str,
    no_accounting: bool,
) -> None:
    """Install Slurm if needed and start a controller and one slurmd per node."""

    from clustertrain import localcluster as local

    cpus = cpus_per_node or len(os.sched_getaffinity(0))
    layout = local.Layout(
        nodes=nodes,
        cpus_per_node=cpus,
        gpus_per_node=gpus_per_node,
        network=network,
        slurmd_timeout_s=slurmd_timeout,
        slurm=slurm,
        accounting=not no_accounting,
    )
    conf = local.up(layout)
    if slurm != local.SLURM_DEFAULT:  # its commands, not this host's (the line before the last)
        click.echo(f'export PATH={local.clients_dir(layout.state_dir)}:"$PATH"')
    click.echo(f"export SLURM_CONF={conf}")


@cluster.command(epilog="\b\nExample:\n  clustertrain cluster down")
def down() -> None:
    """Stop what `cluster up` started and remove what it added to system files."""
    from clustertrain import localcluster as local

    local.down(local.default_state_dir())


@cluster.command(
    epilog="\b\nExamples:\n  clustertrain cluster fail node2\n"
    "  clustertrain cluster fail node2 --cut-link\n  clustertrain cluster fail controller\n"
    "  clustertrain cluster fail accounting"
)
@click.argument("node")
@click.option("--cut-link", is_flag=True, help="Cut its network link instead of killing it.")
def fail(node: str, cut_link: bool) -> None:
    """Make NODE disappear mid-job (its slurmd and every process on it killed), to see what a
    job does then; `cluster up` restarts the cluster afresh. `controller` stops slurmctld,
    `accounting` slurmdbd (by PID): `cluster heal` starts it again."""
    from clustertrain import localcluster as local

    if node in local.SERVICES:
        click.echo(local.stop_service(local.default_state_dir(), node))
        return
    click.echo(local.fail_node(local.default_state_dir(), node, cut_link))


@cluster.command(
    epilog="\b\nExamples:\n  clustertrain cluster restart controller\n"
    "  clustertrain cluster restart accounting"
)
@click.argument("service", type=click.Choice(["controller", "accounting"]))
def restart(service: str) -> None:
    """Stop SERVICE (controller: slurmctld, accounting: slurmdbd) and start it again, as a
    site's upgrade does; running jobs carry on."""
    from clustertrain import localcluster as local

    click.echo(local.restart_service(local.default_state_dir(), service))


@cluster.command(name="add-user", epilog="\b\nExample:\n  clustertrain cluster add-user alice")
@click.argument("user")
def add_user(user: str) -> None:
    """Register USER (a user of this machine) with the cluster's accounting, as a site's
    admin does for a newcomer (sacctmgr add user)."""
    from clustertrain import localcluster as local

    click.echo(local.add_user(local.default_state_dir(), user))


@cluster.command(
    epilog="\b\nExamples:\n  clustertrain cluster degrade node3 --link-rate 10mbit\n"
    "  clustertrain cluster degrade node2 --cpu 25%"
)
@click.argument("node")
@click.option("--link-rate", metavar="RATE", help="Its link, both ways, e.g. 10mbit (tbf).")
@click.option("--cpu", metavar="SHARE", help="Its processes' share of one CPU, e.g. 25%.")
def degrade(node: str, link_rate: str | None, cpu: str | None) -> None:
    """Make NODE slow for real: a tbf queue on its link, a CPU quota on its processes (and
    those they start); `cluster heal NODE` or `cluster down` undoes it."""
    from clustertrain import localcluster as local

    click.echo(local.degrade(local.default_state_dir(), node, link_rate, cpu))


@cluster.command(epilog="\b\nExample:\n  clustertrain cluster heal node3")
@click.argument("node")
def heal(node: str) -> None:
    """Undo `cluster degrade NODE`; `controller` or `accounting`: start again what `cluster
    fail` stopped."""
    from clustertrain import localcluster as local

    if node in local.SERVICES:
        click.echo(local.start_service(local.default_state_dir(), node))
        return
    click.echo(local.heal(local.default_state_dir(), node))


@cluster.command(name="status", epilog="\b\nExample:\n  clustertrain cluster status")
def cluster_status() -> None:
    """Say what of the local cluster is running."""
    from clustertrain import localcluster as local

    click.echo(local.status(local.default_state_dir()))
