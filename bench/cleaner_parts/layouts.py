"""Two layouts (``--compare-shards A,B``): the whole benchmark once per layout, each in a
process of its own (``cleaner.py --shards N --child``, driven over a pipe) with a
``redis-server`` of its own; they set up one after the other, then the measured passes
alternate between them pass by pass, the order swapped every round, so that both see the
same machine."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import threading
from typing import Any

from _common import BENCH_DIR, LineProcess, PrivateRedis, rotated

from cleaner_parts.passes import none_summary, stalled_summary
from cleaner_parts.run import Bench, shut_down
from cleaner_parts.scenario import STALLED_VARIANTS


class Child(LineProcess):
    """``cleaner.py`` for one layout (``--shards N --child``) in a process of its own, with
    its own ``redis-server``, driven step by step over its stdin/stdout (one JSON line per
    reply); what it prints goes to its stderr, relayed here with a ``[S=N]`` prefix."""

    def __init__(self, shards: int, args: argparse.Namespace) -> None:
        self.label = f"S={shards}"
        argv = ["--records", args.records, "--running", args.running,
                "--stalled", args.stalled, "--workers", args.workers, "--passes", args.passes,
                "--reps", args.reps, "--lost-after", args.lost_after, "--batch", args.batch,
                "--what-if", args.what_if, "--redis-server", args.redis_server,
                "--shards", shards, "--child"]
        if args.seed is not None:
            argv += ["--seed", args.seed]
        super().__init__([sys.executable, str(BENCH_DIR / "cleaner.py"), *map(str, argv)],
                         stderr=subprocess.PIPE, bufsize=1)
        self._relay = threading.Thread(target=self._relay_stderr, daemon=True)
        self._relay.start()

    def _relay_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            print(f"  [{self.label}] {line.rstrip()}", flush=True)

    def ask(self, command: str | None) -> Any:
        """Send ``command`` (``None``: send nothing) and return the next reply."""
        if command is not None:
            self.send(command)
        msg = self.reply()
        if msg is None:
            rc = self.proc.wait(30)
            self._relay.join(5)
            raise RuntimeError(f"{self.label}: the benchmark process exited ({rc})")
        if "error" in msg:
            raise RuntimeError(f"{self.label}: {msg['error']}")
        return msg["reply"]

    def close(self) -> None:
        """End of input: the child stops its ticker and its redis-server and exits."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.terminate()  # SIGTERM: the child's cleanup still runs
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._relay.join(5)


def child_main(args: argparse.Namespace) -> int:
    """One layout, driven by the parent (see Child): replies on stdout, prints on stderr."""
    proto = sys.stdout
    sys.stdout = sys.stderr

    def reply(**msg: Any) -> None:
        proto.write(json.dumps(msg, default=str) + "\n")
        proto.flush()

    def on_term(*_: Any) -> None:
        raise SystemExit(1)

    signal.signal(signal.SIGTERM, on_term)
    srv = PrivateRedis(args.redis_server)
    bench: Bench | None = None
    try:
        bench = Bench(args, srv)
        reply(reply=bench.setup())
        for line in sys.stdin:
            cmd = line.split()
            if cmd == ["none"]:
                reply(reply=bench.none_pass())
            elif cmd[:1] == ["stalled"] and len(cmd) == 3:
                reply(reply=bench.stalled_pass(cmd[1], cmd[2] == "1"))
            elif cmd == ["finish"]:
                reply(reply=bench.finish())
            else:
                reply(error=f"unknown command {line!r}")
                return 1
        return 0
    except RuntimeError as exc:
        reply(error=str(exc))
        return 1
    finally:
        shut_down(bench, srv)


def compare_layouts(args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    """The whole benchmark for both layouts of ``--compare-shards``: each process sets up
    (templates, loading) in turn, then the measured passes alternate between the two, pass
    by pass, the order swapped every round (A B, B A, ...), so that both see the same
    machine."""
    layouts: tuple[int, int] = args.compare
    children: dict[int, Child] = {}
    results: dict[int, dict[str, Any]] = {}
    try:
        for n in layouts:
            print(f"S={n}: setup in its own process, with its own redis-server ...",
                  flush=True)
            children[n] = Child(n, args)
            results[n] = children[n].ask(None)

        def rounds(count: int, command: str) -> dict[int, list[dict[str, Any]]]:
            out: dict[int, list[dict[str, Any]]] = {n: [] for n in layouts}
            for i in range(count):
                for n in rotated(layouts, i):
                    out[n].append(children[n].ask(command))
            return out

        print(f"{args.passes} passes with none stalled per layout, interleaved ...",
              flush=True)
        for n, runs in rounds(args.passes, "none").items():
            results[n]["none"] = v = none_summary(runs)
            w = v["wall_ms"]
            print(f"  S={n}: median {w['median']:.2f} ms, p95 {w['p95']:.2f} ms, "
                  f"max {w['max']:.2f} ms", flush=True)
        for n in layouts:
            results[n]["stalled"] = {}
        for variant, recover, label in STALLED_VARIANTS:
            print(f"{args.reps} passes with {args.stalled:,} stalled ({label}) per layout, "
                  "interleaved ...", flush=True)
            for n, runs in rounds(args.reps, f"stalled {variant} {int(recover)}").items():
                results[n]["stalled"][label] = v = stalled_summary(runs)
                print(f"  S={n}: " + ", ".join(f"{p['wall_ms']:.1f} ms" for p in v["passes"]),
                      flush=True)
        for n in layouts:
            results[n].update(children[n].ask("finish"))
    finally:
        for child in children.values():
            child.close()
    return results
