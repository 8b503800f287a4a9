"""The parts of ``bench/cleaner.py`` (run that script; see bench/README.md), one concern each:

- :mod:`.scenario`: the world measured: the bench app and its two tasks, the live workers and
  their liveness ticker, the deployment's clocks, how tasks stall;
- :mod:`.templates`: a few records written by the real code, read back and generalised;
- :mod:`.loader`: the Lua loader that copies them by the million, and its fidelity check;
- :mod:`.memory`: Redis memory per record (and the what-if variants);
- :mod:`.passes`: the measured cleaner passes, timed part by part, and their checks;
- :mod:`.run`: one layout's whole run, in order;
- :mod:`.layouts`: two layouts, each in a process of its own, their passes interleaved;
- :mod:`.report`: the targets, the summary and the comparison;
- :mod:`.cli`: the options and ``main``.
"""
