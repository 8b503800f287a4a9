"""The parts of ``run.py`` (``scripts/example``), by purpose.

- ``ui``: terminal output (numbered steps, the status line, colours);
- ``processes``: starting, watching and stopping every process the command starts;
- ``setup_steps``: Redis, the database and the admin user, workers, beat and web server;
- ``scenario``: the tasks submitted, what is done to them while they run, the live table;
- ``report``: the ``--report`` JSON file and the summary printed at the end;
- ``errors``: the exceptions that end the command early (each has its exit status).

``run.py`` puts ``example_project/`` on ``sys.path``, so these import as ``runner.*``.
"""
