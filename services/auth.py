"""Data-plane credentials: which bearer keys a dispatcher accepts, and whose tenant each is.

One mechanism for every data-plane entry point: the dispatcher's OpenAI HTTP API
(`Authorization: Bearer <key>`) and its gRPC data plane (Route / RouteBatch / Generate,
`authorization: Bearer <token>` metadata) both ask the same `KeyRing`.

Sources (all optional; none set = the data plane is open):
  --api-key / CACHEROUTE_API_KEY       one accepted key (tenant: see below)
  --api-key-file / CACHEROUTE_API_KEY_FILE
                                       a file with one `key[:tenant]` per line; blank lines
                                       and lines starting with `#` are ignored
  CACHEROUTE_AUTH_TOKEN / _FILE        the deployment token (services.rpc): always accepted
                                       as well, with the empty tenant (operators, the demo,
                                       internal callers)

Tenants. A key's tenant becomes part of every routing key derived from its requests
(services.dispatcher.keys), so two tenants never share a key, a plan entry or a cache
prefix. A key listed without a tenant is its own tenant, named `k` + the first 12 hex
digits of its SHA-256 (stable across restarts and dispatchers, not reversible).

Engine credentials (the other direction: what the dispatcher presents to its HTTP engines,
`EngineKeys`): `--engine-api-key` / CACHEROUTE_ENGINE_API_KEY, one key for every engine, and
`--engine-api-keys-file` / CACHEROUTE_ENGINE_API_KEYS_FILE, lines `URL KEY` (that engine's
key) or `KEY` alone (every engine not listed); a URL's key wins over the default. Each HTTP
backend sends its key as `Authorization: Bearer KEY` (vLLM and SGLang `--api-key`, llama.cpp
`api_key`, hosted OpenAI-compatible endpoints).

Checking. `tenant_of(presented)` compares the presented key with every accepted key
using `hmac.compare_digest` and does not stop at the first match, so the time taken does
not depend on which key (or how much of one) matched. Keys are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Iterable, Mapping

MAX_KEY_CHARS = 4096


class AuthError(Exception):
    """A presented credential was refused. `missing` tells 401-missing from 401/403-wrong."""

    def __init__(self, message: str, *, missing: bool) -> None:
        super().__init__(message)
        self.missing = missing


def default_tenant(key: str) -> str:
    return "k" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def parse_key_lines(text: str, source: str = "key file") -> dict[str, str]:
    """`key[:tenant]` lines -> {key: tenant}; ValueError (one line) on a malformed entry."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, tenant = line.partition(":")
        key, tenant = key.strip(), tenant.strip()
        if not key or (sep and not tenant) or any(c.isspace() for c in key):
            raise ValueError(f"{source} line {number}: expected key[:tenant]")
        if len(key) > MAX_KEY_CHARS:
            raise ValueError(f"{source} line {number}: key longer than {MAX_KEY_CHARS} characters")
        if key in out and out[key] != (tenant or default_tenant(key)):
            raise ValueError(f"{source} line {number}: key listed twice with different tenants")
        out[key] = tenant or default_tenant(key)
    return out


@dataclass(frozen=True)
class KeyRing:
    """Accepted keys -> tenant. Empty: nothing is required (`enabled` is False)."""

    keys: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def tenant_of(self, presented: str | None) -> str:
        """The tenant of an accepted key; AuthError if a key is required and this one is missing or wrong.

        With no keys configured every caller is accepted with the empty tenant."""
        if not self.keys:
            return ""
        if presented is None or presented == "":
            raise AuthError("missing API key: send Authorization: Bearer <key>", missing=True)
        given = presented.encode("utf-8", "surrogateescape")[:MAX_KEY_CHARS * 4]
        found: str | None = None
        for key, tenant in self.keys.items():
            if hmac.compare_digest(given, key.encode("utf-8")) and found is None:
                found = tenant
        if found is None:
            raise AuthError("invalid API key", missing=False)
        return found

    def accepts(self, presented: str | None) -> bool:
        try:
            self.tenant_of(presented)
        except AuthError:
            return False
        return True


@dataclass(frozen=True)
class EngineKeys:
    """The API keys the dispatcher presents to its HTTP engines (module docstring); no repr."""

    default: str | None = field(default=None, repr=False)
    by_url: Mapping[str, str] = field(default_factory=dict, repr=False)

    def for_url(self, url: str) -> str | None:
        return self.by_url.get(url.rstrip("/"), self.default)

    def __repr__(self) -> str:
        return f"EngineKeys(default={'set' if self.default else 'none'}, urls={len(self.by_url)})"


def parse_engine_key_lines(text: str, source: str = "engine keys file") -> tuple[str | None, dict[str, str]]:
    """`URL KEY` or `KEY` lines -> (default key, {url: key}); ValueError (one line, no key in it)."""
    default, by_url = None, {}
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) == 1 and not words[0].startswith(("http://", "https://")):
            if default is not None:
                raise ValueError(f"{source} line {number}: a second default key (a line with only a key)")
            default = words[0]
        elif len(words) == 2 and words[0].startswith(("http://", "https://")):
            by_url[words[0].rstrip("/")] = words[1]
        else:
            raise ValueError(f"{source} line {number}: expected `URL KEY` or `KEY`")
        if len(words[-1]) > MAX_KEY_CHARS:
            raise ValueError(f"{source} line {number}: key longer than {MAX_KEY_CHARS} characters")
    return default, by_url


def engine_keys(api_key: str | None = None, keys_file: str | None = None) -> EngineKeys:
    """EngineKeys from the flag/env key and the keys file (its URLs win); ValueError on a bad file."""
    default, by_url = (api_key.strip() or None) if api_key else None, {}
    if keys_file:
        with open(keys_file, encoding="utf-8") as fh:
            file_default, by_url = parse_engine_key_lines(fh.read(), keys_file)
        default = default or file_default
    return EngineKeys(default, by_url)


def bearer(header: str | None) -> str | None:
    """The credential of an `Authorization` value: None if absent, "" if not a Bearer value."""
    if header is None:
        return None
    text = header.strip()
    return text[7:].strip() if text[:7].lower() == "bearer " else ""


def bearer_of_metadata(metadata) -> str | None:
    """`bearer` of a gRPC call's `authorization` metadata (str or bytes); None if absent."""
    for key, value in metadata or ():
        if key == "authorization":
            return bearer(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
    return None


def keyring(api_key: str | None = None, api_key_file: str | None = None,
            auth_token: str | None = None, extra: Iterable[tuple[str, str]] = ()) -> KeyRing:
    """The ring from the configured sources (see the module docstring); ValueError on a bad file."""
    keys: dict[str, str] = {}
    if api_key:
        keys[api_key.strip()] = default_tenant(api_key.strip())
    if api_key_file:
        with open(api_key_file, encoding="utf-8") as fh:
            keys.update(parse_key_lines(fh.read(), api_key_file))
    for key, tenant in extra:
        keys[key] = tenant
    if auth_token:
        keys[auth_token] = ""
    return KeyRing(keys)


def keyring_from_env(environ: Mapping[str, str], auth_token: str | None = None) -> KeyRing:
    """`keyring` from CACHEROUTE_API_KEY / CACHEROUTE_API_KEY_FILE and the deployment token."""
    return keyring(environ.get("CACHEROUTE_API_KEY") or None, environ.get("CACHEROUTE_API_KEY_FILE") or None,
                   auth_token)
