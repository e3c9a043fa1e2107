"""Example jobs for clustertrain; each folder is a package run as `python -m jobs.NAME.train`."""
