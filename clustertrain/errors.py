"""Errors a user can fix. The CLI prints them as one line and exits with status 2."""


class UserError(Exception):
    """Bad input or an unusable environment, with what was wrong and how to fix it."""


class FieldError(UserError):
    """A value of the job spec (from a flag or a job file) that is not valid."""

    def __init__(self, field: str, value: object, valid: str) -> None:
        self.field, self.value, self.valid = field, value, valid
        if isinstance(value, int) and not -(10**80) < value < 10**80:
            # repr of an int of thousands of digits raises (Python's 4,300-digit limit).
            shown = f"an integer of about {value.bit_length() * 3 // 10} digits"
        else:
            shown = repr(value)
        if len(shown) > 80:
            shown = shown[:60] + f"... ({len(shown)} characters)"
        # A field's name can come from a job file's key: one that is not a plain name is shown
        # quoted, so a newline or an escape in it never splits or colours the one line.
        name = field if field.isprintable() else repr(field)
        super().__init__(f"{name}: invalid value {shown}; {valid}")


class SchedulerUnreachable(UserError):
    """The scheduler cannot be asked at all (no controller, no configuration, no commands): no
    word about any job. What a job's run folder says still stands
    (:mod:`clustertrain.runs.folderstate`)."""
