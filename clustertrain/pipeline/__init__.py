"""From a job to a queued job, read top to bottom: ``submit = schedule(plan(...))``, as TorchX's
``submit_dryrun`` then ``schedule``.

  plan.py        the dry run: spec, your node record's exclusions, the rendered scripts
  prepare.py     the job's prepare commands, on the submit host, once, before queueing
  entrypoint.py  the job's script or module, found where it will run, before queueing
  schedule.py    the backend's checks, those two steps, the run folder, the backend's submission
"""
