"""The record bus: live dispatchers tell each other what they routed (issue 23, the cold-home
rule in a tier).

Why. The cacheroute policy's cold-home rule reads a per-router *record* of what it routed to each
replica (services/core/policies/_caches.py). In a tier of N routers each record sees 1/N of the
traffic and cannot tell "evicted" from "put there by a peer", so the share gate switches the rule
off. With the bus every router's record (and its cold-tail key memory) also holds its peers'
routes, and the share gate reads the record's coverage instead of this router's own fraction.

Rule.
- Send: `Router.route` / `route_many` append (slot, key, prompt tokens, block hashes) to
  `Router.routes_out` (at most `batch_max` per interval; beyond it dropped and counted, routing
  never waits). Every `interval` seconds the buffer is swapped out and published as one batch:
  sender id, the sender's open streams (sum of `Router.outstanding`), its interval, the entries;
  entries past MAX_BATCH_BYTES are dropped and counted. A batch is published every interval,
  empty or not, so it is also the sender's heartbeat. A router that hears no peer (alone: one
  dispatcher, one worker) publishes every ALONE_BEACON (2) s instead, its batch stamped with that
  period (so a peer that appears keeps it live for PEER_EXPIRY of those): nobody is listening to
  the rest, and at 10 batches a second, each heard back by its own subscription, the bus cost a
  lone dispatcher CPU for nothing. Alone and past its hand-over wait, its send loop sleeps from
  beacon to beacon (with the 2 s beacon a lone bus costs ~1 ms of CPU a second instead of ~5:
  bench/recordbus_alone.py); the first batch it hears from a peer wakes it, and it publishes then and every
  `interval` after.
- Receive: one subscription; a batch from this sender is ignored; a bad one (not this codec,
  malformed, over MAX_BATCH_BYTES or `batch_max` entries) is dropped whole and counted; an entry
  naming a replica id this router does not have is skipped and counted. The rest go to the active
  policy's `observe(slot, Request, state=router.state)` (services/core/policies/cacheroute.py),
  RECEIVE_CHUNK entries per event-loop step, so a large batch never stalls routing. A plan
  install swaps the policy but `carry_memory` carries the record over.
- Share: `Router.peer_outstanding` = sum of the latest count of each live peer; a peer is live
  for PEER_EXPIRY (3) of its own intervals after its last batch (one lost message does not drop
  it; a stopped peer leaves within ~0.3 s). Updated on every batch and every send tick.

Hand-over. A router that starts on the bus knows nothing of where keys are, while every live peer's
record and key memory already hold the whole tier's routes (in the simulator a restart on the bus
cost 2.0-5.2 hit points in one bin, a copy of a peer's state 0.0 on 6 of 8 seeds: docs/experiments.md,
"Rolling restart of a tier in the simulator"). So for its first HANDOVER_WAIT (3) seconds a router's
batches carry "h": it asks. The live peer with the lowest sender id among those not asking
themselves (every peer computes the same one from what it hears) answers each asker once: it copies
its policy's key memory and record (`CacheRoutePolicy.handover`), encodes it off the event loop and
writes it with SET NX, expiring after HANDOVER_TTL (30) s, to the asker's key
`{prefix}:{records}:handover:<sender>`. The asker reads and deletes that key (GETDEL) at each send
tick while it asks; what it finds is decoded off the loop, its replica ids mapped to its own slots
(unknown ones skipped) and taken in as older than its own routes (`CacheRoutePolicy.absorb`). A
router alone hears nobody and stops asking after the wait. Bad hand-overs (not this codec, over
MAX_HANDOVER_BYTES) are dropped and counted, and a giver does not write one over that size; a giver
whose SET NX finds another's hand-over there leaves it (not counted as given); none arriving is
counted too. `--record-handover 0` turns both sides off.

Transport: Redis pub/sub on the store's channel `{prefix}:{records}:bus` (services/store/keys.py),
through the dispatcher's own RedisStore connection config: PUBLISH / SUBSCRIBE on one node,
SPUBLISH / SSUBSCRIBE in a Redis Cluster (a shard channel: one shard carries it, not every node;
services/store/records.py). Pub/sub is fire-and-forget: a router that is disconnected loses those
batches (its record is a soft estimate; it reconnects with a backoff) and Redis drops a subscriber
whose output buffer passes its pub/sub limit (32 MB by default; a batch is at most 1 MiB).
Without a Redis store (an embedded dispatcher, the in-memory store) there is no bus.

Knobs (defaults and their rules: docs/experiments.md, "The record bus between live dispatchers"):
`--record-bus` 1 (on, by the live rule over two seeds in docs/experiments.md "The record bus live, a
second seed": at a tier of 4 drift's p99 1,513 -> 1,190 ms and hit 83.0 -> 85.0%, (a) tenants' hit
86.6 -> 86.3% and p99 894 -> 917 ms, inside the rule's 1.1x; seed 1 alone had kept it off),
`interval` 0.1 s (well under the 0.25 s stats poll: peers' routes are known before the engines'
loads are), `batch_max` 4096 entries (above one process's routing rate per interval).

Codec (`encode_batch` / `decode_batch`): MAGIC, a 4-byte little-endian header length, an orjson
header {"s": sender, "o": outstanding, "i": interval, "r": [replica ids], "e": [[replica index
into r, key, prompt tokens, block count], ...], "h": 1 while asking for a hand-over}, then every
entry's block hashes as one little-endian uint64 array in entry order.
Hand-over (`encode_handover` / `decode_handover`): HANDOVER_MAGIC, the same header length, an
orjson header {"s": giver, "r": [replica ids], "m": [[key, replica index], ...] least recent first,
"k": "blocks" | "keys" | null, "b": record capacity in blocks, "x": per replica [[key, tokens], ...]
("keys") or its block count ("blocks")}, then the "blocks" record's hashes as one uint64 array.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import struct
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.core.policies._caches import Handover
from services.core.request import Request
from services.errors import Unavailable
from services.model import MAX_KEY_BYTES
from services.rpc import kv

log = logging.getLogger("cacheroute.dispatcher.recordbus")

MAGIC = b"CRB1"
HANDOVER_MAGIC = b"CRH1"
MAX_BATCH_BYTES = 1 << 20        # one message, both ends (docs/experiments.md)
MAX_HANDOVER_BYTES = 64 << 20    # one hand-over (2 x 65,536 remembered keys and a record: a few MB)
HANDOVER_WAIT = 3.0              # seconds a starting router asks for a hand-over (module header)
HANDOVER_TTL = 30                # seconds an unread hand-over is kept
MAX_SENDER = 200                 # characters of a sender id
DEFAULT_INTERVAL = 0.1
DEFAULT_BATCH_MAX = 4096
PEER_EXPIRY = 3                  # a peer's own intervals without a batch, then it is not live
ALONE_BEACON = 2.0               # seconds between batches while no peer is heard (module header)
RECEIVE_CHUNK = 256              # entries observed per event-loop step
_HEAD = struct.Struct("<I")


class BadBatch(ValueError):
    """Bytes that are not a valid record batch; `reason` is the metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Entry:
    replica: str
    key: str
    prompt_tokens: int
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Batch:
    sender: str
    outstanding: int
    interval: float
    entries: tuple[Entry, ...]
    asking: bool = False             # the sender asks for a hand-over (module header)


def encode_batch(sender: str, outstanding: int, interval: float, entries: Sequence[tuple[str, str, int, Sequence[int]]],
                 *, max_bytes: int = MAX_BATCH_BYTES, asking: bool = False) -> tuple[bytes, int]:
    """(message, entries left out): the entries (replica id, key, prompt tokens, blocks) in order
    while the message stays within `max_bytes`; the rest are left out (counted by the caller)."""
    ids: dict[str, int] = {}
    rows: list[list] = []
    blocks: list[int] = []
    size = len(MAGIC) + _HEAD.size + 64 + len(sender.encode())
    for n, (replica, key, tokens, chain) in enumerate(entries):
        cost = 8 * len(chain) + len(key.encode()) + 24 + (0 if replica in ids else len(replica) + 4)
        if size + cost > max_bytes:
            return _pack(sender, outstanding, interval, ids, rows, blocks, asking), len(entries) - n
        size += cost
        r = ids.setdefault(replica, len(ids))
        rows.append([r, key, int(tokens), len(chain)])
        blocks.extend(chain)
    return _pack(sender, outstanding, interval, ids, rows, blocks, asking), 0


def _pack(sender: str, outstanding: int, interval: float, ids: dict[str, int], rows: list, blocks: list[int],
          asking: bool) -> bytes:
    head = {"s": sender, "o": int(outstanding), "i": float(interval), "r": list(ids), "e": rows}
    if asking:
        head["h"] = 1
    return _frame(MAGIC, head, blocks)


def _frame(magic: bytes, head: dict, blocks) -> bytes:
    raw = orjson.dumps(head)
    tail = np.asarray(blocks, dtype="<u8").tobytes() if len(blocks) else b""
    return b"".join((magic, _HEAD.pack(len(raw)), raw, tail))


def _unframe(data, magic: bytes, max_bytes: int, what: str) -> tuple[dict, memoryview]:
    """(header, block tail) of one message; BadBatch (module header) for anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadBatch("garbage", f"not bytes: {type(data).__name__}")
    if len(data) > max_bytes:
        raise BadBatch("oversize", f"{len(data)} bytes > {max_bytes}")
    if len(data) < len(magic) + _HEAD.size or bytes(data[:len(magic)]) != magic:
        raise BadBatch("garbage", f"no {what} magic")
    (n,) = _HEAD.unpack_from(data, len(magic))
    start = len(magic) + _HEAD.size
    if n > len(data) - start:
        raise BadBatch("garbage", "header longer than the message")
    try:
        head = orjson.loads(bytes(data[start:start + n]))
    except orjson.JSONDecodeError:
        raise BadBatch("garbage", "header is not JSON") from None
    if not isinstance(head, dict):
        raise BadBatch("garbage", "header is not an object")
    tail = memoryview(data)[start + n:]
    if len(tail) % 8:
        raise BadBatch("garbage", "block array is not whole uint64s")
    return head, tail


def decode_batch(data: bytes, *, max_entries: int = DEFAULT_BATCH_MAX, max_bytes: int = MAX_BATCH_BYTES) -> Batch:
    """The batch in `data`; BadBatch (reason "oversize" or "garbage") for anything else."""
    head, tail = _unframe(data, MAGIC, max_bytes, "record-batch")
    sender, outstanding, interval, ids, rows = (head.get(k) for k in ("s", "o", "i", "r", "e"))
    if not isinstance(sender, str) or not 0 < len(sender) <= MAX_SENDER:
        raise BadBatch("garbage", "bad sender id")
    if type(outstanding) is not int or outstanding < 0:
        raise BadBatch("garbage", "bad outstanding count")
    if type(interval) not in (int, float) or not 0 < interval <= 60:
        raise BadBatch("garbage", "bad interval")
    if not isinstance(ids, list) or not all(isinstance(r, str) for r in ids):
        raise BadBatch("garbage", "bad replica ids")
    if not isinstance(rows, list):
        raise BadBatch("garbage", "bad entries")
    if len(rows) > max_entries:
        raise BadBatch("oversize", f"{len(rows)} entries > {max_entries}")
    hashes = np.frombuffer(tail, dtype="<u8").tolist()
    entries, at = [], 0
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4 and type(row[0]) is int and 0 <= row[0] < len(ids)
                and isinstance(row[1], str) and 0 < len(row[1]) and len(row[1].encode()) <= MAX_KEY_BYTES
                and type(row[2]) is int and row[2] >= 0 and type(row[3]) is int and row[3] >= 0):
            raise BadBatch("garbage", "bad entry")
        end = at + row[3]
        if end > len(hashes):
            raise BadBatch("garbage", "entries name more blocks than the message holds")
        entries.append(Entry(ids[row[0]], row[1], row[2], tuple(hashes[at:end])))
        at = end
    if at != len(hashes):
        raise BadBatch("garbage", "blocks left over after the entries")
    return Batch(sender, outstanding, float(interval), tuple(entries), head.get("h") == 1)


def encode_handover(giver: str, ids: Sequence[str], state: Handover) -> bytes:
    """A policy's hand-over (its slot indexes) as one message naming replicas by id (module header)."""
    head = {"s": giver, "r": list(ids), "m": state.memory, "k": state.kind, "b": int(state.blocks)}
    blocks: list[int] = []
    if state.kind == "blocks":
        head["x"] = [len(entries) for entries in state.record]
        for entries in state.record:
            blocks.extend(entries)
    else:
        head["x"] = [list(entries) for entries in state.record]
    return _frame(HANDOVER_MAGIC, head, blocks)


def decode_handover(data: bytes, ids: Sequence[str], *, max_bytes: int = MAX_HANDOVER_BYTES) -> tuple[str, Handover]:
    """(giver, the hand-over in `ids`' slot indexes): replicas the giver names that are not in
    `ids` are left out; BadBatch for bytes that are not a hand-over."""
    head, tail = _unframe(data, HANDOVER_MAGIC, max_bytes, "hand-over")
    giver, names, memory, kind, blocks, record = (head.get(k) for k in ("s", "r", "m", "k", "b", "x"))
    if not isinstance(giver, str) or not 0 < len(giver) <= MAX_SENDER:
        raise BadBatch("garbage", "bad giver id")
    if not isinstance(names, list) or not all(isinstance(r, str) for r in names):
        raise BadBatch("garbage", "bad replica ids")
    if kind not in (None, "blocks", "keys") or type(blocks) is not int or blocks < 0:
        raise BadBatch("garbage", "bad record kind or capacity")
    if not isinstance(memory, list) or not isinstance(record, list) or (kind and len(record) != len(names)):
        raise BadBatch("garbage", "bad memory or record")
    slot = {name: ids.index(name) if name in ids else -1 for name in names}
    local = [slot[name] for name in names]
    n = len(local)
    if not all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and type(e[1]) is int
               and 0 <= e[1] < n for e in memory):
        raise BadBatch("garbage", "bad memory entry")
    mem = [(k, local[r]) for k, r in memory if local[r] >= 0]
    out: list[list] = [[] for _ in ids]
    if kind == "blocks":
        hashes = np.frombuffer(tail, dtype="<u8")
        if not all(type(n) is int and n >= 0 for n in record) or sum(record) != len(hashes):
            raise BadBatch("garbage", "record counts do not match its blocks")
        at = 0
        for i, n in enumerate(record):
            if local[i] >= 0:
                out[local[i]] = hashes[at:at + n].tolist()
            at += n
    elif kind == "keys":
        for i, entries in enumerate(record):
            if not isinstance(entries, list) or not all(
                    isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and type(e[1]) is int and e[1] >= 0
                    for e in entries):
                raise BadBatch("garbage", "bad record entry")
            if local[i] >= 0:
                out[local[i]] = [(k, t) for k, t in entries]
    return giver, Handover(mem, kind, blocks, out if kind else ())


def sender_id(dispatcher_id: str) -> str:
    """This process's id on the bus: the dispatcher id (workers: ID/wI) and a boot nonce, so two
    dispatchers left at the default id, or a restarted one, are never taken for each other."""
    return f"{dispatcher_id[:MAX_SENDER - 20]}#{os.getpid()}.{secrets.token_hex(3)}"


class RecordBus:
    """One router's end of the bus: `await start()`, then `await stop()` (module header)."""

    def __init__(self, router, store, sender: str, *, interval: float = DEFAULT_INTERVAL,
                 batch_max: int = DEFAULT_BATCH_MAX, handover: bool = True) -> None:
        if not 0 < interval <= 60:
            raise ValueError(f"record interval must be in (0, 60] seconds, got {interval!r}")
        if batch_max < 1:
            raise ValueError(f"record batch max must be >= 1, got {batch_max!r}")
        self.router = router
        self.channel = store.records() if store is not None else None   # RedisStore.records()
        self.sender = sender
        self.interval = interval
        self.batch_max = batch_max
        self.peers: dict[str, tuple[float, int, float, bool]] = {}   # sender -> (last seen, outstanding, its interval, asking)
        self.published = [0, 0]          # batches, entries
        self.received = [0, 0]           # batches from peers, entries observed
        self.dropped: dict[str, int] = {"cap": 0, "bytes": 0, "garbage": 0, "oversize": 0, "unknown_replica": 0,
                                        "publish_failed": 0}
        self.own = 0                     # own batches heard back (the subscription works)
        self.handover = handover
        self.asking_until: float | None = None   # monotonic deadline while this router asks (module header)
        self.handovers: dict[str, int] = {"given": 0, "taken": 0, "none": 0, "bad": 0, "failed": 0}
        self._answered: dict[str, float] = {}   # askers this router answered -> when (each once)
        self._tasks: list[asyncio.Task] = []
        self._heard = asyncio.Event()    # a peer was heard while alone: the send loop ticks at once
        self._sub = None
        self._stopping = False
        self._warned: dict[str, float] = {}

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> "RecordBus":
        self.router.routes_cap = self.batch_max
        self.router.routes_out = []
        if self.handover:
            self.asking_until = time.monotonic() + HANDOVER_WAIT
        self._tasks = [asyncio.create_task(self._send_loop(), name="record-bus-send"),
                       asyncio.create_task(self._receive_loop(), name="record-bus-receive")]
        log.info("record bus on", extra=kv(sender=self.sender, channel=self.channel.name,
                                           interval=self.interval, batch_max=self.batch_max))
        return self

    async def stop(self) -> None:
        """Cancel the loops, publish what is buffered (best effort, one store timeout), unsubscribe."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), timeout=1.0)
        self.router.routes_out = None
        if self._sub is not None:
            await self._sub.close()
            self._sub = None
        log.info("record bus stopped", extra=kv(sender=self.sender, published=self.published[0],
                                                received=self.received[0], peers=len(self.peers)))

    # ------------------------------------------------------------ send

    async def flush(self, every: float | None = None) -> None:
        """Publish the buffered routes as one batch (also a heartbeat when empty), stamped with
        `every`, the period until the next one (default: the interval)."""
        r = self.router
        buf = r.routes_out
        if buf is None:
            return
        r.routes_out = [] if not self._stopping else None
        if r.routes_dropped:
            self.dropped["cap"] += r.routes_dropped
            r.routes_dropped = 0
        ids = r.ids
        data, left = encode_batch(self.sender, sum(r.outstanding), every or self.interval,
                                  [(ids[i], key, tokens, blocks) for i, key, tokens, blocks in buf],
                                  asking=self.asking_until is not None)
        self.dropped["bytes"] += left
        try:
            await self.channel.publish(data)
        except Unavailable as exc:
            self.dropped["publish_failed"] += len(buf) - left
            self._warn("publish", str(exc))
            return
        self.published[0] += 1
        self.published[1] += len(buf) - left

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        beacon = max(self.interval, ALONE_BEACON)
        last = next_at - beacon                  # the first tick publishes: peers find this router at once
        heard = self._heard
        while True:
            next_at += self.interval
            if not self.peers and self.asking_until is None:
                # alone and not asking: no tick has work before the beacon's, unless a peer is heard
                next_at = max(next_at, last + beacon)
                if not heard.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout_at(next_at):
                            await heard.wait()
                if heard.is_set():
                    next_at = min(next_at, loop.time())     # a peer: tick now, then every interval
            else:
                await asyncio.sleep(max(0.0, next_at - loop.time()))
            heard.clear()
            if loop.time() - next_at > self.interval:
                next_at = loop.time()            # fell behind (a stalled loop): do not burst to catch up
            self.expire(time.monotonic())
            if self.asking_until is not None:
                await self.take_handover(time.monotonic())
            if self.peers:
                await self.flush()
            elif next_at >= last + beacon - 1e-6:   # alone: a beacon, carrying what was routed since
                await self.flush(beacon)
            else:
                continue
            last = next_at

    # ------------------------------------------------------------ receive

    async def _receive_loop(self) -> None:
        backoff = self.interval
        while True:
            try:
                if self._sub is None:
                    self._sub = self.channel.subscription()
                    await self._sub.start()
                    backoff = self.interval
                data = await self._sub.get(timeout=1.0)
            except Unavailable as exc:
                self._warn("subscribe", str(exc))
                if self._sub is not None:
                    await self._sub.close()
                    self._sub = None
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
                continue
            if data is not None:
                await self.handle(data, time.monotonic())

    async def handle(self, data: bytes, now: float) -> None:
        """One message off the channel (module header, "Receive")."""
        try:
            batch = decode_batch(data, max_entries=self.batch_max)
        except BadBatch as exc:
            self.dropped[exc.reason] += 1
            self._warn(exc.reason, str(exc))
            return
        if batch.sender == self.sender:
            self.own += 1
            return
        self.received[0] += 1
        if not self.peers:
            self._heard.set()                    # the send loop sleeps while alone (_send_loop)
        self.peers[batch.sender] = (now, batch.outstanding, batch.interval, batch.asking)
        self.expire(now)
        if batch.asking and self._answers(batch.sender, now):
            self._tasks = [t for t in self._tasks if not t.done()]
            self._tasks.append(asyncio.create_task(self.give_handover(batch.sender), name="record-bus-handover"))
        r = self.router
        entries = batch.entries
        for start in range(0, len(entries), RECEIVE_CHUNK):
            if start:
                await asyncio.sleep(0)           # let requests in between chunks
            observe = getattr(r.policy, "observe", None)    # re-read: a plan install may have swapped it
            if observe is None:
                return
            state = r.state
            for e in entries[start:start + RECEIVE_CHUNK]:
                try:
                    i = r.index_of(e.replica)
                except KeyError:
                    self.dropped["unknown_replica"] += 1
                    continue
                observe(i, Request(0, 0.0, e.key, e.prompt_tokens, 0, e.blocks), state)
                self.received[1] += 1

    # ------------------------------------------------------------ hand-over

    def _answers(self, asker: str, now: float) -> bool:
        """Whether this router hands `asker` its state: once per asker, by the lowest sender id
        among the live peers that are not asking themselves and this router (module header)."""
        if not self.handover or self.asking_until is not None or asker in self._answered:
            return False
        for s in [s for s, t in self._answered.items() if now - t > HANDOVER_TTL]:
            del self._answered[s]
        givers = [s for s, v in self.peers.items() if s != asker and not v[3]]
        if min(givers, default=self.sender) < self.sender:
            return False
        self._answered[asker] = now
        return True

    async def give_handover(self, asker: str) -> None:
        """Copy the policy's key memory and record now, encode it off the loop, SET NX it."""
        handover = getattr(self.router.policy, "handover", None)
        if handover is None:
            return
        state = handover()                 # fresh lists, copied here on the loop: the policy goes on routing
        blob = await asyncio.to_thread(encode_handover, self.sender, list(self.router.ids), state)
        if len(blob) > MAX_HANDOVER_BYTES:   # the asker would drop it as "oversize": not written
            self.handovers["failed"] += 1
            self._warn("handover", f"hand-over of {len(blob)} bytes > {MAX_HANDOVER_BYTES}")
            return
        try:
            written = await self.channel.put_handover(asker, blob, HANDOVER_TTL)
        except Unavailable as exc:
            self.handovers["failed"] += 1
            self._warn("handover", str(exc))
            return
        if not written:                      # another giver's is already there (NX): the asker takes that one
            log.info("record bus: a hand-over was already there", extra=kv(sender=self.sender, to=asker))
            return
        self.handovers["given"] += 1
        log.info("record bus: hand-over given", extra=kv(sender=self.sender, to=asker, keys=len(state.memory),
                                                         bytes=len(blob)))

    async def take_handover(self, now: float) -> None:
        """One read of this router's hand-over key while it asks; absorb what is there."""
        try:
            blob = await self.channel.take_handover(self.sender)
        except Unavailable as exc:
            self._warn("handover", str(exc))
            blob = None
        if blob is None:
            if now >= self.asking_until:
                self.asking_until = None
                self.handovers["none"] += 1
                if self.peers:
                    log.info("record bus: no hand-over came", extra=kv(sender=self.sender, peers=len(self.peers)))
            return
        self.asking_until = None
        r = self.router
        try:
            giver, state = await asyncio.to_thread(decode_handover, blob, list(r.ids))
        except BadBatch as exc:
            self.handovers["bad"] += 1
            self._warn("handover", str(exc))
            return
        absorb = getattr(r.policy, "absorb", None)     # the policy active now (an install may have swapped it)
        if absorb is not None:
            absorb(state)
        self.handovers["taken"] += 1
        log.info("record bus: hand-over taken", extra=kv(sender=self.sender, giver=giver, keys=len(state.memory)))

    def expire(self, now: float) -> None:
        """Forget peers silent for PEER_EXPIRY of their intervals; set Router.peer_outstanding."""
        peers = self.peers
        for sender in [s for s, (seen, _, every, _) in peers.items() if now - seen > PEER_EXPIRY * every]:
            del peers[sender]
        self.router.peer_outstanding = sum(v[1] for v in peers.values())

    def _warn(self, what: str, detail: str) -> None:
        """A warning per kind at most every 10 s (a Redis outage must not flood the log)."""
        now = time.monotonic()
        if now - self._warned.get(what, -1e9) >= 10.0:
            self._warned[what] = now
            log.warning("record bus: %s", what, extra=kv(sender=self.sender, detail=detail[:200],
                                                         dropped=sum(self.dropped.values())))


class RecordBusMetrics:
    """Prometheus view of the bus, read at scrape time."""

    def __init__(self, bus: RecordBus) -> None:
        self.bus = bus

    def collect(self):
        b = self.bus
        batches = CounterMetricFamily("cacheroute_dispatcher_record_batches", "record-bus batches, by direction",
                                      labels=["direction"])
        entries = CounterMetricFamily("cacheroute_dispatcher_record_entries",
                                      "record-bus entries published, and received into this router's record",
                                      labels=["direction"])
        for name, (nb, ne) in (("published", b.published), ("received", b.received)):
            batches.add_metric([name], nb)
            entries.add_metric([name], ne)
        yield batches
        yield entries
        dropped = CounterMetricFamily("cacheroute_dispatcher_record_dropped",
                                      "record-bus losses: entries (cap, bytes, unknown_replica, publish_failed) or "
                                      "whole received batches (garbage, oversize)", labels=["reason"])
        for reason, n in b.dropped.items():
            dropped.add_metric([reason], n)
        yield dropped
        handovers = CounterMetricFamily("cacheroute_dispatcher_record_handovers",
                                        "record-bus hand-overs (module header): given to a starting peer, taken at "
                                        "this router's start, none came, bad (dropped), failed (store error, or too large to write)",
                                        labels=["outcome"])
        for outcome, n in b.handovers.items():
            handovers.add_metric([outcome], n)
        yield handovers
        yield GaugeMetricFamily("cacheroute_dispatcher_record_peers", "live peers on the record bus", len(b.peers))
        yield GaugeMetricFamily("cacheroute_dispatcher_record_peer_outstanding",
                                "open streams the live peers last reported (the share's peer term)",
                                b.router.peer_outstanding)
