"""Routing keys of OpenAI-API requests (pure: no I/O).

Rule, in order:

1. `x-cacheroute-key: <key>` header: that key.
2. Otherwise the request's own text. A chat request's `messages` are rendered to one
   canonical text, message by message in order: `<role>: <content>` followed by a newline,
   where a list-of-parts content contributes its text parts (other parts by their type,
   e.g. `[image_url]`, so two requests that differ only in an image still share a key) and a
   `name` or tool calls are left out. A completion's `prompt` is used as is (a list of
   prompts: the first one; token ids: their decimal ids, space-separated). That text goes
   through `services.core.routing.key_from_prompt`, the derivation of the gRPC `prompt`
   source: its first `--key-tokens` whitespace tokens (default 64) hashed in chained
   16-token blocks, the key being the last chain hash in hex. Requests that share a system
   prompt (and first turns) of at least that many tokens therefore share a key, and a
   client sending the same text over gRPC gets the same key.
3. Scope. `cache_salt` (vLLM's per-request cache isolation field) and the caller's tenant
   (services.auth) are folded in, so two tenants, or two salts, never share a key:
   key = `<tenant>/<base>` when there is a tenant, and `<base>~<salt digest>` when there is
   a salt (8-byte BLAKE2b of the salt, in hex; the salt itself never reaches telemetry).

Text-derived keys are memoised by those first tokens (`PromptKeys`): requests that share a
system prompt share the words the key is derived from, so the dispatcher hashes them once
(bounded: the memo is emptied when it holds `size` prefixes). Same key either way.

Prompt tokens for telemetry are the whitespace-token count of that text (the simulated
engines' tokenizer; for real engines an estimate), prefix tokens 0 as for the gRPC
`prompt` source.
"""

from __future__ import annotations

import hashlib
from services.core import routing
from services.http.oai import chat_text, content_text, prompt_text  # noqa: F401 - the canonical text

KEY_HEADER = "x-cacheroute-key"


def salt_digest(salt: str) -> str:
    return hashlib.blake2b(salt.encode("utf-8"), digest_size=8).hexdigest()


def tenant_cache_salt(tenant: str, salt: str | None = None) -> str:
    """The `cache_salt` sent to a vLLM replica under --tenant-cache-salt: one per tenant (and
    per client salt within it), so a tenant's cached prefixes never serve another tenant."""
    return "t" + salt_digest(f"{tenant}\0{salt or ''}")


def scoped_key(base: str, tenant: str = "", salt: str | None = None) -> str:
    """`base` with the tenant and cache salt folded in; ValueError if the result is no valid key."""
    key = base
    if salt:
        key = f"{key}~{salt_digest(salt)}"
    if tenant:
        key = f"{tenant}/{key}"
    return routing.check_key(key)


class PromptKeys:
    """`routing.key_from_prompt(text, tokens)`, memoised by the text's first `tokens` words."""

    def __init__(self, tokens: int = routing.DEFAULT_KEY_TOKENS, size: int = 4096) -> None:
        if tokens < 1:
            raise ValueError("key tokens must be >= 1")
        self.tokens, self.size = tokens, size
        self._memo: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        head = " ".join(text.split(maxsplit=self.tokens)[:self.tokens])   # the words the key covers
        key = self._memo.get(head)
        if key is None:
            key = routing.key_from_prompt(head, self.tokens)    # same words, same key (ValueError if none)
            if len(self._memo) >= self.size:
                self._memo.clear()
            self._memo[head] = key
        return key


def request_key(text: str, header_key: str | None, *, tenant: str = "", salt: str | None = None,
                key_tokens: int = routing.DEFAULT_KEY_TOKENS, keys: PromptKeys | None = None) -> str:
    """The routing key of an HTTP request whose canonical text is `text` (rules 1-3 above);
    `keys`: a memo of text-derived keys for `key_tokens` (the dispatcher's)."""
    if header_key:
        base = header_key
    elif keys is not None and keys.tokens == key_tokens:
        base = keys(text)
    else:
        base = routing.key_from_prompt(text, key_tokens)
    return scoped_key(base, tenant, salt)
