"""Private Redis topologies for fault tests: a Sentinel set (master, replica, three
sentinels), a Redis with AOF that can be killed and restarted on the same port, and a
Redis Cluster of three masters and their replicas.

Everything runs on free loopback ports with its own config file and directory in a temp
dir, and is torn down at the end; the machine's shared Redis is never touched. A missing
``redis-server`` binary fails the test (never skips).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from tests.conftest import free_port, wait_for

MASTER_NAME = "jobbers-test"


def _binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server); the "
                    "Sentinel and restart tests need a real one", pytrace=False)
    return binary


def _answers(port: int) -> bool:
    client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class _Process:
    """One redis-server (or sentinel) started from a config file."""

    def __init__(self, conf: Path, *extra: str) -> None:
        self.conf = conf
        self.extra = extra
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, port: int) -> None:
        self.port = port
        log = (self.conf.parent / f"{self.conf.stem}.log").open("ab")
        with log:
            self.proc = subprocess.Popen([_binary(), str(self.conf), *self.extra],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        wait_for(lambda: self._alive() and _answers(port), timeout=15,
                 message=f"redis-server {self.conf.name} on port {port}")

    def _alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.conf.parent / f"{self.conf.stem}.log").read_text(errors="replace")
            raise AssertionError(f"{self.conf.name} exited:\n{log[-3000:]}")
        return True

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class SentinelSet:
    """A master, one replica and three sentinels that monitor them as ``MASTER_NAME``.

    Sentinels judge a master down after 1 s and may retry a failover after 5 s, so a
    ``SENTINEL FAILOVER`` completes in a second or two.
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jobbers-sentinel-"))
        self.servers: list[_Process] = []
        self.sentinels: list[_Process] = []

    def _server(self, name: str, port: int, replica_of: int | None = None) -> _Process:
        lines = [f"port {port}", "bind 127.0.0.1", f"dir {self.dir}", "save \"\"",
                 "appendonly no", f"dbfilename {name}.rdb", "maxmemory-policy noeviction",
                 "repl-diskless-sync yes", "repl-diskless-sync-delay 0"]
        if replica_of:
            lines.append(f"replicaof 127.0.0.1 {replica_of}")
        conf = self.dir / f"{name}.conf"
        conf.write_text("\n".join(lines) + "\n")
        server = _Process(conf)
        server.start(port)
        self.servers.append(server)
        return server

    def start(self) -> SentinelSet:
        master = self._server("master", free_port())
        replica = self._server("replica", free_port(), replica_of=master.port)
        wait_for(lambda: self._link_up(replica.port), timeout=15, message="replica in sync")
        for n in range(3):
            port = free_port()
            conf = self.dir / f"sentinel{n}.conf"  # sentinel rewrites it: it must be writable
            conf.write_text("\n".join([
                f"port {port}", "bind 127.0.0.1", f"dir {self.dir}",
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master.port} 2",
                f"sentinel down-after-milliseconds {MASTER_NAME} 1000",
                f"sentinel failover-timeout {MASTER_NAME} 5000",
                f"sentinel parallel-syncs {MASTER_NAME} 1",
            ]) + "\n")
            sentinel = _Process(conf, "--sentinel")
            sentinel.start(port)
            self.sentinels.append(sentinel)
        wait_for(self.in_sync, timeout=30, interval=0.2,
                 message="the sentinels to see each other and the replica")
        return self

    @staticmethod
    def _link_up(port: int) -> bool:
        info = redis.Redis(port=port).info("replication")
        return info.get("master_link_status") == "up"

    def in_sync(self) -> bool:
        """Every sentinel sees the other two and a replica in sync with the master (after a
        failover: once the old master replicates the new one; another failover before then
        would promote a replica without the writes since the last one)."""
        for sentinel in self.sentinels:
            client = redis.Redis(port=sentinel.port, decode_responses=True)
            others = client.sentinel_sentinels(MASTER_NAME)
            replicas = client.sentinel_slaves(MASTER_NAME)
            if len(others) < 2 or not any(
                    r["is_slave"] and not r["is_sdown"] and r["master-link-status"] == "ok"
                    for r in replicas):
                return False
        return True

    @property
    def url(self) -> str:
        """The kombu-style URL: ``sentinel://host:port;sentinel://...``."""
        return ";".join(f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels)

    def master_port(self) -> int:
        client = redis.Redis(port=self.sentinels[0].port, decode_responses=True)
        return int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1])

    def failover(self) -> tuple[int, int]:
        """``SENTINEL FAILOVER``; returns (old, new) master ports once every sentinel and the
        new master agree (the new master answers as a master)."""
        old = self.master_port()
        sentinel = redis.Redis(port=self.sentinels[0].port, decode_responses=True)
        sentinel.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)

        def switched() -> int | None:
            ports = {int(redis.Redis(port=s.port, decode_responses=True)
                         .sentinel_get_master_addr_by_name(MASTER_NAME)[1])
                     for s in self.sentinels}
            if len(ports) != 1 or old in ports:
                return None
            new = ports.pop()
            role = redis.Redis(port=new, decode_responses=True).info("replication")["role"]
            return new if role == "master" else None

        new = wait_for(switched, timeout=30, interval=0.05, message="the failover")
        return old, int(new)

    def stop(self) -> None:
        for process in (*self.sentinels, *self.servers):
            with contextlib.suppress(Exception):
                process.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RestartableRedis:
    """A redis-server with AOF (``appendfsync everysec``, Redis' default, or ``always``) that
    can be killed with SIGKILL and restarted on the same port and directory."""

    def __init__(self, appendfsync: str = "everysec") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jobbers-aof-"))
        self.port = free_port()
        conf = self.dir / "redis.conf"
        conf.write_text("\n".join([
            f"port {self.port}", "bind 127.0.0.1", f"dir {self.dir}", "save \"\"",
            "appendonly yes", f"appendfsync {appendfsync}", "maxmemory-policy noeviction",
        ]) + "\n")
        self.server = _Process(conf)

    def start(self) -> RestartableRedis:
        self.server.start(self.port)
        return self

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def kill(self) -> None:
        self.server.kill()

    def restart(self) -> None:
        self.server.start(self.port)

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class ClusterSet:
    """A Redis Cluster of three masters, each with one replica, made by ``redis-cli --cluster
    create`` (contiguous slot ranges, one third each). Nodes judge a peer failed after 2 s."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jobbers-cluster-"))
        self.servers: list[_Process] = []

    def start(self) -> ClusterSet:
        for n in range(6):
            port = _cluster_port()
            conf = self.dir / f"node{n}.conf"
            conf.write_text("\n".join([
                f"port {port}", "bind 127.0.0.1", f"dir {self.dir}", "save \"\"",
                "appendonly no", f"dbfilename node{n}.rdb", "maxmemory-policy noeviction",
                "cluster-enabled yes", f"cluster-config-file nodes{n}.conf",
                "cluster-node-timeout 2000", "repl-diskless-sync yes",
                "repl-diskless-sync-delay 0",
            ]) + "\n")
            server = _Process(conf)
            server.start(port)
            self.servers.append(server)
        cli = shutil.which("redis-cli")
        if cli is None:
            pytest.fail("redis-cli is not installed (apt-get install redis-tools)",
                        pytrace=False)
        subprocess.run([cli, "--cluster", "create",
                        *(f"127.0.0.1:{s.port}" for s in self.servers),
                        "--cluster-replicas", "1", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        wait_for(self._ok, timeout=60, interval=0.1, message="the cluster to be ok")
        return self

    def _ok(self) -> bool:
        for server in self.servers:
            node = redis.Redis(port=server.port, decode_responses=True)
            if node.cluster("info").get("cluster_state") != "ok":
                return False
            replication = node.info("replication")
            if replication["role"] != "master" and replication.get("master_link_status") != "up":
                return False
        return len(self.masters()) == 3

    def masters(self) -> list[int]:
        """The ports of the nodes that are masters now."""
        return [s.port for s in self.servers
                if redis.Redis(port=s.port).info("replication")["role"] == "master"]

    def replica_of(self, port: int) -> int:
        for server in self.servers:
            info = redis.Redis(port=server.port, decode_responses=True).info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == port:
                return server.port
        raise AssertionError(f"no replica of {port}")

    def failover(self, master: int) -> int:
        """``CLUSTER FAILOVER`` on ``master``'s replica (the coordinated, manual one: the
        replica catches up first); returns the new master's port once every node serves
        the old master's slots from it."""
        replica = self.replica_of(master)
        redis.Redis(port=replica).execute_command("CLUSTER", "FAILOVER")

        def switched() -> bool:
            if redis.Redis(port=replica).info("replication")["role"] != "master":
                return False
            return all(self._serves(s.port, replica) for s in self.servers)

        wait_for(switched, timeout=30, interval=0.05, message="the failover")
        return replica

    @staticmethod
    def _serves(port: int, master: int) -> bool:
        slots = redis.Redis(port=port, decode_responses=True).cluster("slots")
        return any(int(node[1]) == master for _start, _end, node, *_ in slots)

    def url(self, n: int = 0) -> str:
        return f"redis://127.0.0.1:{self.servers[n].port}/0"

    def client(self) -> redis.cluster.RedisCluster:
        return redis.cluster.RedisCluster(host="127.0.0.1", port=self.servers[0].port,
                                          decode_responses=True)

    def flush(self) -> None:
        for port in self.masters():
            redis.Redis(port=port).flushall()

    def node_ids(self) -> dict[int, str]:
        """Port -> node id."""
        ids = {}
        for server in self.servers:  # masters and replicas
            ids[server.port] = redis.Redis(port=server.port, decode_responses=True
                                           ).execute_command("CLUSTER", "MYID")
        return ids

    def owner(self, slot: int) -> int:
        """The port of the master that serves ``slot``."""
        for start, end, (_host, port, *_), *_ in redis.Redis(
                port=self.servers[0].port, decode_responses=True).cluster("slots"):
            if start <= slot <= end:
                return int(port)
        raise AssertionError(f"slot {slot} is not served")

    def keys_per_master(self) -> dict[int, int]:
        return {port: int(redis.Redis(port=port).dbsize()) for port in self.masters()}

    def redirections(self) -> dict[str, int]:
        """``MOVED``, ``ASK`` and ``TRYAGAIN`` replies the masters gave so far (``INFO
        errorstats``, summed)."""
        counts: dict[str, int] = {}
        for server in self.servers:
            stats = redis.Redis(port=server.port, decode_responses=True).info("errorstats")
            for name, value in stats.items():
                code = name.removeprefix("errorstat_")
                if code in ("MOVED", "ASK", "TRYAGAIN"):
                    counts[code] = counts.get(code, 0) + int(value["count"])
        return counts

    def migrate_slot(self, slot: int, to_port: int, batch: int = 10,
                     between: Any = None) -> int:
        """Move ``slot`` to the master on ``to_port`` the way ``redis-cli --cluster reshard``
        does (IMPORTING/MIGRATING, ``MIGRATE`` of its keys ``batch`` at a time, ``SETSLOT
        NODE`` everywhere): clients see ``ASK`` during it and ``MOVED`` after it. Calls
        ``between()`` after each batch. Returns how many keys moved."""
        from_port = self.owner(slot)
        ids = self.node_ids()
        src = redis.Redis(port=from_port, decode_responses=True)
        dst = redis.Redis(port=to_port, decode_responses=True)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from_port])
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to_port])
        moved = 0
        while True:
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            src.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "REPLACE",
                                "KEYS", *keys)
            moved += len(keys)
            if between is not None:
                between()
        for port in self.masters():
            redis.Redis(port=port).execute_command(
                "CLUSTER", "SETSLOT", slot, "NODE", ids[to_port])
        return moved

    def stop(self) -> None:
        for process in self.servers:
            with contextlib.suppress(Exception):
                process.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


_Servers = TypeVar("_Servers", ClusterSet, SentinelSet)


@contextlib.contextmanager
def _running(servers: _Servers) -> Iterator[_Servers]:
    """``servers`` started, and stopped (their files removed) on exit."""
    try:
        yield servers.start()
    finally:
        servers.stop()


def cluster_set() -> contextlib.AbstractContextManager[ClusterSet]:
    return _running(ClusterSet())


def sentinel_set() -> contextlib.AbstractContextManager[SentinelSet]:
    return _running(SentinelSet())


@contextlib.contextmanager
def restartable_redis(appendfsync: str = "everysec") -> Iterator[RestartableRedis]:
    server = RestartableRedis(appendfsync)
    try:
        yield server.start()
    finally:
        server.stop()


@dataclass
class BatchOutcome:
    """What a fault did to a batch of tasks (the fault tests' figures share these)."""

    published: int = 0
    completed: int = 0
    other_terminal: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    ran_twice: int = 0
    stalled: int = 0
    #: stalled because their end was not recorded: the fault lost the step that ended the
    #: attempt in flight (unsaved writes of a killed Redis, a failover), so the rerun is not
    #: a false stall
    lost_ends: int = 0
    #: stalls taken back by a message given back (the attempt never ran): not in ``stalled``
    stalls_taken_back: int = 0

    def count(self, jobbers: Any, ids: Sequence[str], marks: Path, runs: int = 1) -> None:
        """Fill the figures from the records of ``ids`` (all terminal) and the execution
        markers in ``marks``; ``runs``: executions each task needs (2 for one that retries
        once)."""
        from jobbers_celery import TaskState

        self.published = len(ids)
        for i in ids:
            record = jobbers.get(i)
            assert record is not None
            if record.state is TaskState.COMPLETED:
                self.completed += 1
            else:
                key = record.state.value
                self.other_terminal[key] = self.other_terminal.get(key, 0) + 1
        counts = executions(marks)
        self.lost = sum(1 for i in ids if counts.get(i, 0) < runs)
        self.ran_twice = sum(1 for i in ids if counts.get(i, 0) > runs)
        stalls = []
        for i in ids:
            history = jobbers.history(i)
            for n, t in enumerate(history):
                if t.to_state is not TaskState.STALLED:
                    continue
                after = history[n + 1] if n + 1 < len(history) else None
                if after is not None and "never ran" in (after.reason or ""):
                    self.stalls_taken_back += 1
                else:
                    stalls.append(t.reason or "")
        self.stalled = len(stalls)
        self.lost_ends = sum(1 for r in stalls if "its end was not recorded" in r)


def executions(directory: Path) -> dict[str, int]:
    """How many times each task body started, from the marker files it wrote (one per
    execution, on local disk: independent of the Redis that fails)."""
    counts: dict[str, int] = {}
    for marker in directory.iterdir():
        task_id = marker.name.split(".", 1)[0]
        counts[task_id] = counts.get(task_id, 0) + 1
    return counts

