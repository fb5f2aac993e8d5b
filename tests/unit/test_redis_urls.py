"""Redis URL parsing: single node vs cluster, credentials, our WAIT options, bad input."""

from __future__ import annotations

import pytest

from services.store.connect import parse_redis_url, redact


@pytest.mark.parametrize("url, cluster, tls, nodes, wait", [
    ("redis://127.0.0.1:6379/0", False, False, (("127.0.0.1", 6379),), 0),
    ("rediss://:pw@cache.example:6380/2", False, True, (("cache.example", 6380),), 0),
    ("redis+cluster://10.0.0.1:7000", True, False, (("10.0.0.1", 7000),), 1),
    ("redis+cluster://a:7000,b:7001,[::1]:7002", True, False, (("a", 7000), ("b", 7001), ("::1", 7002)), 1),
    ("rediss+cluster://user:s%40cret@a:7000,b?wait_replicas=2", True, True, (("a", 7000), ("b", 6379)), 2),
    ("redis://127.0.0.1:6379/0?wait_replicas=1&wait_timeout_ms=20", False, False, (("127.0.0.1", 6379),), 1),
])
def test_parse(url, cluster, tls, nodes, wait):
    t = parse_redis_url(url)
    assert (t.cluster, t.tls, t.nodes, t.wait_replicas) == (cluster, tls, nodes, wait)
    assert "wait_" not in t.url and "pw" not in t.where and "cret" not in t.where


def test_credentials_and_redaction():
    t = parse_redis_url("rediss+cluster://user:s%40cret@a:7000")
    assert (t.username, t.password) == ("user", "s@cret")
    assert redact("redis+cluster://u:pw@a:1,b:2") == "redis+cluster://u:***@a:1,b:2"
    assert redact("redis://a:1/0") == "redis://a:1/0"


@pytest.mark.parametrize("url, message", [
    ("http://a:1", "unsupported Redis URL scheme"),
    ("redis+cluster://", "no nodes"),
    ("redis+cluster://a:1/3", "no database number"),
    ("redis+cluster://a:x", "bad port"),
    ("redis+cluster://a:1?socket_timeout=1", "unknown option"),
    ("redis://a:1,b:2/0", "several hosts need a redis"),
    ("redis+cluster://:pw@a:1?wait_replicas=-1", "wait_replicas must be >= 0"),
    ("redis://a:1/0?wait_timeout_ms=soon", "must be integers"),
])
def test_bad_urls_are_one_line_errors_without_the_password(url, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_redis_url(url)
    assert "\n" not in str(err.value) and ":pw@" not in str(err.value)
