"""The checks of job-file fields: each turns a value from a job file or a flag into the spec's
type, or raises :class:`FieldError` naming the field, the value and the fix.

Every field of :class:`clustertrain.spec.JobSpec` names its check in its own declaration; this
module only defines them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any, Literal, get_args

from clustertrain import protocol
from clustertrain.errors import FieldError
from clustertrain.spec import sbatch
from clustertrain.spec.jobfile import Plain, flag_mapping

Launcher = Literal["torchrun", "accelerate"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
ContainerRuntime = Literal["pyxis", "apptainer", "oci"]
CONTAINER_RUNTIMES: tuple[str, ...] = get_args(ContainerRuntime)

# Slurm's own names (partition, account, qos) are plain words; refusing the rest costs nothing.
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Numbers of at most 12 digits: preflight converts them, and no node has 10^12 MB.
_MEM = re.compile(r"\d{1,12}[KMGT]?")
_DEPENDENCY = re.compile(r"[a-z]+(:[0-9_+]{1,24})+([,?][a-z]+(:[0-9_+]{1,24})+){0,64}|singleton")
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|\[\]*:()!-]{1,256}")
_MAIL_TYPES = {
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
}
# Linux interface names (at most 15 bytes, no '/', ':' or space), comma-separated for gloo.
_IFNAMES = re.compile(r"[A-Za-z0-9_.-]{1,15}(?:,[A-Za-z0-9_.-]{1,15})*")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+")
# Slurm's time formats (sbatch(1), --time); "25:99" is minutes:seconds with 99 seconds: refused.
# At most 9 digits a number: a longer one is no time limit, and Python refuses to convert
# numbers of over 4,300 digits (a traceback where a user should get one line).
_TIME = re.compile(
    r"(?:(?P<d>\d{1,9})-(?P<dh>\d{1,9})(?::(?P<dm>\d{1,9})(?::(?P<ds>\d{1,9}))?)?)"
    r"|(?:(?P<h>\d{1,9}):(?P<m>\d{1,9}):(?P<s>\d{1,9}))|(?:(?P<mm>\d{1,9}):(?P<ss>\d{1,9}))"
    r"|(?P<min>\d{1,9})"
)
_MAX_TIME_S = 365 * 24 * 3600


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def int_range(low: int, high: int) -> Any:
    def check(name: str, value: Any) -> int:
        valid = f"must be an integer from {low} to {high}"
        if isinstance(value, Plain):  # unquoted in a job file: decimal digits only
            if re.fullmatch(r"0[0-9]+", value):
                raise FieldError(name, value, valid + ", without a leading zero")
            if not re.fullmatch(r"-?[0-9]{1,12}", value):
                raise FieldError(name, value, valid)
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise FieldError(name, value, valid)
        return value

    return check


def optional_int(low: int, high: int) -> Any:
    check_int = int_range(low, high)
    return lambda name, value: None if value is None else check_int(name, value)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise FieldError(name, value, "must be true or false")
    return value


def _text(name: str, value: Any, max_len: int = 4096) -> str:
    if not isinstance(value, str):
        raise FieldError(name, value, "must be a string")
    if "\x00" in value:
        raise FieldError(name, value, "must not contain a NUL byte")
    if len(value) > max_len:
        raise FieldError(name, value[:40] + "...", f"must be at most {max_len} characters")
    return str(value)


def pattern(regex: re.Pattern[str], valid: str) -> Any:
    def check(name: str, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not regex.fullmatch(value):
            raise FieldError(name, value, valid)
        return value

    return check


def name_text(name: str, value: Any) -> str:
    text = _text(name, value, max_len=128)
    if not text or not text.isprintable() or "%" in text or sbatch.UNSAFE.search(text):
        raise FieldError(
            name,
            value,
            "must be 1-128 printable characters without '%', '\"' or '\\' (e.g. mnist-ddp)",
        )
    return text


def optional_name(name: str, value: Any) -> str | None:
    return None if value is None else name_text(name, value)


def name_from(entrypoint: str) -> str:
    """A job's name when it gives none: its script's or module's last part, e.g. ``train``
    for ``jobs/train.py`` and for ``pkg.train``, in the characters any name may hold."""
    stem = entrypoint.rstrip("/").rsplit("/", 1)[-1].removesuffix(".py").rsplit(".", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.+-]", "-", stem)[:64].strip("-") or "job"


def time_seconds(text: str) -> int | None:
    """Seconds in a Slurm time limit string, or None if it is not one Slurm accepts."""
    match = _TIME.fullmatch(text)
    if not match:
        return None
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    days, hours = g.get("d", 0), g.get("h", g.get("dh", 0))
    minutes = g.get("m", g.get("dm", g.get("mm", g.get("min", 0))))
    seconds = g.get("s", g.get("ds", g.get("ss", 0)))
    bounded_minutes = "min" not in g and ("h" in g or "dm" in g)
    if seconds > 59 or (bounded_minutes and minutes > 59) or ("dh" in g and hours > 23):
        return None
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def time_limit(name: str, value: Any) -> str:
    """Validate a Slurm time limit and normalise it to [D-]HH:MM:SS."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    total = time_seconds(text) if isinstance(text, str) else None
    valid = "use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 01:30:00)"
    if total is None:
        raise FieldError(name, value, valid)
    if not 60 <= total <= _MAX_TIME_S:
        raise FieldError(name, value, "must be between 1 minute and 365 days; " + valid)
    return format_time(total)


def format_time(seconds: int) -> str:
    """Seconds as Slurm's [D-]HH:MM:SS."""
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def launcher(name: str, value: Any) -> str:
    if value not in LAUNCHERS:
        raise FieldError(name, value, "must be one of: " + ", ".join(LAUNCHERS))
    return str(value)


def metric(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not protocol.METRIC_NAME.fullmatch(value):
        raise FieldError(
            name, value, "must be a metric's name: a letter or _, then up to 63 letters, digits or "
            "_ . / - (e.g. test_acc, val/loss), as the script logs it",
        )  # fmt: skip
    return value


def metric_mode(name: str, value: Any) -> str:
    if value not in protocol.METRIC_MODES:
        raise FieldError(name, value, "must be max (higher is better) or min (lower is better)")
    return str(value)


def module(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 256 or not _MODULE.fullmatch(value):
        raise FieldError(name, value, "must be a dotted Python module name, e.g. jobs.mnist.train")
    return value


def script(name: str, value: Any) -> str | None:
    if value is None:
        return None
    text = _text(name, value, max_len=1024)
    if not text or text.startswith("-") or not text.isprintable():
        raise FieldError(
            name, value, "must be the path of a Python script, e.g. jobs/mnist/train.py"
        )
    return text


def words(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise FieldError(name, value, "must be a list of strings, e.g. [--epochs, '3']")
    return tuple(_text(f"{name}[{i}]", _as_text(f"{name}[{i}]", v)) for i, v in enumerate(value))


# A prepare step's commands: at most this many, each at most this many words.
_MAX_COMMANDS, _MAX_WORDS = 16, 256


def commands(name: str, value: Any) -> tuple[tuple[str, ...], ...]:
    """Commands run on the submit host before queueing, each a list of words (never a shell
    line): ``[python, -m, jobs.mnist.data]`` is one command, a list of such lists several."""
    example = "a command as a list of words, e.g. [python, -m, jobs.mnist.data], or a list of them"
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise FieldError(name, value, "must be " + example)
    commands = value if value and not isinstance(value[0], str) else [value] if value else []
    if len(commands) > _MAX_COMMANDS:
        raise FieldError(name, f"{len(commands)} commands", f"must be at most {_MAX_COMMANDS}")
    checked = []
    for i, command in enumerate(commands):
        where = f"{name}[{i}]"
        if isinstance(command, str) or not isinstance(command, list | tuple) or not command:
            raise FieldError(where, command, "must be " + example)
        if len(command) > _MAX_WORDS:
            raise FieldError(where, f"{len(command)} words", f"must be at most {_MAX_WORDS}")
        argv = words(where, command)
        if not argv[0] or argv[0].startswith("-") or not argv[0].isprintable():
            raise FieldError(where, argv[0], "must start with the program to run, e.g. python")
        checked.append(argv)
    return tuple(checked)


def split_words(command: str) -> list[str]:
    """A --prepare value as words, split as a shell would split it; nothing runs it in one."""

    try:
        return shlex.split(command)
    except ValueError as exc:
        raise FieldError("prepare", command, f"cannot be split into words ({exc})") from None


def env_mapping(
    name: str, value: Any, allowed: frozenset[str] = frozenset()
) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE pairs; keys the scripts or bash read themselves are refused, but ``allowed``."""
    value = flag_mapping(name, value, f"--{name.replace('_', '-')} OMP_NUM_THREADS=1")
    if not isinstance(value, Mapping):
        raise FieldError(name, value, "must be a mapping of KEY: value")
    checked = []
    for key, val in value.items():
        if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
            raise FieldError(
                f"{name} key", key, "must be a shell variable name like OMP_NUM_THREADS"
            )
        if _reserved_env_key(key) and key not in allowed:
            raise FieldError(
                f"{name} key",
                key,
                "is read by bash, Slurm, the launcher or clustertrain's own scripts; "
                "use the matching field (e.g. --venv, --cpus-per-task) or another name",
            )
        checked.append((key, _text(f"{name}.{key}", _as_text(f"{name}.{key}", val))))
    return tuple(checked)


def _as_text(name: str, value: Any) -> Any:
    """A value where text is meant. Job files keep unquoted scalars as written (``1.10`` stays
    1.10, ``on`` stays on, see clustertrain.spec.jobfile); a number given explicitly (Python, a
    ``!!int`` tag) is its decimal text; true/false is refused rather than guessed."""
    if isinstance(value, bool):
        raise FieldError(name, value, f"must be text; quote it in the job file ('{value}')")
    return str(value) if isinstance(value, int | float) else value


# Bash's own variables: they run code (BASH_ENV, ENV, PROMPT_COMMAND), change how the script
# is read (SHELLOPTS, BASHOPTS, IFS, GLOBIGNORE, CDPATH) or are read-only (UID, EUID, PPID...).
_BASH_VARIABLES = frozenset(
    """
    ENV SHELLOPTS BASHOPTS IFS PS4 PROMPT_COMMAND GLOBIGNORE CDPATH POSIXLY_CORRECT
    UID EUID PPID GROUPS RANDOM SRANDOM SECONDS LINENO OPTIND OPTARG OPTERR HOSTNAME HOSTTYPE
    MACHTYPE OSTYPE PWD OLDPWD SHELL SHLVL FUNCNAME HISTFILE TMOUT EPOCHREALTIME EPOCHSECONDS
    PIPESTATUS REPLY COMP_WORDBREAKS DIRSTACK
    """.split()  # noqa: SIM905 - a word list reads better than a hundred quoted strings
)


def _reserved_env_key(key: str) -> bool:
    upper = key.upper()
    return (
        upper in _BASH_VARIABLES
        or upper.startswith(("BASH", "COMP_", *protocol.SCRIPT_PREFIXES))
        or key in protocol.SCRIPT_VARIABLES
    )


def sbatch_options(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise FieldError(name, value, "must be a list like ['--reservation=gpu-maint']")
    for option in value:
        if not isinstance(option, str):
            raise FieldError(name, option, "must look like --option or --option=value")
        problem = sbatch.option_problem(option)
        if problem:
            raise FieldError(name, option, problem)
    return tuple(str(option) for option in value)


def mail_type(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not all(t in _MAIL_TYPES for t in value.split(",")):
        raise FieldError(name, value, "must be a comma list of " + ", ".join(sorted(_MAIL_TYPES)))
    return str(value)


def venv(name: str, value: Any) -> str | None:
    if value is None:
        return None
    text = _text(name, value, max_len=1024)
    if not text.startswith("/") or not text.isprintable():
        raise FieldError(name, value, "must be the absolute path of a virtual environment")
    return text


# Image names (nvcr.io#nvidia/pytorch:24.01-py3, docker://..., /images/torch.sif): one word,
# never an option of the runtime's own command line.
_IMAGE = re.compile(r"[A-Za-z0-9_./:#@+=~][A-Za-z0-9_./:#@+=~-]{0,1023}")
# pyxis and apptainer both read mounts as a comma-separated list of SRC[:DST[:FLAGS]].
_MOUNT_PATH = r"/[A-Za-z0-9_./@+=~-]*"
_MOUNT = re.compile(rf"(?P<src>{_MOUNT_PATH})(?::(?P<dst>{_MOUNT_PATH}))?(?::(?P<mode>ro|rw))?")


# What `logs --follow` may relay to while it follows (clustertrain.track's trackers).
TRACKERS = ("mlflow", "tensorboard", "wandb")


def trackers(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise FieldError(name, value, "must be a list like ['tensorboard', 'mlflow']")
    for tracker in value:
        if tracker not in TRACKERS:
            raise FieldError(name, tracker, "must be one of: " + ", ".join(TRACKERS))
    return tuple(dict.fromkeys(str(tracker) for tracker in value))


def container_runtime(name: str, value: Any) -> str | None:
    if value is not None and value not in CONTAINER_RUNTIMES:
        raise FieldError(name, value, "must be one of: " + ", ".join(CONTAINER_RUNTIMES))
    return value


def container_mounts(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise FieldError(name, value, "must be a list like ['/datasets:/data:ro']")
    for mount in value:
        if not isinstance(mount, str) or not _MOUNT.fullmatch(mount):
            raise FieldError(
                name,
                mount,
                "must be SRC[:DST[:ro]] with absolute paths of letters, digits and _./@+=~- "
                "(e.g. /datasets:/data:ro)",
            )
    return tuple(str(mount) for mount in value)


def container_env(name: str, value: Any) -> tuple[tuple[str, str], ...]:
    # PATH too: an image's tools may live elsewhere (/opt/conda/bin), and only the container
    # side reads these.
    return env_mapping(name, value, allowed=frozenset({"PATH"}))


# The checks that are a pattern: each field of JobSpec names its check (clustertrain.spec).
partition = pattern(_SLURM_NAME, "must be a Slurm partition name like gpu or debug")
account = pattern(_SLURM_NAME, "must be a Slurm account name like proj-123")
qos = pattern(_SLURM_NAME, "must be a Slurm QOS name like normal")
constraint = pattern(_CONSTRAINT, "must be a Slurm feature expression like 'a100&ib'")
mem = pattern(_MEM, "must be a size like 64G or 0 (all of a node's memory)")
mail_user = pattern(_EMAIL, "must be an e-mail address")
dependency = pattern(_DEPENDENCY, "must be like afterok:123 or afterany:1:2")
socket_ifname = pattern(_IFNAMES, "must be interface names like eth0 or ib0,ib1")
container_image = pattern(
    _IMAGE, "must be one image name or path, e.g. /images/torch.sif or nvcr.io#nvidia/pytorch"
)
