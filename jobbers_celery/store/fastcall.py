"""A lean EVALSHA path for the hot lifecycle steps.

Why: a lifecycle step is a blocking round trip on the task's critical path, three per task.
Measured on this project's machine, redis-py's generic command path (argument encoding,
connection-pool checkout and release, per-command instrumentation) cost ~100 µs of client CPU
per call against ~50 µs for this path. It still uses redis-py's own ``Connection`` (connect,
AUTH, SELECT, TLS, hiredis parsing); it only skips the per-command layers.

Each thread keeps one connection (prefork children and pool threads never share one; a fork
is detected by pid). A connection the server already closed is replaced before sending; a
failure while *sending* reconnects and sends once more, since the script cannot have run
(and, with ``outage_wait_s``, keeps trying with backoff while Redis is unreachable); a
failure while *reading* the reply is raised, never retried, because the step may have been
applied and must not be applied twice, except a ``READONLY`` or ``NOREPLICAS`` refusal:
the server is a replica, or a master cut off from its replicas (both: a failover
happened), the script did not run, and it is sent once more, to the current master.
A refusal to take writes (``OOM`` under ``maxmemory``, ``MISCONF`` after a failed RDB save,
``READONLY``/``NOREPLICAS`` again after that one resend, ``MASTERDOWN``, ``BUSY``) is a store outage,
not a failure of the step: Redis refuses a script's first write command whenever it refuses
writes (an ``OOM`` is only raised while the script has written nothing; on Redis 7 a script
with a ``#!lua`` shebang is refused before it starts), so the script did not apply, and
with ``outage_wait_s`` the call keeps sending until the refusal ends or the wait runs out,
then raises (a :class:`WritesRefused` for the refusals redis-py has no class of its own). So
does a refusal while connecting: under ``MISCONF`` Redis refuses even the health check's PING.

Connections are opened with ``Connection.connect()``, the method redis-py's pools call:
for a Sentinel-managed connection it asks the sentinels for the current master first
(sending on an unconnected one would connect to its default address instead).

On Redis Cluster each thread keeps one connection per node, and a call goes to the node
that serves its keys' slot in the cluster client's slot map. A ``MOVED`` or ``ASK`` reply,
a ``TRYAGAIN`` or a ``CLUSTERDOWN`` means the script did not run: ``MOVED`` updates the map
and sends again, ``ASK`` sends ``ASKING`` and the script to the node named (a slot being
migrated), ``TRYAGAIN`` and ``CLUSTERDOWN`` wait like a refusal of writes. A failure to
send also refreshes the map (the node may have failed over).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from jobbers_celery.core.errors import ConfigurationError
from jobbers_celery.store.connect import is_cluster

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

__all__ = ["FastScript", "WritesRefused", "as_refusal", "not_a_cluster_client", "without_shebang"]

_SEND_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
_FIRST_PAUSE_S, _MAX_PAUSE_S = 0.05, 1.0
#: ``MOVED``/``ASK`` replies one call follows before it gives up (a slot map in flux).
_MAX_REDIRECTS = 5
#: Seconds every call waits out ``TRYAGAIN`` (its keys' slot is being resharded), whatever
#: its ``outage_wait_s``: a publish should not go unrecorded for a migration's moment.
_TRYAGAIN_WAIT_S = 5.0


#: Error codes of a server that cannot take writes now (redis-py raises a plain
#: ``ResponseError`` for these): a failed RDB save with ``stop-writes-on-bgsave-error``,
#: a master without enough replicas, a server busy with a script past its time limit.
_REFUSAL_CODES = ("MISCONF ", "NOREPLICAS ", "BUSY ")


class WritesRefused(ResponseError):
    """Redis refused to take writes for now (``MISCONF``, ``NOREPLICAS``, ``BUSY``): a store
    outage, like ``OutOfMemoryError``, ``ReadOnlyError`` and ``MasterDownError``."""


def as_refusal(exc: BaseException) -> BaseException | None:
    """``exc`` as a store-side refusal of writes, or ``None`` if it is not one:
    ``OutOfMemoryError``/``ReadOnlyError``/``MasterDownError`` (a replica cut off from its
    master)/``WritesRefused`` as they are, a plain ``ResponseError`` with one of the refusal
    codes as a :class:`WritesRefused`."""
    if isinstance(exc, (OutOfMemoryError, ReadOnlyError, MasterDownError, WritesRefused,
                        ClusterDownError, TryAgainError)):
        return exc
    if isinstance(exc, ResponseError) and str(exc).startswith(_REFUSAL_CODES):
        refused = WritesRefused(str(exc))
        refused.__cause__ = exc
        return refused
    return None


def without_shebang(script: Script, exc: BaseException) -> bool:
    """Redis < 7 compiles a script's text as a Lua function body, where a ``#!lua`` first
    line is a syntax error: if that is why loading ``script`` failed, drop the line (and
    the whole-script refusal it gives on Redis 7) and return True to load it again."""
    text = script.script
    if not (isinstance(text, str) and text.startswith("#!")
            and "Error compiling script" in str(exc)):
        return False
    script.script = text.split("\n", 1)[1]
    script.sha = hashlib.sha1(script.script.encode()).hexdigest()
    return True


def _pack_py(args: list[str]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


_pack_c: Callable[[tuple[Any, ...]], Any] | None
try:  # redis[hiredis], a dependency: the same bytes, packed in C (a publish's ~20 args)
    from hiredis import pack_command as _pack_c
except ImportError:  # pragma: no cover - hiredis missing: Python's packing
    _pack_c = None


def _pack(args: list[str]) -> bytes:
    """``args`` as one RESP command (UTF-8)."""
    if _pack_c is None:
        return _pack_py(args)
    packed: bytes = _pack_c(tuple(args))
    return packed


_ASKING = b"*1\r\n$6\r\nASKING\r\n"


def _refused_by_replica(exc: BaseException) -> bool:
    """A refused write, so the script did not run: ``READONLY`` (the server is now a
    replica; its first write aborted the script) or ``NOREPLICAS`` (a master cut off from
    its replicas under ``min-replicas-to-write``, as an old master is after a failover).

    redis-py's Sentinel-managed connection turns ``READONLY`` into a ``ConnectionError``
    raised while handling the ``ReadOnlyError``, hence the look at the exception's context.
    """
    return (isinstance(exc, ReadOnlyError) or isinstance(exc.__context__, ReadOnlyError)
            or (isinstance(exc, ResponseError) and str(exc).startswith("NOREPLICAS")))


def _wait_or_raise(refused: BaseException, exc: BaseException, deadline: float,
                   pause: float) -> float:
    """Sleep ``pause`` and return the next one, or raise ``refused`` (``exc`` as a store
    outage) if the wait would end past ``deadline``."""
    if time.monotonic() + pause > deadline:
        if refused is exc:
            raise exc
        raise refused from exc
    time.sleep(pause)
    return min(2 * pause, _MAX_PAUSE_S)


def _redirected_too_often(exc: BaseException) -> ClusterError:
    """A slot map in flux longer than ``_MAX_REDIRECTS`` replies: a store outage (redis-py's
    cluster client raises the same after following redirections that long)."""
    return ClusterError(f"still redirected after {_MAX_REDIRECTS} MOVED/ASK replies: {exc}")


def not_a_cluster_client(exc: BaseException) -> ConfigurationError:
    """The error for a ``MOVED``/``ASK`` reply to a plain client (see below)."""
    return ConfigurationError(
        f"the jobbers store answered {'MOVED' if isinstance(exc, MovedError) else 'ASK'} "
        f"{exc}: jobbers_redis_url names a Redis Cluster node, but this process uses a "
        "plain Redis client, because the node could not be asked INFO cluster when the "
        "process started (see the warning logged then); restart it once the node answers")


class _ThreadConnections(dict[str, Any]):
    """One thread's connections, by node, taken from their pools with ``get_connection``.

    Why: a connection counts against its pool's ``max_connections`` (redis-py 8: 100) until
    it is released. When the thread ends, Python drops its thread-local state, and this
    hands its connections back to their pools for the next thread to take. Made without the
    pool's knowledge, they would count for ever: a process that starts thread after thread
    (a thread per request, a pool of threads made per call) found its pool exhausted after
    about a hundred, and every later step raised ``Too many connections`` (a publish then
    went out unrecorded). After a fork the pool forgets its parent's connections and
    ignores their release.
    """

    def __init__(self) -> None:
        super().__init__()
        self._pools: dict[str, Any] = {}

    def take(self, name: str, pool: Any) -> Any:
        conn = self[name] = pool.get_connection()
        self._pools[name] = pool
        return conn

    def __del__(self) -> None:
        for name, conn in list(self.items()):
            with contextlib.suppress(Exception):  # the pool or the interpreter is going
                self._pools[name].release(conn)


class FastScript:
    """Calls one registered script with ``EVALSHA`` on a per-thread connection."""

    def __init__(self, client: redis.Redis, script: Script) -> None:
        self.client = client
        self.script = script
        #: Seconds a call keeps trying to *send* while Redis cannot be reached (0: one
        #: immediate retry). A worker's lifecycle steps wait out a short outage or a
        #: failover instead of failing the task (see ``RedisStore.wait_out_outages``).
        self.outage_wait_s = 0.0
        self._local = threading.local()
        self._cluster = is_cluster(client)

    def _connection(self, keys: list[str], node: Any = None) -> Any:
        """This thread's connection to ``node``, or, by default, to the node serving the
        keys' slot in the cluster client's slot map (the one server otherwise)."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.conns, local.pid = _ThreadConnections(), os.getpid()
        if self._cluster:
            if node is None:
                node = self.client.get_node_from_key(keys[0])  # type: ignore[attr-defined]
            name, pool = node.name, node.redis_connection.connection_pool
        else:
            name, pool = "", self.client.connection_pool
        conn = local.conns.get(name)
        if conn is None:
            conn = local.conns.take(name, pool)
        return conn

    def _asked_node(self, exc: AskError) -> Any:
        """The node an ``ASK`` names (the slot is being migrated to it)."""
        node = self.client.nodes_manager.get_node(  # type: ignore[attr-defined]
            host=exc.host, port=exc.port)
        if node is None or node.redis_connection is None:  # not in the map yet
            self.client.nodes_manager.initialize()  # type: ignore[attr-defined]
            node = self.client.nodes_manager.get_node(  # type: ignore[attr-defined]
                host=exc.host, port=exc.port)
        if node is None or node.redis_connection is None:
            raise exc
        return node

    def _refresh_slots(self) -> None:
        # no node answers: the send's own error is what the caller sees
        with contextlib.suppress(Exception):
            self.client.nodes_manager.initialize()  # type: ignore[attr-defined]

    @staticmethod
    def _drop_if_closed(conn: Any) -> None:
        """Reconnect if the server already closed this connection (restart, idle kill).

        Without it the send would succeed into the kernel buffer and only the read would
        fail, when a retry is no longer safe. Nothing has been sent yet here, so it is.
        """
        if getattr(conn, "_sock", None) is None:
            conn.connect()  # Sentinel: looks the master up
            return
        try:
            stale = conn.can_read(timeout=0)  # EOF or unexpected bytes: not usable
        except (RedisConnectionError, RedisTimeoutError, OSError):
            stale = True
        if stale:
            conn.disconnect()
            conn.connect()

    def __call__(self, keys: list[str], args: list[str]) -> Any:
        command = _pack(["EVALSHA", str(self.script.sha), str(len(keys)), *keys, *args])
        sends, resent, redirects = 0, False, 0
        asked: Any = None  # the node an ASK named: the next send goes there, after ASKING
        started = time.monotonic()
        deadline = started + self.outage_wait_s
        pause = _FIRST_PAUSE_S
        while True:
            sends += 1
            conn = self._connection(keys, asked)
            try:
                self._drop_if_closed(conn)  # and connects, to the current master
                # check_health: PINGs first only when idle past health_check_interval
                conn.send_packed_command([_ASKING, command] if asked is not None else [command],
                                         check_health=True)
            except _SEND_ERRORS:
                conn.disconnect()
                if self._cluster:  # the node may be gone (failover): ask the cluster
                    self._refresh_slots()
                # nothing was sent: once more at once, then while an outage may last
                if sends > 1:
                    if time.monotonic() + pause > deadline:
                        raise
                    time.sleep(pause)
                    pause = min(2 * pause, _MAX_PAUSE_S)
                continue
            except ResponseError as exc:
                # refused while connecting or checking health (under MISCONF Redis refuses
                # even PING): nothing was sent; wait while the refusal may last
                conn.disconnect()
                refused = as_refusal(exc)
                if refused is None:
                    raise
                pause = _wait_or_raise(refused, exc, deadline, pause)
                continue
            try:
                if asked is not None:
                    asked = None  # one command only, as ASKING applies
                    conn.read_response()  # ASKING's OK
                return conn.read_response()
            except MovedError as exc:  # the slot moved: the script did not run
                if not self._cluster:
                    raise not_a_cluster_client(exc) from exc
                redirects += 1
                if redirects > _MAX_REDIRECTS:
                    raise _redirected_too_often(exc) from exc
                self.client.nodes_manager.move_slot(exc)  # type: ignore[attr-defined]
                continue
            except AskError as exc:  # the slot is migrating, and the keys already moved
                if not self._cluster:
                    raise not_a_cluster_client(exc) from exc
                redirects += 1
                if redirects > _MAX_REDIRECTS:
                    raise _redirected_too_often(exc) from exc
                asked = self._asked_node(exc)
                continue
            except NoScriptError:
                # Redis restarted or SCRIPT FLUSH: load it and run it (it did not run).
                try:
                    self.client.script_load(self.script.script)
                except ResponseError as exc:
                    if not without_shebang(self.script, exc):
                        # refused on a new connection's PING (MISCONF) or the load itself
                        # (OOM): the script did not run; wait while the refusal may last
                        refused = as_refusal(exc)
                        if refused is None:
                            raise
                        pause = _wait_or_raise(refused, exc, deadline, pause)
                        continue
                    self.client.script_load(self.script.script)
                    command = _pack(["EVALSHA", str(self.script.sha), str(len(keys)),
                                     *keys, *args])
                if resent:
                    raise
                resent = True
            except (ResponseError, RedisConnectionError) as exc:
                conn.disconnect()
                if not resent and _refused_by_replica(exc):
                    resent = True  # a failover: at once, to the current master
                    if self._cluster:
                        self._refresh_slots()
                    continue
                refused = exc if _refused_by_replica(exc) else as_refusal(exc)
                if refused is None:
                    raise
                if isinstance(exc, TryAgainError):  # a slot half moved: over in moments
                    deadline = max(deadline, started + _TRYAGAIN_WAIT_S)
                    # an ASK then TRYAGAIN (a script's keys that exist on neither node yet)
                    # repeats until the move ends: bounded by this wait, not by the count
                    redirects = 0
                # the script did not run: wait while the refusal may last
                pause = _wait_or_raise(refused, exc, deadline, pause)
            except BaseException:
                conn.disconnect()
                raise

    def send_many(self, calls: Sequence[tuple[list[str], list[str]]]
                  ) -> Callable[[], list[Any]]:
        """Send calls of a step script (a bulk publish's ``submit`` steps) in one write, on
        a connection of this thread's own for them, and return the function that reads their
        replies, in order (call it once; the thread may make other calls in between, on its
        usual connection). A reply entry is the reply or the exception that stands for it:
        an error reply (a ``NOSCRIPT`` one is run again alone: the script did not run), or a
        connection lost before it (the step may or may not have applied; never sent twice).
        A failure to send is sent once more on a new connection (a step sent twice is
        refused, never applied twice: it is a compare-and-set). On Redis Cluster, or for one
        call, each call runs at once through :meth:`__call__` (keys of many slots)."""
        if self._cluster or len(calls) <= 1:
            done = [self._caught(keys, args) for keys, args in calls]
            return lambda: done
        sha = str(self.script.sha)
        commands = [_pack(["EVALSHA", sha, str(len(keys)), *keys, *args])
                    for keys, args in calls]
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.conns, local.pid = _ThreadConnections(), os.getpid()
        conn = local.conns.get("batch")
        if conn is None:
            conn = local.conns.take("batch", self.client.connection_pool)
        failed: Exception | None = None
        for _ in range(2):
            try:
                self._drop_if_closed(conn)
                conn.send_packed_command(commands, check_health=True)
                failed = None
                break
            except (*_SEND_ERRORS, ResponseError) as exc:
                conn.disconnect()
                failed = exc
        if failed is not None:
            lost = failed
            return lambda: [lost] * len(calls)

        def read() -> list[Any]:
            replies: list[Any] = []
            while len(replies) < len(calls):
                try:
                    replies.append(conn.read_response())
                except ResponseError as exc:  # read whole: the next reply follows
                    replies.append(exc)
                except Exception as exc:  # noqa: BLE001 - the rest is lost with the connection
                    conn.disconnect()
                    replies += [exc] * (len(calls) - len(replies))
                except BaseException:
                    conn.disconnect()
                    raise
            return [self._caught(keys, args) if isinstance(reply, NoScriptError) else reply
                    for (keys, args), reply in zip(calls, replies, strict=True)]

        return read

    def _caught(self, keys: list[str], args: list[str]) -> Any:
        """One call through :meth:`__call__`, an exception returned in place of its reply."""
        try:
            return self(keys, args)
        except Exception as exc:  # noqa: BLE001 - handed back for the caller to judge
            return exc

    def many(self, calls: Sequence[tuple[list[str], list[str]]]) -> list[Any]:
        """Several calls of an idempotent script (a liveness refresh, one per shard) in one
        round trip: on one server all are sent at once and their replies read in order; on
        Redis Cluster (or for one call) one at a time, each following redirections as
        :meth:`__call__` does. An error reply is raised once every reply is read, so the
        connection stays in step; a ``NOSCRIPT`` loads the script and runs those calls
        again. A failed send falls back to one call at a time (some may then run twice,
        which is why the script must be idempotent)."""
        if self._cluster or len(calls) <= 1:
            return [self(keys, args) for keys, args in calls]
        sha = str(self.script.sha)
        commands = [_pack(["EVALSHA", sha, str(len(keys)), *keys, *args])
                    for keys, args in calls]
        conn = self._connection(calls[0][0])
        try:
            self._drop_if_closed(conn)
            conn.send_packed_command(commands, check_health=True)
        except _SEND_ERRORS:
            conn.disconnect()
            return [self(keys, args) for keys, args in calls]
        replies: list[Any] = []
        for _ in calls:
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:  # read whole: the next reply follows
                replies.append(exc)
            except BaseException:
                conn.disconnect()
                raise
        out = []
        for (keys, args), reply in zip(calls, replies, strict=True):
            if isinstance(reply, NoScriptError):
                out.append(self(keys, args))  # loads the script, then runs it
            elif isinstance(reply, Exception):
                raise reply
            else:
                out.append(reply)
        return out
