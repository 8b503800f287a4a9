"""The parts of ``bench/canvas.py`` (run that script; see bench/README.md), one concern each:

- :mod:`.client`: the client process of one run (a fresh one per canvas, variant and
  round): builds the app, times ``apply_async()`` of the canvas, counts the records;
- :mod:`.rounds`: one run: the private Redis emptied, the client started, its CPU and the
  redis-server's read around the publish, the broker's messages and the records checked;
- :mod:`.report`: the figures per canvas (rate, CPU per member, ratio to plain with its
  spread) and the verdict;
- :mod:`.cli`: the options and ``main`` (the rounds, variants interleaved).
"""
