"""The rendezvous store: a small key-value server on rank 0 that every rank reaches over TCP.

Rank 0 runs :class:`StoreServer` on ``MASTER_ADDR:MASTER_PORT`` (in a thread of its own
process); every rank, rank 0 included, talks to it through a :class:`Store` client. It carries
what the ranks must agree on before NCCL can connect them (the NCCL unique id, set by rank 0),
the models' parameter lists (dnnkit.distributed.DataParallel compares them), host barriers,
and what a rank needs to name the culprit of a fault:

- each rank's main connection says ``hello`` with its rank; when it closes without ``bye``
  the server records the rank as dead, and every barrier or ``get`` waiting for that rank
  fails at once, naming it;
- each rank's watchdog sends heartbeats with its count of collectives issued and finished
  (``beat``), so that a rank that hangs (alive, silent, or behind) can be named by ``status``;
- every wait has a timeout (``dnn.distributed.timeout``): a rank that never connects or never
  arrives is named in the error, never waited for silently.

Wire format: each message is a 4-byte big-endian length and a UTF-8 JSON object; values are
bytes, sent as base64. JSON, not pickle: the port is open to the network and must not run
what it receives. Only the standard library is used (no GPU, no numba): the tests run it
across real processes on a machine without a GPU.
"""

import base64
import errno
import json
import socket
import struct
import threading
import time

from . import env
from .env import DistributedError

MAX_FRAME = 64 << 20           # a store value is small (ids, parameter lists): refuse more
SLACK = 10.0                   # seconds a client waits for a reply beyond the server's own wait


def send_frame(sock, obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(sock):
    """The next message, or None when the peer closed the connection."""
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        raise OSError(f"store message of {n} bytes, over the {MAX_FRAME}-byte limit")
    data = _recv_exact(sock, n)
    if data is None:
        return None
    return json.loads(data)


def _b64(value):
    return base64.b64encode(value).decode()


def _ranks(ranks):
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class StoreServer:
    """The store, served from rank 0's process: ``StoreServer(port, world_size)`` listens on
    every interface of this host at ``port`` and serves each connection in a daemon thread."""

    def __init__(self, port, world_size, host=""):
        try:
            self.sock = self._listen(host, port)
        except OSError as e:
            raise DistributedError(
                f"rank 0 cannot listen on port {port} for the rendezvous store: "
                f"{e.strerror or e} (another job on this port? set MASTER_PORT to a free "
                f"port)", ranks=(0,)) from None
        self.port = self.sock.getsockname()[1]
        self.world_size = world_size
        self.cond = threading.Condition()
        self.data = {}             # key -> value (base64 text)
        self.joined = {}           # rank -> time of hello (main connections)
        self.left = set()          # ranks that closed with bye
        self.dead = {}             # rank -> time its connection closed without bye
        self.beats = {}            # rank -> (time, progress)
        self.barriers = {}         # barrier name -> ranks arrived
        self.conns = set()
        self.closed = False
        threading.Thread(target=self._accept, name="dnnkit-store", daemon=True).start()

    @staticmethod
    def _listen(host, port):
        """A listening socket: IPv6 and IPv4 on every interface where the host has both,
        IPv4 where IPv6 is absent or refused."""
        if not host and socket.has_dualstack_ipv6():
            try:
                return socket.create_server(("", port), family=socket.AF_INET6,
                                            dualstack_ipv6=True, backlog=128)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise
        return socket.create_server((host, port), backlog=128)

    # ------------------------------------------------------------ serving

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return                 # closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.cond:
                if self.closed:
                    conn.close()
                    return
                self.conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="dnnkit-store-conn",
                             daemon=True).start()

    def _serve(self, conn):
        rank, main, clean = None, False, False
        try:
            while True:
                req = recv_frame(conn)
                if req is None:
                    break
                op = req.get("op")
                if op == "hello":
                    rank, main = int(req["rank"]), req.get("role") == "main"
                if op == "bye":
                    clean = True
                    send_frame(conn, {"ok": True})
                    break
                try:
                    reply = self._handle(op, req, rank)
                except DistributedError as e:
                    reply = {"ok": False, "error": str(e), "ranks": list(e.ranks)}
                send_frame(conn, reply)
                if op == "hello" and not reply["ok"]:
                    rank, main = None, False
                    break
        except (OSError, ValueError):
            pass                        # the peer vanished mid-message: counted below
        finally:
            with self.cond:
                self.conns.discard(conn)
                if main and rank is not None:
                    if clean:
                        self.left.add(rank)
                    elif not self.closed:
                        self.dead[rank] = time.monotonic()
                self.cond.notify_all()
            conn.close()

    def _handle(self, op, req, rank):
        with self.cond:
            if op == "hello":
                return self._hello(req)
            if op == "set":
                self.data[req["key"]] = req["value"]
                self.cond.notify_all()
                return {"ok": True}
            if op == "add":
                v = int(base64.b64decode(self.data.get(req["key"], _b64(b"0")))) + req["amount"]
                self.data[req["key"]] = _b64(str(v).encode())
                self.cond.notify_all()
                return {"ok": True, "value": v}
            if op in ("get", "wait"):
                return self._wait_keys(req, op)
            if op == "barrier":
                return self._barrier(req, rank)
            if op == "beat":
                self.beats[rank] = (time.monotonic(), req.get("progress") or {})
                return {"ok": True}
            if op == "status":
                return {"ok": True, "status": self.status()}
        raise DistributedError(f"store: unknown request {op!r}")

    def _hello(self, req):
        rank, world = int(req["rank"]), int(req["world_size"])
        if world != self.world_size:
            raise DistributedError(f"rank {rank} says WORLD_SIZE={world}, but the store on rank "
                                   f"0 was started for {self.world_size} ranks", ranks=(rank,))
        if not 0 <= rank < world:
            raise DistributedError(f"a process says rank {rank}, outside [0, {world})",
                                   ranks=(rank,))
        if req.get("role") == "main":
            if rank in self.joined:
                raise DistributedError(f"two processes say they are rank {rank} (RANK={rank} "
                                       f"given twice?)", ranks=(rank,))
            self.joined[rank] = time.monotonic()
            self.cond.notify_all()
        return {"ok": True}

    def _gone(self, ranks):
        """Of ``ranks``, those that exited: {rank: why}."""
        now = time.monotonic()
        out = {}
        for r in ranks:
            if r in self.dead:
                out[r] = f"exited (its connection to the store closed {now - self.dead[r]:.1f} " \
                         f"s ago)"
            elif r in self.left:
                out[r] = "left the job (it called destroy())"
        return out

    def _wait_keys(self, req, op):
        keys, frm = req["keys"], req.get("from_rank")
        deadline = time.monotonic() + req["timeout"]
        while not all(k in self.data for k in keys):
            if frm is not None and (gone := self._gone([frm])):
                raise DistributedError(f"{op} {keys[0]!r}: rank {frm} {gone[frm]} before "
                                       f"setting it", ranks=(frm,))
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [k for k in keys if k not in self.data]
                who = f" (rank {frm} should set it)" if frm is not None else ""
                raise DistributedError(
                    f"{op}: key {missing[0]!r} was not set within {req['timeout']:g} s{who}",
                    ranks=() if frm is None else (frm,))
            self.cond.wait(left)
        return {"ok": True, "value": self.data[keys[0]] if op == "get" else None}

    def _barrier(self, req, rank):
        name, world = req["name"], self.world_size
        arrived = self.barriers.setdefault(name, set())
        arrived.add(rank)
        self.cond.notify_all()
        deadline = time.monotonic() + req["timeout"]
        while len(arrived) < world:
            missing = set(range(world)) - arrived
            gone = self._gone(missing)
            if gone:
                why = "; ".join(f"rank {r} {w}" for r, w in sorted(gone.items()))
                raise DistributedError(f"barrier {name!r}: {why} before arriving",
                                       ranks=sorted(gone))
            left = deadline - time.monotonic()
            if left <= 0:
                never = sorted(missing - set(self.joined))
                late = sorted(missing & set(self.joined))
                parts = []
                if never:
                    parts.append(f"{_ranks(never)} never connected to the store")
                if late:
                    parts.append(f"{_ranks(late)} connected but did not arrive")
                raise DistributedError(
                    f"barrier {name!r}: {' and '.join(parts)} within {req['timeout']:g} s "
                    f"({_ranks(arrived)} arrived)", ranks=sorted(missing))
            self.cond.wait(left)
        return {"ok": True}

    def status(self):
        """What the ranks need to name a culprit: {"world_size", "joined", "left",
        "dead": {rank: seconds since}, "beats": {rank: [seconds since, progress]}} (JSON keys
        are strings)."""
        now = time.monotonic()
        return {"world_size": self.world_size, "joined": sorted(self.joined),
                "left": sorted(self.left),
                "dead": {str(r): now - t for r, t in self.dead.items()},
                "beats": {str(r): [now - t, p] for r, (t, p) in self.beats.items()}}

    # ------------------------------------------------------------ ending

    def wait_for_clients(self, timeout, own_rank=0):
        """Wait (at most ``timeout`` s) until every other rank's main connection closed: rank 0
        keeps serving while the others finish, so that their last calls find the store."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while set(self.joined) - self.left - set(self.dead) - {own_rank}:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def close(self):
        with self.cond:
            self.closed = True
            conns = list(self.conns)
            self.cond.notify_all()
        try:
            self.sock.close()
        except OSError:
            pass
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Store:
    """A client of the store: ``Store(host, port, rank, world_size)`` connects (retrying until
    the timeout: rank 0 may start last) and says hello. ``role``: "main" (the process's own
    connection: its closing without :meth:`close` marks the rank dead) or "watch" (the
    watchdog's). Thread-safe: one request at a time."""

    def __init__(self, host, port, rank, world_size, *, timeout=None, role="main"):
        self.host, self.port, self.rank, self.world_size = host, port, rank, world_size
        self.lock = threading.Lock()
        self.sock = None
        self.counters = {}          # barrier name -> calls so far (each call a new barrier)
        t = env.timeout() if timeout is None else timeout
        deadline, last, delay = time.monotonic() + t, None, 0.05
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=min(t, 10.0))
                break
            except OSError as e:
                last = e
            if time.monotonic() + delay > deadline:
                raise DistributedError(
                    f"rank {rank} could not reach the rendezvous store of rank 0 at "
                    f"{host}:{port} within {t:g} s ({last.strerror or last}): rank 0 did "
                    f"not start, MASTER_ADDR/MASTER_PORT differ between ranks, or a firewall "
                    f"blocks the port", ranks=(0,))
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._call({"op": "hello", "rank": rank, "world_size": world_size, "role": role}, t)

    def _call(self, req, wait):
        """Send ``req``; the reply, waiting at most ``wait`` + SLACK seconds for it."""
        with self.lock:
            if self.sock is None:
                raise DistributedError(f"rank {self.rank}: the store connection is closed")
            try:
                self.sock.settimeout(wait + SLACK)
                send_frame(self.sock, req)
                reply = recv_frame(self.sock)
            except (OSError, ValueError) as e:
                reply, why = None, getattr(e, "strerror", None) or str(e) or type(e).__name__
            else:
                why = "connection closed"
        if reply is None:
            raise DistributedError(
                f"rank {self.rank} lost the rendezvous store on rank 0 ({self.host}:"
                f"{self.port}) during {req['op']}: {why}; rank 0 exited or hangs",
                ranks=(0,))
        if not reply.get("ok"):
            raise DistributedError(reply.get("error", "store error"),
                                   ranks=reply.get("ranks", ()))
        return reply

    def set(self, key, value):
        """Store ``value`` (bytes) under ``key``; every waiter on it wakes."""
        self._call({"op": "set", "key": key, "value": _b64(bytes(value))}, env.timeout())

    def get(self, key, *, timeout=None, from_rank=None):
        """The bytes under ``key``, waiting until some rank sets it (``from_rank``: the rank
        expected to: if it exits first, the wait fails at once naming it)."""
        t = env.timeout() if timeout is None else timeout
        r = self._call({"op": "get", "keys": [key], "timeout": t, "from_rank": from_rank}, t)
        return base64.b64decode(r["value"])

    def wait(self, keys, *, timeout=None):
        """Wait until every key of ``keys`` is set."""
        t = env.timeout() if timeout is None else timeout
        self._call({"op": "wait", "keys": list(keys), "timeout": t}, t)

    def add(self, key, amount=1):
        """Add ``amount`` to the integer under ``key`` (0 when unset); the new value."""
        return self._call({"op": "add", "key": key, "amount": int(amount)}, env.timeout())[
            "value"]

    def barrier(self, name="barrier", *, timeout=None):
        """Wait until every rank has called ``barrier(name)`` as many times as this one. A
        rank that exits first, or does not come within the timeout, is named in the
        DistributedError."""
        t = env.timeout() if timeout is None else timeout
        k = self.counters[name] = self.counters.get(name, 0) + 1
        self._call({"op": "barrier", "name": f"{name}#{k}", "timeout": t}, t)

    def beat(self, progress):
        self._call({"op": "beat", "progress": progress}, env.timeout())

    def status(self):
        """The server's :meth:`StoreServer.status`."""
        return self._call({"op": "status"}, env.timeout())["status"]

    def close(self):
        """Leave cleanly (``bye``: not counted as dead), then close the connection."""
        with self.lock:
            sock, self.sock = self.sock, None
        if sock is None:
            return
        try:
            sock.settimeout(5.0)
            send_frame(sock, {"op": "bye"})
            recv_frame(sock)
        except (OSError, ValueError):
            pass
        finally:
            sock.close()
