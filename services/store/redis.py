"""The store on Redis: `RedisStore` (redis.asyncio; one Lua script, services/store/lua/, for
every conditional multi-key step; key layout Redis Cluster compatible, services/store/keys.py).

Telemetry windows in columns: a window read seals every closed bucket it fetched into one blob
(keys once, counts as a packed int64 array; services/store/keys.py `seal_blob`, lua/seal.lua,
only if no write came since), so Redis holds about 40 bytes per key and bucket instead of three
hash fields, and a cold read is one GET per closed bucket and a numpy merge. The open bucket
and late arrivals into a sealed one stay hashes (HINCRBY), folded in by the next read.

When Redis is unreachable every call raises `services.errors.Unavailable` with one line
(`redis unavailable at HOST:PORT: ...`); the next call reconnects (one immediate retry on a
broken pooled connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from importlib import resources
from typing import AsyncIterator, Iterable, Sequence

import orjson

from services.core.plan import Plan
from services.errors import FailedPrecondition, NotFound, Unavailable
from services.model import (
    Activation,
    ArrivalRecord,
    CacheCounters,
    CacheStatRecord,
    CacheStatsWrite,
    ControlState,
    HistoryEntry,
    LeaseInfo,
    Mode,
    PlanEvent,
    RatesSnapshot,
)
from services.store.buckets import (
    CACHE_COUNTER_LIMIT,
    BucketPart,
    counters,
    first_of_each_batch_id,
    key_totals,
    newest,
    snapshot_columns,
    split_by_bucket,
    window_buckets,
)
from services.store.config import TelemetryConfig
from services.store.connect import async_client, parse_redis_url, sync_client
from services.store.contract import (HOME_FIELDS_PER_BUCKET, PREFIX_FIELDS_PER_BUCKET, HISTORY_MAX, Store, Subscription, check_engine_write,
                                     check_version, lease_ms, refusal, stale_engines)
from services.store.keys import (
    engines_blob,
    engines_from_blob,
    Keys,
    arrival_from_log,
    decode_plan,
    encode_plan,
    event_from_json,
    history_from_json,
    log_blob,
    merge_counters,
    seal_blob,
    stat_groups,
    summary_of,
    unseal_blob,
)
from services.store.records import RecordChannel, RecordSubscription
from services.store.window_cache import BucketCache


def _load_scripts() -> dict[str, str]:
    """The Lua sources, read once at import (services/store/lua/NAME.lua)."""
    folder = resources.files("services.store") / "lua"
    return {f.name[:-4]: f.read_text(encoding="utf-8") for f in folder.iterdir() if f.name.endswith(".lua")}


SCRIPTS = _load_scripts()
log = logging.getLogger("cacheroute.store")
WINDOW_READ_TIMEOUT = 30.0   # seconds a window read (worker thread) may wait for Redis's reply


def _token_arg(fencing_token: int | None) -> str | int:
    return "" if fencing_token is None else fencing_token


def _raise_if_fenced(status: bytes) -> None:
    if status == b"fenced":
        raise refusal("fenced", 0, 0)


class RedisStore(Store):
    """The store on Redis: one node (redis://, rediss://) or a Redis Cluster (redis+cluster://,
    rediss+cluster://; services/store/connect.py)."""

    def __init__(self, url: str, *, prefix: str = "cr", telemetry: TelemetryConfig | None = None,
                 timeout: float = 2.0) -> None:
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        super().__init__(telemetry)
        self.url = url
        self.prefix = prefix
        self.keys = Keys(prefix)
        self._tb, self._c, self._p = self.keys.tb, self.keys.cache, self.keys.plans
        # One immediate retry on a broken connection (a pooled socket to a restarted server);
        # none on timeouts, where the command may have run. Writes are safe to repeat: batches
        # are deduplicated, activation is a CAS, a skipped version number is harmless.
        self.target = parse_redis_url(url)
        self._cluster = self.target.cluster
        self._redis = async_client(
            self.target, socket_timeout=timeout, socket_connect_timeout=timeout, retry_on_timeout=False,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)), health_check_interval=30)
        self._where = self.target.where  # never the password
        r = self._redis
        self._arrivals = r.register_script(SCRIPTS["arrivals"])
        self._cache = r.register_script(SCRIPTS["cache"])
        self._prefix = r.register_script(SCRIPTS["prefix"])
        self._homes = r.register_script(SCRIPTS["homes"])
        self._put_plan = r.register_script(SCRIPTS["put_plan"])
        self._activate = r.register_script(SCRIPTS["activate"])
        self._set_mode = r.register_script(SCRIPTS["set_mode"])
        self._pin = r.register_script(SCRIPTS["pin"])
        self._unpin = r.register_script(SCRIPTS["unpin"])
        self._prune = r.register_script(SCRIPTS["prune"])
        self._acquire = r.register_script(SCRIPTS["acquire"])
        self._renew = r.register_script(SCRIPTS["renew"])
        self._next_version = r.register_script(SCRIPTS["next_version"])
        self._put_engines = r.register_script(SCRIPTS["put_engines"])
        self._budget = r.register_script(SCRIPTS["budget"])
        self._seen_version = 0   # highest version seen in the store (reset detection, no reuse)
        self.unreplicated_writes = 0   # plan writes whose WAIT saw fewer replicas than asked
        self._cluster_ready = False
        self._decoded: OrderedDict[int, tuple[bytes, int, Plan]] = OrderedDict()   # version -> summary, size, plan
        self._windows = BucketCache()
        self._window_lock = asyncio.Lock()   # one window read at a time (the cache is shared)
        self._sync = None                    # blocking client of window reads (worker thread)
        self._timeout = timeout

    async def _queue_script(self, pipe, script, keys: list[str], args: list[object]) -> None:
        """Queue a Lua script call on a pipeline. Redis Cluster pipelines refuse EVALSHA, so
        there the script text goes with EVAL (the server caches it by its SHA all the same)."""
        if self._cluster:
            pipe.eval(script.script, len(keys), *keys, *args)
        else:
            await script(keys=keys, args=args, client=pipe)

    async def _plan_write(self, script, keys: list[str], args: list[object]):
        """A plan-slot script, then (wait_replicas > 0) WAIT on the same connection, so the
        write is on that many replicas before the caller acknowledges it: a replica promoted
        after the master dies has it. WAIT counts the connection's own writes, hence one
        pipeline (a cluster pipeline groups the two commands on the slot's master). Fewer
        acknowledgements than asked (no replica reachable within the timeout) leave the write
        in place and are logged and counted (`unreplicated_writes`)."""
        need = self.target.wait_replicas
        if need <= 0:
            return await script(keys=keys, args=args)
        pipe = self._redis.pipeline(transaction=False)
        if self._cluster:
            await self._redis.initialize()
            node = self._redis.get_node_from_key(keys[0])
            pipe.eval(script.script, len(keys), *keys, *args)
            pipe.execute_command("WAIT", need, self.target.wait_timeout_ms, target_nodes=node)
        else:
            await script(keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", need, self.target.wait_timeout_ms)
        result, acked = await pipe.execute()
        if int(acked) < need:
            self.unreplicated_writes += 1
            log.warning("plan write not replicated", extra={"fields": {
                "replicas_acked": int(acked), "wanted": need, "timeout_ms": self.target.wait_timeout_ms,
                "key": keys[0], "where": self._where}})
        return result

    async def _mget(self, keys: list[str]) -> list[bytes | None]:
        """MGET of keys in any slots (a cluster splits it per slot)."""
        if self._cluster:
            return await self._redis.mget_nonatomic(keys)
        return await self._redis.mget(keys)

    @contextlib.asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        from redis import exceptions as rx

        try:
            if self._cluster and not self._cluster_ready:
                # before the first command: redis-py's async cluster client runs a transaction
                # pipeline on an uninitialised client against another event loop
                await self._redis.initialize()
                self._cluster_ready = True
            yield
        except rx.RedisClusterException as exc:
            # the cluster client's own refusals of a command (keys in several slots) are bugs,
            # not outages; "cannot be connected", an uncovered slot and the like are outages
            if "same slot" in str(exc) or "same key slot" in str(exc):
                raise
            detail = " ".join(str(exc).split())[:160] or type(exc).__name__
            raise Unavailable(f"redis unavailable at {self._where}: {detail}") from None
        except (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, rx.ClusterError, rx.TryAgainError,
                OSError, asyncio.TimeoutError) as exc:
            detail = " ".join(str(exc).split())[:160] or type(exc).__name__
            raise Unavailable(f"redis unavailable at {self._where}: {detail}") from None

    # ---- telemetry

    async def record_arrival_batches(self, batches: Sequence[tuple[str, Sequence[ArrivalRecord]]]) -> list[bool]:
        # One script per bucket for all the batches' parts in it: counts summed over the parts
        # (one HINCRBY per distinct key), only the newest gaps/log records that the caps keep.
        # A part whose marker is already set makes the script write nothing and name it; the
        # bucket is retried without it (rare: replays), so every part lands at most once.
        counted = [not arrivals for _, arrivals in batches]
        pending: dict[int, list[tuple[int, str, BucketPart]]] = {}
        for b, (batch_id, arrivals) in enumerate(batches):
            for idx, part in split_by_bucket(arrivals, self.telemetry).items():
                pending.setdefault(idx, []).append((b, batch_id, part))
        async with self._guard():
            while pending:
                calls = [(idx, first_of_each_batch_id(parts)) for idx, parts in pending.items()]
                pipe = self._redis.pipeline(transaction=False)
                for idx, parts in calls:
                    keys, args = self._arrival_call(idx, parts)
                    await self._queue_script(pipe, self._arrivals, keys, args)
                results = await pipe.execute()
                pending = {}
                for (idx, parts), seen in zip(calls, results):
                    if not seen:
                        for b, _, _ in parts:
                            counted[b] = True
                        continue
                    marked = [j for j, p in enumerate(parts) if p[1]]
                    drop = {marked[i - 1] for i in seen}
                    if rest := [p for j, p in enumerate(parts) if j not in drop]:
                        pending[idx] = rest
        return counted

    def _arrival_call(self, idx: int, parts: list[tuple[int, str, BucketPart]]) -> tuple[list[str], list[object]]:
        cfg = self.telemetry
        flat: list[str] = []
        for key, (n, pt, xt) in key_totals(part for _, _, part in parts).items():
            flat += (key, str(n), str(pt), str(xt))
        gaps = newest((part.gaps for _, _, part in parts), cfg.gaps_per_bucket)
        rows = newest((part.rows for _, _, part in parts), cfg.log_per_bucket)
        keys = [self._tb(idx, h) for h in ("n", "pt", "xt", "gaps", "log", "v", "untracked", "sealed_keys")]
        keys += [self._tb(idx, f"seen:{batch_id}") for _, batch_id, _ in parts if batch_id]
        args = [cfg.ttl, cfg.gaps_per_bucket, cfg.log_per_bucket, orjson.dumps(flat),
                "\n".join(map(repr, gaps)), log_blob(rows), os.urandom(9).hex(), cfg.keys_per_bucket]
        return keys, args

    async def write_cache_stats(self, batch_id: str, stats: Sequence[CacheStatRecord], *,
                                now: float) -> CacheStatsWrite:
        cfg = self.telemetry
        args: list[object] = [cfg.ttl, "1" if batch_id else "0", CACHE_COUNTER_LIMIT]
        for replica, deltas in stat_groups(stats).items():
            args += (replica, *deltas)
        keys = [self._c(f"seen:{batch_id}"), self._c(f"b:{cfg.bucket(now)}"), self._c("total")]
        async with self._guard():
            reply = await self._cache(keys=keys, args=args)
        return CacheStatsWrite(bool(int(reply[0])), tuple(r.decode() for r in reply[1:]))

    async def record_prefix_counts(self, batch_id: str, counts: Sequence[tuple[float, str, int]]) -> bool:
        # one script per bucket (each bucket's keys share its hash tag), all in one pipeline
        cfg = self.telemetry
        parts: dict[int, dict[str, int]] = {}
        for t, field, n in counts:
            bucket = parts.setdefault(cfg.bucket(t), {})
            bucket[field] = bucket.get(field, 0) + n
        if not parts:
            return True
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            for idx, rows in parts.items():
                args: list[object] = [cfg.ttl, "1" if batch_id else "0", PREFIX_FIELDS_PER_BUCKET]
                for field, n in rows.items():
                    args += (field, n)
                keys = [self._tb(idx, f"seenp:{batch_id}"), self._tb(idx, "pfx")]
                await self._queue_script(pipe, self._prefix, keys, args)
            results = await pipe.execute()
        return any(bool(r) for r in results)

    async def prefix_counts(self, now: float, window_seconds: float) -> dict[str, int]:
        first, last, _ = window_buckets(now, window_seconds, self.telemetry)
        out: dict[str, int] = {}
        for row in await self._hashes(self._tb(i, "pfx") for i in range(first, last + 1)):
            for field, n in row.items():
                name = field.decode()
                out[name] = out.get(name, 0) + int(n)
        return out

    async def record_homes(self, rows: Sequence[tuple[float, str, str]]) -> None:
        # one script per bucket (each bucket's keys share its hash tag), all in one pipeline
        cfg = self.telemetry
        parts: dict[int, dict[str, str]] = {}
        for t, key, replica in rows:
            parts.setdefault(cfg.bucket(t), {})[key] = replica      # a key's later row wins
        if not parts:
            return
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            for idx, homes in parts.items():
                args: list[object] = [cfg.ttl, HOME_FIELDS_PER_BUCKET]
                for key, replica in homes.items():
                    args += (key, replica)
                await self._queue_script(pipe, self._homes, [self._tb(idx, "home")], args)
            await pipe.execute()

    async def served_homes(self, now: float, window_seconds: float) -> dict[str, str]:
        first, last, _ = window_buckets(now, window_seconds, self.telemetry)
        out: dict[str, str] = {}
        for row in await self._hashes(self._tb(i, "home") for i in range(first, last + 1)):   # oldest first
            out.update((k.decode(), v.decode()) for k, v in row.items())
        return out

    async def _hashes(self, names: Iterable[str]) -> list[dict[bytes, bytes]]:
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(name)
            return await pipe.execute()

    async def mark_telemetry_start(self, now: float) -> float:
        key = self.keys.telemetry_since()
        async with self._guard():
            await self._redis.set(key, repr(float(now)), nx=True)
            return float(await self._redis.get(key))

    async def window_rates(self, now: float, window_seconds: float) -> RatesSnapshot:
        # Buckets whose token is unchanged since the last read come from the cache. The token
        # is read before the hashes in one pipeline, so a write racing the read can only make
        # the cached token older than the content (one extra re-read later), never newer.
        # The whole read (a window can hold hundreds of thousands of hash fields: parsing them
        # and folding them into arrays takes CPU) runs in a worker thread on a blocking client,
        # one at a time: it must not stall the event loop that ingests telemetry.
        first, last, start = window_buckets(now, window_seconds, self.telemetry)
        idxs = range(first, last + 1)
        cache = self._windows

        def read() -> RatesSnapshot:
            r = self._blocking()
            names = [self._tb(i, "v") for i in idxs] + [self.keys.telemetry_since()]
            *tokens, since = r.mget_nonatomic(names) if self._cluster else r.mget(names)
            stale = [(i, t) for i, t in zip(idxs, tokens) if t is None or not cache.fresh(i, t)]
            pipe = r.pipeline(transaction=False)
            for i in idxs:
                pipe.hget(self._tb(i, "untracked"), "n")
            for i, _ in stale:
                pipe.get(self._tb(i, "sealed"))
                for h in ("n", "pt", "xt"):
                    pipe.hgetall(self._tb(i, h))
            replies = pipe.execute()
            untracked = sum(int(v) for v in replies[:len(idxs)] if v is not None)
            rows = replies[len(idxs):]
            seal = []
            for j, (i, token) in enumerate(stale):
                sealed, n, pt, xt = rows[4 * j:4 * j + 4]
                cache.put(i, token, n, pt, xt, sealed=unseal_blob(sealed) if sealed else None)
                if token is not None and i < last and n:      # closed, with counts still in hashes
                    seal.append((i, token))
            names = list(cache.index) if seal else []
            for i, token in seal:
                self._seal(r, i, token, names)
            span_start = start if since is None or float(since) >= now else max(start, float(since))
            keys, acc = cache.columns(idxs)
            return snapshot_columns(first, last, span_start, now, keys, acc, untracked, cache.key_rank(keys),
                                    key_space=cache.space)

        async with self._window_lock, self._guard():
            return await asyncio.to_thread(read)

    def _seal(self, r, idx: int, token: bytes, names: list[bytes]) -> bool:
        """Seal closed bucket `idx` (services/store/lua/seal.lua) from the cache's copy of what
        the read just fetched under `token` (`names`: the cache's keys by id); a write since
        then leaves the bucket as it is."""
        _, ids, values = self._windows.buckets[idx]
        keys = [names[i] for i in ids.tolist()]
        blob = seal_blob(keys, values)
        if blob is None:
            return False
        names = [self._tb(idx, h) for h in ("v", "n", "pt", "xt", "sealed", "sealed_keys")]
        return bool(r.eval(SCRIPTS["seal"], len(names), *names, token, blob, len(keys)))

    def _blocking(self):
        """A blocking client (single node or cluster) for reads done in a worker thread
        (window_rates), made on first use."""
        if self._sync is None:
            # a big window is a big reply: allow it time (it blocks only this worker thread)
            self._sync = sync_client(self.target, socket_timeout=max(self._timeout, WINDOW_READ_TIMEOUT),
                                     socket_connect_timeout=self._timeout, retry_on_timeout=False)
        return self._sync

    async def cache_stats(self, now: float, window_seconds: float) -> dict[str, CacheCounters]:
        first, last, _ = window_buckets(now, window_seconds, self.telemetry)
        rows: dict[str, list[int]] = {}
        for row in await self._hashes(self._c(f"b:{i}") for i in range(first, last + 1)):
            merge_counters(rows, {k.decode(): int(v) for k, v in row.items()})
        return counters(rows)

    async def cache_totals(self) -> dict[str, CacheCounters]:
        rows: dict[str, list[int]] = {}
        (row,) = await self._hashes([self._c("total")])
        merge_counters(rows, {k.decode(): int(v) for k, v in row.items()})
        return counters(rows)

    async def _lists(self, now: float, window_seconds: float, name: str) -> list[bytes]:
        first, last, _ = window_buckets(now, window_seconds, self.telemetry)
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            for i in range(first, last + 1):
                pipe.lrange(self._tb(i, name), 0, -1)
            return [item for chunk in await pipe.execute() for item in chunk]

    async def interarrival_sample(self, now: float, window_seconds: float) -> list[float]:
        return [float(g) for g in await self._lists(now, window_seconds, "gaps")]

    async def recent_arrivals(self, now: float, window_seconds: float) -> list[ArrivalRecord]:
        return [arrival_from_log(r) for r in await self._lists(now, window_seconds, "log")]

    # ---- plans

    DECODED_PLANS = 2    # decoded plans kept: the active one and the newest (a million keys: ~0.3 GB each)
    INLINE_DECODE_BYTES = 1 << 20    # plans stored in fewer bytes are decoded on the event loop

    def _observe_versions(self, counter: int, seen: int) -> None:
        """`counter`: the store's version counter as read by a call sent when this client had
        seen versions up to `seen`. Below that the store lost versions (a reset). Calls overlap
        (the planner's loop, repairs and engine changes each take versions), so a counter below
        what was seen only after the call went out is no reset: one that answered later did."""
        if counter < seen:
            self._decoded.clear()
            self.on_reset(seen, counter)
        self._seen_version = max(self._seen_version, counter)

    async def next_version(self) -> int:
        seen = self._seen_version
        async with self._guard():
            version, before = await self._plan_write(self._next_version, [self._p("seq")], [seen])
        self._observe_versions(int(before), seen)
        self._observe_versions(int(version), seen)
        return int(version)

    async def put_plan(self, plan: Plan) -> None:
        check_version(plan.version)
        v = plan.version
        keys = [self._p(f"plan:{v}"), self._p(f"summary:{v}"), self._p("index"), self._p("seq")]
        blob, summary = encode_plan(plan), encode_plan(summary_of(plan))
        async with self._guard():
            if not await self._plan_write(self._put_plan, keys, [v, blob, summary]):
                raise FailedPrecondition(f"plan version {v} already exists")
        self._seen_version = max(self._seen_version, v)     # a version this client took: no reset to tell
        self._keep_decoded(v, summary, len(blob), plan)

    def _keep_decoded(self, version: int, summary: bytes, size: int, plan: Plan) -> None:
        self._decoded[version] = (summary, size, plan)
        self._decoded.move_to_end(version)
        while len(self._decoded) > self.DECODED_PLANS:
            self._decoded.popitem(last=False)

    async def get_plan(self, version: int) -> Plan:
        # Plans are immutable, so one this store wrote or decoded is handed back as it is (the
        # control loop reads the active plan every interval: a million keys are seconds of
        # JSON) once its summary and its size in Redis still match: a pruned version, or one
        # reused after the store lost its state, is read and decoded again.
        plan_key, summary_key = self._p(f"plan:{version}"), self._p(f"summary:{version}")
        async with self._guard():
            kept = self._decoded.get(version)
            if kept is not None:
                pipe = self._redis.pipeline(transaction=False)
                pipe.get(summary_key)
                pipe.strlen(plan_key)
                summary, size = await pipe.execute()
                if (summary, size) == kept[:2]:
                    if version in self._decoded:        # a reset may have cleared it during the await
                        self._decoded.move_to_end(version)
                    return kept[2]
                self._decoded.pop(version, None)
            pipe = self._redis.pipeline(transaction=False)
            pipe.get(plan_key)
            pipe.get(summary_key)
            blob, summary = await pipe.execute()
        if blob is None:
            raise NotFound(f"plan version {version} not found")
        # a large plan decodes in a thread: on the loop, a million keys held it for seconds,
        # long enough for every other command in flight to reach its socket timeout
        plan = decode_plan(blob) if len(blob) < self.INLINE_DECODE_BYTES else await asyncio.to_thread(decode_plan, blob)
        if summary is not None:
            self._keep_decoded(version, summary, len(blob), plan)
        return plan

    async def list_plans(self, limit: int = 20, before_version: int = 0) -> list[Plan]:
        top = f"({before_version}" if before_version > 0 else "+inf"
        async with self._guard():
            versions = await self._redis.zrevrangebyscore(self._p("index"), top, "-inf", start=0, num=max(0, limit))
            if not versions:
                return []
            blobs = await self._redis.mget([self._p(f"summary:{int(v)}") for v in versions])
        return [decode_plan(b) for b in blobs if b is not None]

    async def get_control(self) -> ControlState:
        seen = self._seen_version
        async with self._guard():
            pipe = self._redis.pipeline(transaction=True)
            pipe.get(self._p("active"))
            pipe.hgetall(self._p("mode"))
            pipe.get(self._p("pinned"))
            pipe.get(self._p("seq"))
            active, mode, pinned, seq = await pipe.execute()
        mode = {k.decode(): v.decode() for k, v in mode.items()}
        self._observe_versions(int(seq or 0), seen)
        return ControlState(int(active or 0), Mode(mode.get("mode", "planned")), mode.get("reason", ""),
                            float(mode.get("at", 0.0)), int(pinned or 0), int(seq or 0))

    async def _cas(self, version: int, *, expected: int, now: float, reason: str, event: str,
                   fencing_token: int | None, automatic: bool) -> Activation:
        keys = [self._p("active"), self._p("history"), self._p("lease"), self._p("pinned"), self._p("mode"),
                self._p("index"), self._p("events")]
        args = [version, expected, "" if fencing_token is None else fencing_token, event, reason, repr(float(now)),
                "1" if automatic else "0", HISTORY_MAX]
        async with self._guard():
            status, current, target = await self._plan_write(self._activate, keys, args)
        status = status.decode()
        if status == "ok":
            return Activation(int(target), int(current), True)
        if status == "same":
            return Activation(int(current), int(current), False)
        raise refusal(status, int(target), int(current))

    async def activate(self, version: int, *, expected: int, now: float, reason: str = "",
                       fencing_token: int | None = None, automatic: bool = False) -> Activation:
        check_version(version)
        return await self._cas(version, expected=expected, now=now, reason=reason, event="activate",
                               fencing_token=fencing_token, automatic=automatic)

    async def rollback(self, *, expected: int, now: float, to_version: int = 0, reason: str = "",
                       fencing_token: int | None = None) -> Activation:
        return await self._cas(to_version, expected=expected, now=now, reason=reason, event="rollback",
                               fencing_token=fencing_token, automatic=False)

    async def history(self, limit: int = 20) -> list[HistoryEntry]:
        async with self._guard():
            rows = await self._redis.lrange(self._p("history"), 0, max(0, limit) - 1) if limit > 0 else []
        return [history_from_json(r) for r in rows]

    async def set_mode(self, mode: Mode, *, reason: str, now: float,
                       fencing_token: int | None = None) -> ControlState:
        mode = Mode(mode)
        async with self._guard():
            keys = [self._p("mode"), self._p("active"), self._p("events"), self._p("lease")]
            status = await self._plan_write(self._set_mode, keys, [mode.value, reason, repr(float(now)),
                                                                   _token_arg(fencing_token)])
        _raise_if_fenced(status)
        return await self.get_control()

    async def pin(self, version: int, *, fencing_token: int | None = None) -> ControlState:
        check_version(version)
        async with self._guard():
            status = await self._plan_write(self._pin, [self._p("pinned"), self._p("active"), self._p("index"),
                                                        self._p("lease")], [version, _token_arg(fencing_token)])
        _raise_if_fenced(status)
        status = status.decode()
        if status == "missing":
            raise NotFound(f"plan version {version} not found")
        if status == "not_active":
            raise FailedPrecondition(f"version {version} is not the active version")
        return await self.get_control()

    async def unpin(self, *, fencing_token: int | None = None) -> ControlState:
        async with self._guard():
            status = await self._plan_write(self._unpin, [self._p("pinned"), self._p("lease")],
                                            [_token_arg(fencing_token)])
        _raise_if_fenced(status)
        return await self.get_control()

    async def prune_plans(self, keep: int) -> int:
        # Plan keys are derived inside the script from prefixes; all share the {plans} tag.
        keys = [self._p("index"), self._p("active"), self._p("pinned"), self._p("history"), self._p("plan:"),
                self._p("summary:")]
        async with self._guard():
            return int(await self._prune(keys=keys, args=[max(0, keep)]))

    def subscribe(self) -> "Subscription":
        return _RedisSubscription(self)

    # ---- the record bus between dispatchers (services/store/records.py)

    def records(self) -> RecordChannel:
        return RecordChannel(self)

    # ---- the engine set

    async def get_engine_set(self):
        async with self._guard():
            blob = await self._redis.hget(self._p("engines"), "set")
        return engines_from_blob(blob)

    async def put_engine_set(self, engines, *, expected: int, fencing_token: int | None = None):
        check_engine_write(engines, expected)
        async with self._guard():
            status, current = await self._plan_write(
                self._put_engines, [self._p("engines"), self._p("lease")],
                [expected, engines.version, engines_blob(engines), _token_arg(fencing_token)])
        status = status.decode() if isinstance(status, bytes) else status
        if status == "fenced":
            raise refusal("fenced", 0, 0)
        if status == "stale":
            raise stale_engines(int(current))
        return engines

    # ---- lease

    async def take_budget(self, caller: str, n: int, *, rate: float, burst: float, now: float) -> int:
        if n <= 0:
            return 0
        async with self._guard():
            return int(await self._budget(keys=[self.keys.budget(caller)],
                                          args=[n, repr(float(rate)), repr(float(burst)), int(now * 1000)]))

    async def acquire_lease(self, holder: str, ttl_seconds: float) -> int | None:
        async with self._guard():
            token = await self._plan_write(self._acquire, [self._p("lease"), self._p("fence")],
                                           [holder, lease_ms(ttl_seconds)])
        return None if token is None else int(token)

    async def renew_lease(self, holder: str, token: int, ttl_seconds: float) -> bool:
        async with self._guard():
            return bool(await self._renew(keys=[self._p("lease")], args=[holder, token, lease_ms(ttl_seconds)]))

    async def release_lease(self, holder: str, token: int) -> bool:
        async with self._guard():
            return bool(await self._renew(keys=[self._p("lease")], args=[holder, token, ""]))

    async def lease(self) -> LeaseInfo | None:
        async with self._guard():
            pipe = self._redis.pipeline(transaction=True)
            pipe.hgetall(self._p("lease"))
            pipe.pttl(self._p("lease"))
            row, ttl = await pipe.execute()
        if not row:
            return None
        return LeaseInfo(row[b"holder"].decode(), int(row[b"token"]), max(0, ttl) / 1000)

    # ---- lifecycle

    async def ping(self) -> None:
        async with self._guard():
            await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()
        if self._sync is not None:
            sync, self._sync = self._sync, None
            await asyncio.to_thread(sync.close)


class _RedisSubscription(RecordSubscription, Subscription):
    """Plan events on the store's `events` channel: the record bus's raw subscription (plain
    SUBSCRIBE, broadcast in a Cluster), each message decoded as a PlanEvent."""

    def __init__(self, store: RedisStore) -> None:
        super().__init__(store, store._p("events"), sharded=False)

    async def get(self, timeout: float) -> PlanEvent | None:
        data = await super().get(timeout)
        return None if data is None else event_from_json(data)

