"""What ``status`` says of a finished job from Slurm's accounting: the job's exit code and time,
each step's memory and CPU time, and nothing of what sacct printed that is no state or code."""

from __future__ import annotations

from clustertrain.backends.slurm.parse import parse_accounting

SACCT = """\
7|COMPLETED|0:0|41||00:40.100
7.batch|COMPLETED|0:0|41|11012K|00:00.012
7.0|COMPLETED|0:0|40|112544K|01:20.309
"""


def test_status_lines_name_the_exit_code_and_each_steps_memory_and_cpu() -> None:
    found = parse_accounting("7", SACCT)
    assert found is not None
    assert found.lines() == [
        "accounting (sacct): COMPLETED, exit code 0:0, 41 s",
        "  step batch: COMPLETED, exit code 0:0, 41 s, MaxRSS 10.8 MiB, CPU time 0.0 s",
        "  step 0: COMPLETED, exit code 0:0, 40 s, MaxRSS 109.9 MiB, CPU time 80.3 s",
    ]


def test_what_is_no_state_or_exit_code_is_not_printed() -> None:
    hostile = "7|\x1b[2J;rm -rf|1:0 $(x)|5||\n7.0|OUT_OF_MEMORY|0:125|5|2G|\n"
    found = parse_accounting("7", hostile)
    assert found is not None
    lines = found.lines()
    assert lines[0] == "accounting (sacct): (an unreadable state), exit code unknown, 5 s"
    assert lines[1] == "  step 0: OUT_OF_MEMORY, exit code 0:125, 5 s, MaxRSS 2048.0 MiB"
    assert all(line.isprintable() for line in lines)


def test_who_cancelled_is_kept_only_as_a_uid() -> None:
    cancelled = parse_accounting("7", "7|CANCELLED by 1000|0:15|5||\n")
    forged = parse_accounting("7", "7|CANCELLED by $(id)|0:15|5||\n")
    assert cancelled is not None and cancelled.state == "CANCELLED"
    assert cancelled.cancelled_by == "1000"
    assert forged is not None and forged.cancelled_by == ""
