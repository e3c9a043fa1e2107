"""clustertrain's version: the rendered scripts' headers and ``--version`` say it."""

__version__ = "0.1.0"
