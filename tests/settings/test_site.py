"""Your site's defaults (clustertrain.settings.site): the entry of this cluster applies beneath
the job file and the flags, the dry run says where each value came from, and a sites file that
is not one of yours, or not one at all, is refused in one line before anything is written or
submitted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clustertrain.errors import FieldError
from clustertrain.pipeline.plan import plan
from clustertrain.settings import site
from tests.conftest import run_cli

SITES = """\
della:                          # slurm.conf's ClusterName
  partition: gpu
  account: proj-123
  setup: [module load cudatoolkit/12.1, 'export NCCL_IB_HCA=mlx5']
  node_setup: [ulimit -n 65536]
  cpus_per_gpu: 8
  mem_per_gpu: 32G
other: {partition: cpu}
"""


@pytest.fixture
def sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's sites file (not written yet), no cluster named by the environment."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))
    monkeypatch.delenv("CLUSTERTRAIN_SITE", raising=False)
    monkeypatch.setenv("CLUSTERTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    path = tmp_path / "config" / "clustertrain" / "sites.yaml"
    path.parent.mkdir(parents=True)
    return path


def test_the_clusters_entry_applies_beneath_the_job_file_and_the_flags(
    sites: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sites.write_text(SITES)
    assert plan(module="m", gpus_per_node=2).spec.partition is None  # no cluster named
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmctldHost=ctl\nClusterName=della\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    job = plan(module="m", gpus_per_node=2, account="mine", setup=["echo flag"])
    spec = job.spec
    assert (spec.partition, spec.account, spec.cpus_per_gpu, spec.mem_per_gpu) == (
        "gpu", "mine", 8, "32G",
    )  # fmt: skip
    assert spec.setup == ("module load cudatoolkit/12.1", "export NCCL_IB_HCA=mlx5", "echo flag")
    text = job.dry_run_text()
    assert "partition: gpu  (site defaults: della)\n" in text
    assert "account: mine  (flag)\n" in text
    assert "setup: 3 line(s), in the script below  (site defaults: della + flag)\n" in text
    assert "#SBATCH --cpus-per-gpu=8\n" in text and "#SBATCH --mem-per-gpu=32G\n" in text
    # A job without GPUs keeps the site's partition, not its per-GPU values.
    cpu_only = plan(module="m", gpus_per_node=0).spec
    assert cpu_only.partition == "gpu" and cpu_only.cpus_per_gpu is None
    # $CLUSTERTRAIN_SITE names the entry itself; a local run takes none.
    monkeypatch.setenv("CLUSTERTRAIN_SITE", "other")
    assert plan(module="m").spec.partition == "cpu"
    assert plan(module="m", node_record=False).spec.partition is None


def test_no_file_or_no_entry_is_no_defaults(sites: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERTRAIN_SITE", "della")
    assert site.defaults() is None
    sites.write_text("other: {partition: cpu}\n")
    assert site.defaults() is None
    sites.write_text("")
    assert site.defaults() is None


def test_the_dry_run_says_where_each_value_came_from(sites: Path, tmp_path: Path) -> None:
    sites.write_text(SITES)
    job = tmp_path / "job.yaml"
    job.write_text("module: jobs.mnist.train\ngpus_per_node: 2\npartition: debug\n")
    done = run_cli("submit", str(job), "--dry-run", "--nodes", "2",
                   env={"CLUSTERTRAIN_SITE": "della"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = done.stdout.split("#### where the values came from")[1]
    for line in [
        "partition: debug  (job file)",
        "account: proj-123  (site defaults: della)",
        "nodes: 2  (flag)",
        "cpus_per_gpu: 8  (site defaults: della)",
        "node_setup: 1 line(s), in the script below  (site defaults: della)",
    ]:
        assert f"\n{line}\n" in said, said
    assert "eval -- 'module load cudatoolkit/12.1' || " in done.stdout
    assert "eval -- 'ulimit -n 65536' || " in done.stdout
    # The CPU request clustertrain chooses says so too.
    done = run_cli("submit", str(job), "--dry-run")
    assert "\ncpus_per_gpu: 4  (default: 4 per GPU; a submission fits it to the partition's " in (
        done.stdout
    )


# (the file's content, the field its one line names ("{path}": the file), what it says)
BAD_FILES = [
    ("- della\n", "sites file", "must map cluster names to defaults"),
    ("della: gpu\n", "{path}: della", "'gpu'; must be a mapping of fields"),
    ("della: {partitio: gpu}\n", "{path}: della.partitio", "not a site default; those are"),
    ("della: {nodes: 4}\n", "{path}: della.nodes", "'4'; not a site default"),
    ("della: {partition: }\n", "{path}: della.partition", "None; give it a value"),
    ("della: {partition: 'gpu;reboot'}\n", "{path}: della.partition", "'gpu;reboot'; must be"),
    ("della: {cpus_per_gpu: 0}\n", "{path}: della.cpus_per_gpu", "0; must be an integer"),
    ("della: {cpus_per_gpu: 99999999}\n", "{path}: della.cpus_per_gpu", "from 1 to 256"),
    ("della: {mem_per_gpu: 12XB}\n", "{path}: della.mem_per_gpu", "'12XB'; must be a size"),
    ('della: {setup: ["a\\nb"]}\n', "{path}: della.setup[0]", "'a\\nb'; must be one line"),
    ('della: {node_setup: ["a\\0b"]}\n', "{path}: della.node_setup[0]", "without a NUL"),
    ("other: {qos: 'a b'}\ndella: {}\n", "{path}: other.qos", "'a b'"),  # checked whole
    ('"-oProxyCommand=x": {}\n', "{path}: cluster", "'-oProxyCommand=x'; must be"),
    ("true: {}\n", "{path}: cluster", "True; must be a cluster's name"),
    ("a: &x {partition: gpu}\ndella: *x\n", "sites file", "uses YAML anchors"),
    ("della: {}\ndella: {}\n", "della", "'(twice)'; a YAML file may set each key once"),
    ("della: [\n", "sites file", "is not valid YAML at line 2"),
    ("della: {partition: gpu}\n" + "# pad\n" * 50_000, "sites file", "larger than 262144 bytes"),
]


def _refused(done: object, field: str, says: str, sandbox: Path, called: Path) -> None:
    assert done.returncode == 2, done.stdout + done.stderr  # type: ignore[attr-defined]
    lines = done.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith(f"clustertrain: error: {field}: "), lines
    assert says in lines[0], lines
    assert not called.exists() and not (sandbox / "runs").exists()


@pytest.mark.parametrize(("content", "field", "says"), BAD_FILES)
def test_a_bad_sites_file_is_refused_in_one_line_before_anything_is_written(
    content: str, field: str, says: str, sites: Path, tmp_path: Path,
    fake_slurm: tuple[dict[str, str], Path],
) -> None:  # fmt: skip
    env, called = fake_slurm
    sites.write_text(content)
    done = run_cli("submit", "--nodes", "1", cwd=tmp_path,
                   env={**env, "CLUSTERTRAIN_SITE": "della"})  # fmt: skip
    _refused(done, field.replace("{path}", str(sites)), says, tmp_path, called)


@pytest.mark.parametrize(
    "how", ["symlink", "group-writable", "folder", "fifo", "not-utf8", "other-owner"]
)
def test_a_sites_file_not_yours_alone_is_refused(
    how: str, sites: Path, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    real = tmp_path / "elsewhere.yaml"
    real.write_text("della: {partition: gpu}\n")
    if how == "symlink":
        sites.symlink_to(real)
    elif how == "group-writable":
        sites.write_text("della: {partition: gpu}\n")
        sites.chmod(0o664)
    elif how == "folder":
        sites.mkdir()
    elif how == "fifo":
        os.mkfifo(sites)
    elif how == "not-utf8":
        sites.write_bytes(b"della: {partition: \xff}\n")
    else:
        if os.getuid() != 0:
            pytest.skip("giving a file to another user needs root")
        sites.write_text("della: {partition: gpu}\n")
        os.chown(sites, 65534, 65534)
    done = run_cli("submit", "--nodes", "1", cwd=tmp_path,
                   env={**env, "CLUSTERTRAIN_SITE": "della"})  # fmt: skip
    says = "must be UTF-8 text" if how == "not-utf8" else "keep it a file of yours alone"
    _refused(done, "sites file", says, tmp_path, called)


def test_a_site_name_that_is_not_one_is_refused(sites: Path) -> None:
    for bad in ("a b", "x" * 65, "../../etc", "a\nb"):
        with pytest.raises(FieldError, match="^CLUSTERTRAIN_SITE: "):
            site.site_name({"CLUSTERTRAIN_SITE": bad})
    assert site.site_name({"CLUSTERTRAIN_SITE": "", "SLURM_CONF": "/nonexistent"}) is None
