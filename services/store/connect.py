"""Redis URLs -> redis-py clients, single node or Redis Cluster (sync and asyncio).

  redis://[[user]:password@]host[:port][/db]           one node (redis-py's own URL form)
  rediss://...                                         the same over TLS
  redis+cluster://[[user]:password@]host:port[,host:port...]    a Redis Cluster: redis-py's
  rediss+cluster://...                                 cluster client, seeded with these nodes
                                                       (it discovers the rest); over TLS

Query options CacheRoute reads itself (removed before redis-py sees the URL):
  wait_replicas=N      after every plan-slot write, WAIT for N replicas on the connection that
                       wrote (default 1 for a cluster URL, 0 for a single node)
  wait_timeout_ms=MS   how long that WAIT may block (default 500)
Any other query option is an error. Cluster URLs take no database number (a cluster has
only db 0).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
PLAIN_SCHEMES = {"redis": False, "rediss": True, "unix": False}
DEFAULT_WAIT_TIMEOUT_MS = 500


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: where, how to authenticate, and the WAIT policy."""

    cluster: bool
    tls: bool
    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    url: str                       # the URL for redis-py (single node), without our options
    wait_replicas: int
    wait_timeout_ms: int

    @property
    def where(self) -> str:
        """host:port[,host:port...] for messages (never the password)."""
        return ",".join(f"{h}:{p}" for h, p in self.nodes)


def _host_port(item: str, url: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):                      # [::1]:7000
        host, _, rest = item[1:].partition("]")
        port_text = rest.lstrip(":")
    else:
        host, _, port_text = item.rpartition(":")
        if not host:
            host, port_text = port_text, ""
    try:
        port = int(port_text) if port_text else 6379
    except ValueError:
        raise ValueError(f"bad port in Redis URL node {item!r}") from None
    if not host or not (0 < port < 65536):
        raise ValueError(f"bad node {item!r} in Redis URL {redact(url)}")
    return host, port


def redact(url: str) -> str:
    """The URL with any password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    userinfo, _, tail = rest.partition("@")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{tail}"


def parse_redis_url(url: str) -> RedisTarget:
    """Parse and check a Redis URL; ValueError (one line, no password) when malformed."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in CLUSTER_SCHEMES and scheme not in PLAIN_SCHEMES:
        raise ValueError(f"unsupported Redis URL scheme {parts.scheme!r} (redis, rediss, redis+cluster, "
                         f"rediss+cluster)")
    cluster = scheme in CLUSTER_SCHEMES
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in ("wait_replicas", "wait_timeout_ms")}
    rest = [(k, v) for k, v in query if k not in ours]
    try:
        wait_replicas = int(ours.get("wait_replicas", "1" if cluster else "0"))
        wait_timeout = int(ours.get("wait_timeout_ms", str(DEFAULT_WAIT_TIMEOUT_MS)))
    except ValueError:
        raise ValueError(f"wait_replicas and wait_timeout_ms must be integers in {redact(url)}") from None
    if wait_replicas < 0 or wait_timeout < 1:
        raise ValueError(f"wait_replicas must be >= 0 and wait_timeout_ms >= 1 in {redact(url)}")
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(pw) if colon else None
    if cluster:
        if rest:
            raise ValueError(f"unknown option(s) {', '.join(k for k, _ in rest)} in Redis URL {redact(url)}")
        if parts.path not in ("", "/", "/0"):
            raise ValueError(f"a Redis Cluster URL takes no database number: {redact(url)}")
        nodes = tuple(_host_port(h, url) for h in hosts.split(",") if h.strip())
        if not nodes:
            raise ValueError(f"no nodes in Redis Cluster URL {redact(url)}")
        clean = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        return RedisTarget(True, CLUSTER_SCHEMES[scheme], nodes, username, password, clean, wait_replicas,
                           wait_timeout)
    if "," in hosts:
        raise ValueError(f"several hosts need a redis+cluster:// URL: {redact(url)}")
    clean = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, urllib.parse.urlencode(rest), ""))
    node = (parts.hostname or "127.0.0.1", parts.port or 6379) if scheme != "unix" else (parts.path, 0)
    return RedisTarget(False, PLAIN_SCHEMES[scheme], (node,), username, password, clean, wait_replicas,
                       wait_timeout)


def _cluster_kwargs(target: RedisTarget, options: dict[str, Any]) -> dict[str, Any]:
    kw = dict(options)
    kw.pop("retry_on_timeout", None)   # the cluster client's retry policy is its own
    kw.update(username=target.username, password=target.password)
    if target.tls:
        kw["ssl"] = True
    return kw


def async_client(target: RedisTarget | str, **options: Any):
    """A redis.asyncio client for the URL: `RedisCluster` for a cluster URL, else `Redis`."""
    if isinstance(target, str):
        target = parse_redis_url(target)
    if target.cluster:
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],
                            **_cluster_kwargs(target, options))
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(target.url, **options)


def sync_client(target: RedisTarget | str, **options: Any):
    """The blocking twin of `async_client`: `redis.RedisCluster` or `redis.Redis`."""
    if isinstance(target, str):
        target = parse_redis_url(target)
    if target.cluster:
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],
                            **_cluster_kwargs(target, options))
    import redis

    return redis.Redis.from_url(target.url, **options)
