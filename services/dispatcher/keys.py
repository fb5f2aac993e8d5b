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

Text-derived keys are memoised by the text up to those first tokens (`PromptKeys`): requests
that share a system prompt share the words the key is derived from, so the dispatcher hashes
them once and finds them again by one prefix compare (bounded: the memo is emptied when it
holds `size` prefixes). Same key either way.

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
    """`routing.key_from_prompt(text, tokens)`, memoised by the text up to its first `tokens` words.

    The key covers a text's first `tokens` words, so a text that starts with another's first
    `tokens` words and the whitespace after them (`head`) has the same key. The memo holds such
    heads by their first 64 characters, and a hit is one `startswith` (a memcmp): no split of the
    text (at 1,024 key tokens the split and join of a hit cost ~45 us per request, issue 22).
    A text with at most `tokens` words is not memoised (a longer text starting with it may
    continue its last word). Bounded: emptied when it holds `size` heads; at most `bucket`
    heads share their first 64 characters (the oldest goes)."""

    PROBE = 64

    def __init__(self, tokens: int = routing.DEFAULT_KEY_TOKENS, size: int = 4096, bucket: int = 16) -> None:
        if tokens < 1:
            raise ValueError("key tokens must be >= 1")
        self.tokens, self.size, self.bucket = tokens, size, bucket
        self._memo: dict[str, list[tuple[str, str]]] = {}     # first PROBE chars -> [(head, key)]
        self._heads = 0

    def __call__(self, text: str) -> str:
        probe = text[:self.PROBE]
        for head, key in self._memo.get(probe, ()):
            if text.startswith(head):
                return key
        words = text.split(maxsplit=self.tokens)
        if len(words) <= self.tokens:           # the whole text is the key's words: not memoised
            return routing.key_from_prompt(text, self.tokens)
        rest = words.pop()                      # the text after the key's words and their whitespace
        key = format(routing.last_block_hash(routing.word_ids(words)), "016x")
        head = text[:len(text) - len(rest)]
        if len(head) >= self.PROBE:             # a shorter head's probe is not its own start
            if self._heads >= self.size:
                self._memo.clear()
                self._heads = 0
            entries = self._memo.setdefault(head[:self.PROBE], [])
            if len(entries) >= self.bucket:
                entries.pop(0)
                self._heads -= 1
            entries.append((head, key))
            self._heads += 1
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
