"""The local cluster's accounting as rendered: slurm.conf's lines with slurmdbd and without,
slurmdbd.conf, and the ports it takes. The daemons themselves run in the slurm-marked tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain import localcluster as cluster
from clustertrain.errors import UserError
from clustertrain.localcluster import accounting


def _conf(layout: cluster.Layout) -> dict[str, str]:
    text = cluster.render_slurm_conf(layout, "head")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and " " not in line)


def test_with_accounting_slurmctld_reports_to_slurmdbd_and_gpus_are_accounted(
    tmp_path: Path,
) -> None:
    layout = cluster.Layout(nodes=2, state_dir=tmp_path)
    conf = _conf(layout)
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert conf["AccountingStorageHost"] == layout.controller_address
    assert conf["AccountingStoragePort"] == str(layout.dbd_port) == str(layout.base_port + 3)
    assert conf["AccountingStoragePass"] == f"{tmp_path}/munge/munged.socket"
    assert conf["AccountingStorageTRES"] == "gres/gpu"
    assert conf["JobAcctGatherType"] == "jobacct_gather/linux"
    assert conf["JobCompType"] == "jobcomp/filetxt"  # kept: the fallback that needs no daemon
    assert layout.ports == [16817, 16818, 16819, 16820]  # slurmdbd's port is checked free too


def test_without_accounting_the_completion_log_is_all(tmp_path: Path) -> None:
    layout = cluster.Layout(nodes=2, state_dir=tmp_path, accounting=False)
    conf = _conf(layout)
    assert conf["AccountingStorageType"] == "accounting_storage/none"
    assert conf["JobAcctGatherType"] == "jobacct_gather/none"
    assert "AccountingStoragePort" not in conf
    assert layout.ports == [16817, 16818, 16819]
    assert layout.describe().endswith(", no accounting")


def test_slurmdbd_conf_keeps_no_password_and_names_the_clusters_own_files(tmp_path: Path) -> None:
    layout = cluster.Layout(nodes=2, state_dir=tmp_path)
    text = accounting.render_dbd_conf(layout, "head")
    conf = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    assert conf["StorageUser"] == "root" and "StoragePass" not in conf  # the socket's auth
    assert conf["StorageHost"] == "localhost"  # MYSQL_UNIX_PORT names the socket
    assert accounting.daemon_env(tmp_path) == {"MYSQL_UNIX_PORT": f"{tmp_path}/run/mariadb.sock"}
    assert conf["DbdAddr"] == layout.controller_address
    assert conf["DbdPort"] == str(layout.dbd_port)
    assert conf["AuthInfo"] == f"socket={tmp_path}/munge/munged.socket"
    assert conf["LogFile"].startswith(str(tmp_path))


def test_add_user_refuses_a_name_that_is_no_user(tmp_path: Path) -> None:
    layout = cluster.Layout(nodes=2, state_dir=tmp_path)
    for name in ("no-such-user-here", "root,nobody", "-i"):
        with pytest.raises(UserError, match=r"^user: .* is no user of this machine"):
            accounting.add_user(layout, name)
