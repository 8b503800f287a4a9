"""The parts of ``bench/overhead.py`` (run that script; see bench/README.md), one concern each:

- :mod:`.variants`: what is measured: plain Celery, ``track_started`` and JobbersTask's
  variants, each an app module and its environment;
- :mod:`.rounds`: one (pool, variant) of one round with a fresh worker and a fresh client,
  every process's CPU, the Redis commands and requests around it;
- :mod:`.figures`: a run's figures per task, and the script-run commands' time estimated;
- :mod:`.report`: the targets, the tables per pool, the ratios to plain and the verdict;
- :mod:`.cli`: the options and ``main`` (the rounds, interleaved).
"""
