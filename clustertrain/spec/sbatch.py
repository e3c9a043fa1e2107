"""How sbatch itself reads ``#SBATCH`` lines, which is not how bash reads them.

Seen with Slurm 22.05's sbatch (held jobs, compared with ``scontrol show job``), and still so
in 24.11's but for ``\\ `` (since 24.05 a backslash keeps a space in the word): a line holds
several options (``--job-name=x\\ --outp=/tmp/evil`` set the job's output file), a backslash
escapes even inside single quotes (``'a\\'b'`` is one word), an unquoted ``#`` starts a comment,
and long options may be abbreviated (``--outp`` is ``--output``). Double quotes are read as
quotes, with everything but ``"`` and ``\\`` literal inside them.

So a value is written bare when it holds only characters that mean nothing to sbatch, else
inside double quotes; a value with ``"``, ``\\`` or a control character is refused. Extra options
must be spelled in full from sbatch's own list, and never one that clustertrain sets.
"""

from __future__ import annotations

import re

# Characters sbatch reads literally outside quotes.
_BARE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
UNSAFE = re.compile(r'["\\\x00-\x1f\x7f]')

# sbatch 22.05's long options (sbatch --help and sbatch(1)), and those 24.11 added.
LONG_OPTIONS = frozenset(
    """
    account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment
    constraint container contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu
    cpus-per-task deadline delay-boot dependency distribution error exclude exclusive export
    export-file extra-node-info get-user-env gid gpu-bind gpu-freq gpus gpus-per-node
    gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs input job-name
    kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu
    mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks
    ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output
    overcommit oversubscribe parsable partition power priority profile propagate qos quiet
    reboot requeue reservation signal sockets-per-node spread-job switches test-only
    thread-spec threads-per-core time time-min tmp uid usage use-min-nodes verbose version
    wait wckey wrap
    """.split()  # noqa: SIM905 - a word list reads better than a hundred quoted strings
) | frozenset(
    # sbatch 24.11's own (docs/slurm-versions.md): an older sbatch refuses them itself.
    ("container-id", "oom-kill-step", "resv-ports", "tres-bind", "tres-per-task")
)

# Set by the renderer, or with a field of their own: a second copy would contradict the
# script (node count, log paths, the requeue protocol) or replace it (wrap, export, array).
OWNED = frozenset(
    """
    nodes ntasks ntasks-per-node gpus-per-node gres gpus cpus-per-task cpus-per-gpu mem-per-gpu
    time job-name output
    error input signal chdir open-mode requeue no-requeue wrap export export-file array
    partition account qos constraint exclusive mem mail-type mail-user dependency exclude
    get-user-env parsable wait help usage version test-only tres-per-task
    """.split()  # noqa: SIM905 - a word list reads better than a hundred quoted strings
)


def quote(value: str) -> str:
    """``value`` as sbatch must see it on a ``#SBATCH`` line: bare, or in double quotes."""
    if UNSAFE.search(value):
        raise ValueError(f"cannot be written on an #SBATCH line: {value!r}")
    return value if _BARE.fullmatch(value) else f'"{value}"'


def option_problem(option: str) -> str | None:
    """Why ``--name[=value]`` cannot be passed through, or None if it can."""
    name, _, value = option.partition("=")
    key = name[2:]
    if not name.startswith("--") or key not in LONG_OPTIONS:
        return "must be a full sbatch long option, e.g. --reservation=maint (no abbreviations)"
    if key in OWNED:
        return "is set by clustertrain; use its own field instead"
    if UNSAFE.search(value):
        return "must not contain a double quote, a backslash or a control character"
    return None
