"""Prompt tokenization, chained block hashes and routing-key derivation (pure).

The engine replica and the dispatcher must agree on how a prompt becomes cache blocks
and a routing key, so both call these functions.

- Tokens. No real tokenizer here: a prompt's whitespace-separated words map to token ids
  through a stable hash (CRC-32 mod a Llama-3-sized vocabulary), so the same text gives
  the same ids in every process (Python's `hash()` is salted per process; CRC-32 is not).
- Blocks. Tokens are grouped in 16-token blocks (vLLM's default block size); block i's
  hash is `H(hash of block i-1, token ids of block i)` with an 8-byte BLAKE2b, so equal
  hashes mean equal prefixes, the way vLLM V1's prefix cache chains them. The engine
  caches only full blocks; `prompt_hashes(..., partial=True)` also hashes a trailing
  partial block, which keys and traces may use.
- Keys. A request names its key explicitly, or the dispatcher derives it from the
  prompt's prefix: with chained hashes the hash of block N-1 already identifies blocks
  0..N-1, so the key is that one hash in hex. Deriving from text (first T tokens) hashes
  those tokens the same way, so a client sending text and one sending block hashes of the
  same prompt get the same key whenever T = 16·N (defaults: N = 4 blocks, T = 64 tokens).
  Keys are 1..256 UTF-8 bytes (the collector's limit).
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from typing import Sequence

from services.core.request import BLOCK_TOKENS
from services.model import MAX_KEY_BYTES

VOCAB_SIZE = 128_256            # Llama 3's vocabulary; ids only need to be stable
DEFAULT_KEY_BLOCKS = 4
DEFAULT_KEY_TOKENS = DEFAULT_KEY_BLOCKS * BLOCK_TOKENS
_ROOT = b"\x00" * 8             # parent of block 0


def token_id(word: str) -> int:
    return zlib.crc32(word.encode("utf-8")) % VOCAB_SIZE


def tokenize(text: str, limit: int | None = None) -> list[int]:
    """Token ids of `text` (whitespace words), at most `limit` of them."""
    words = text.split() if limit is None else text.split(maxsplit=limit)[:limit]
    return word_ids(words)


def word_ids(words: list[str]) -> list[int]:
    """`[token_id(w) for w in words]` with one UTF-8 encode for all of them: the words hold no
    space (it is whitespace), so their space-joined bytes split back into each word's bytes.
    The dispatcher derives a key from up to --key-tokens words per request (1,024 in
    docs/peers.md's runs), where an encode and a call per word cost ~100 us."""
    if not words:
        return []
    crc = zlib.crc32
    return [c % VOCAB_SIZE for c in map(crc, " ".join(words).encode("utf-8").split(b" "))]


# ASCII whitespace as str.split() sees it (\t \n \v \f \r, \x1c-\x1f, space) -> b" ", the rest -> b"w"
_WORD_BYTES = bytes(32 if chr(c).isspace() else 119 for c in range(128)) + b"w" * 128


def count_tokens(text: str) -> int:
    """`len(text.split())`, the whitespace-token count, without building a list of words.

    An ASCII text is mapped to b" "/b"w" bytes (one C pass) and its word starts counted;
    other text is split. Several times faster on long prompts (issue 22: counted per request)."""
    if len(text) < 256 or not text.isascii():
        return len(text.split())
    marks = text.encode("ascii").translate(_WORD_BYTES)
    return marks.count(b" w") + (marks[:1] == b"w")


def block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The chained hash of one block: covers `tokens` and, through `parent`, every block before."""
    h = hashlib.blake2b(_ROOT if parent is None else parent.to_bytes(8, "little"), digest_size=8)
    h.update(array("I", tokens).tobytes())
    return int.from_bytes(h.digest(), "little")


def prompt_hashes(tokens: Sequence[int], *, partial: bool = False) -> tuple[int, ...]:
    """Chained hashes of the 16-token blocks of `tokens`; a trailing partial block only if `partial`."""
    full = len(tokens) // BLOCK_TOKENS
    end = len(tokens) if partial else full * BLOCK_TOKENS
    out: list[int] = []
    parent: int | None = None
    for start in range(0, end, BLOCK_TOKENS):
        parent = block_hash(parent, tokens[start:start + BLOCK_TOKENS])
        out.append(parent)
    return tuple(out)


def cacheable_blocks(hashes: Sequence[int], prompt_tokens: int) -> tuple[int, ...]:
    """The full-block hashes of a prompt given as (hashes, token count), as the engine caches them.

    The last hash may cover a partial block; it is dropped. Raises ValueError when the
    hashes cannot belong to a prompt of that length.
    """
    if prompt_tokens < 1:
        raise ValueError("prompt_tokens must be >= 1")
    most = -(-prompt_tokens // BLOCK_TOKENS)
    if len(hashes) > most:
        raise ValueError(f"{len(hashes)} block hashes for {prompt_tokens} tokens (at most {most})")
    return tuple(hashes[: prompt_tokens // BLOCK_TOKENS])


def check_key(key: str) -> str:
    """`key` if it is a valid routing key (1..256 UTF-8 bytes), else ValueError."""
    if not key:
        raise ValueError("empty routing key")
    if len(key) > MAX_KEY_BYTES // 4 and len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"routing key longer than {MAX_KEY_BYTES} bytes")
    return key


def key_from_hashes(hashes: Sequence[int], blocks: int = DEFAULT_KEY_BLOCKS) -> str:
    """The routing key of a prompt's prefix: the chained hash of its first `blocks` blocks."""
    if not hashes:
        raise ValueError("no prefix block hashes to derive a key from")
    if blocks < 1:
        raise ValueError("key blocks must be >= 1")
    return format(hashes[min(blocks, len(hashes)) - 1], "016x")


def key_from_prompt(text: str, tokens: int = DEFAULT_KEY_TOKENS) -> str:
    """The routing key of a text prompt: its first `tokens` tokens, hashed like blocks."""
    if tokens < 1:
        raise ValueError("key tokens must be >= 1")
    ids = tokenize(text, tokens)
    if not ids:
        raise ValueError("empty prompt: no tokens to derive a key from")
    return format(last_block_hash(ids), "016x")


def last_block_hash(ids: Sequence[int]) -> int:
    """`prompt_hashes(ids, partial=True)[-1]`: the chain over the packed ids, digests kept as
    bytes (a block's hash is BLAKE2b-8 of its parent's 8 little-endian bytes then its ids, so
    one digest call per block on the concatenation is the same hash)."""
    raw = array("I", ids).tobytes()
    step = BLOCK_TOKENS * array("I").itemsize
    parent, blake = _ROOT, hashlib.blake2b
    for start in range(0, len(raw), step):
        parent = blake(parent + raw[start:start + step], digest_size=8).digest()
    return int.from_bytes(parent, "little")


def output_token(seed: int, index: int) -> int:
    """A deterministic stand-in for the `index`-th generated token of a request."""
    return (seed * 1_000_003 + index * 7_919) % VOCAB_SIZE
