"""Slurm 24.11 beside 22.05 (clustertrain.localcluster.rootfs), what needs no cluster: the version
is refused in one line unless supported, each difference is said for 24.11 only, the daemons'
command lines bind and chroot, the clients' wrappers pass shellcheck. The cluster itself on
24.11: tests/e2e on a cluster brought up with --slurm 24.11 (scripts/test's second phase)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from clustertrain import localcluster as cluster
from clustertrain.errors import FieldError, UserError
from clustertrain.localcluster import rootfs
from clustertrain.localcluster import slurm_conf as config
from tests.conftest import run_cli


def test_a_slurm_version_that_is_not_supported_is_one_line_and_nothing_starts(
    tmp_path: Path,
) -> None:
    with pytest.raises(FieldError, match=r"^slurm: invalid value '23.02'; use one of 22.05, 24.11"):
        cluster.Layout(slurm="23.02")
    done = run_cli("cluster", "up", "--slurm", "23.02",
                   env={"CLUSTERTRAIN_CLUSTER_DIR": str(tmp_path / "c")})  # fmt: skip
    assert done.returncode == 2
    assert (
        done.stderr
        == "clustertrain: error: slurm: invalid value '23.02'; use one of 22.05, 24.11\n"
    )
    assert not (tmp_path / "c").exists()


def test_what_differs_is_said_for_24_11_only(tmp_path: Path) -> None:
    old = cluster.Layout(state_dir=tmp_path)
    new = cluster.Layout(state_dir=tmp_path, slurm="24.11")
    assert "PluginDir" not in config.render_slurm_conf(old, "host")
    plugins = rootfs.plugin_dir(rootfs.root("24.11"))
    assert f"PluginDir={plugins}" in config.render_slurm_conf(new, "host").splitlines()
    assert rootfs.cgroup_conf("22.05") is None
    assert "CgroupPlugin=disabled" in (rootfs.cgroup_conf("24.11") or "").splitlines()
    assert "Slurm 24.11" in new.describe() and "Slurm 22.05" in old.describe()


def test_a_daemon_of_24_11_runs_chrooted_with_the_hosts_folders_bound(tmp_path: Path) -> None:
    base = tmp_path / "root"
    argv = rootfs.daemon_argv(base, [tmp_path / "state"], ["/usr/sbin/slurmd", "-D", "-N", "n1"])
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["sh", "/usr/sbin/slurmd", "-D", "-N", "n1"]
    script = argv[2]
    # First its own mount, so that "/" inside is a mount point (runc sets its propagation).
    assert script.startswith(f"mount --bind {base} {base} && ")
    for bound in ["/proc", "/sys", "/dev", "/tmp", str(tmp_path / "state"), "/etc/passwd",
                  "/etc/hosts"]:  # fmt: skip
        assert f"mount --rbind {bound} {base}{bound}" in script, bound
    assert "/usr " not in script and "/etc " not in script  # the root filesystem's own system
    assert script.endswith(f'exec chroot {base} "$@"')
    assert subprocess.run(["bash", "-n", "-c", script], check=False).returncode == 0


def test_the_clients_run_the_root_filesystems_binaries_for_anyone(tmp_path: Path) -> None:
    base, bin_dir = tmp_path / "root", tmp_path / "bin"
    rootfs.write_clients(base, bin_dir)
    assert sorted(p.name for p in bin_dir.iterdir()) == sorted(rootfs.CLIENTS)
    sbatch = (bin_dir / "sbatch").read_text()
    loader = base / "usr" / "lib" / rootfs.multiarch()
    assert f"exec {loader}/ld-linux" in sbatch and f'{base}/usr/bin/sbatch "$@"' in sbatch
    assert (bin_dir / "sbatch").stat().st_mode & 0o777 == 0o755
    if shutil.which("shellcheck"):
        checked = subprocess.run(["shellcheck", *map(str, bin_dir.iterdir())], check=False,
                                 capture_output=True, text=True)  # fmt: skip
        assert checked.returncode == 0, checked.stdout


def test_a_cached_root_filesystem_without_the_expected_slurm_is_made_again_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache whose slurmctld is missing (or says another version) is rebuilt; when what is
    made is still not Slurm 24.11, up stops in one line instead of running it."""
    monkeypatch.setenv("CLUSTERTRAIN_ROOTFS_DIR", str(tmp_path))
    stale = rootfs.root("24.11") / "usr" / "sbin"
    stale.mkdir(parents=True)
    (stale / "slurmd").write_text("not slurmctld\n")
    built: list[Path] = []
    monkeypatch.setattr(rootfs, "_build", lambda base, version: built.append(base))
    with pytest.raises(UserError, match=r"^slurm: the root filesystem made in .* does not run"):
        rootfs.ensure("24.11", [tmp_path / "state"])
    assert built == [rootfs.root("24.11")]
    assert not rootfs.holds(rootfs.root("24.11"), "24.11")


def test_sbatch_24_11s_own_options_pass_through_and_those_clustertrain_sets_do_not() -> None:
    from clustertrain.spec.sbatch import option_problem

    for option in ("--oom-kill-step=1", "--tres-bind=gres/gpu:verbose", "--resv-ports=2"):
        assert option_problem(option) is None, option
    assert (
        option_problem("--tres-per-task=cpu:4")
        == "is set by clustertrain; use its own field instead"
    )
