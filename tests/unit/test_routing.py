"""Tokenization, chained block hashes and key derivation shared by engine and dispatcher."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.core import routing
from services.core.routing import (
    cacheable_blocks, check_key, key_from_hashes, key_from_prompt, prompt_hashes, tokenize,
)

words = st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=4), min_size=1, max_size=200)


def test_token_ids_are_stable_across_processes():
    code = "from services.core.routing import tokenize; print(tokenize('hello world, again'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str(tokenize("hello world, again"))
    assert all(0 <= t < routing.VOCAB_SIZE for t in tokenize("hello world, again"))


def test_tokenize_limit_reads_only_the_first_words():
    assert tokenize("a b c d", 2) == tokenize("a b")
    assert tokenize("  a   b  ", None) == tokenize("a b")
    assert tokenize("", 3) == []


@given(words, words)
def test_equal_hash_means_equal_prefix(a, b):
    ta, tb = tokenize(" ".join(a)), tokenize(" ".join(b))
    ha, hb = prompt_hashes(ta), prompt_hashes(tb)
    for i, (x, y) in enumerate(zip(ha, hb)):
        same_prefix = ta[: 16 * (i + 1)] == tb[: 16 * (i + 1)]
        assert (x == y) == same_prefix


def test_full_blocks_only_unless_partial():
    tokens = list(range(40))
    assert len(prompt_hashes(tokens)) == 2
    with_partial = prompt_hashes(tokens, partial=True)
    assert len(with_partial) == 3 and with_partial[:2] == prompt_hashes(tokens)


def test_chaining_makes_block_hash_depend_on_its_parents():
    same_block = list(range(16))
    assert prompt_hashes([99] * 16 + same_block)[1] != prompt_hashes([7] * 16 + same_block)[1]


@pytest.mark.parametrize("hashes,tokens,expected", [
    ((1, 2, 3), 48, (1, 2, 3)),
    ((1, 2, 3), 40, (1, 2)),        # last hash covers a partial block
    ((1,), 100, (1,)),              # the rest of the prompt is unique
    ((), 5, ()),
])
def test_cacheable_blocks(hashes, tokens, expected):
    assert cacheable_blocks(hashes, tokens) == expected


@pytest.mark.parametrize("hashes,tokens", [((1, 2, 3), 32), ((1,), 0)])
def test_cacheable_blocks_rejects_impossible_prompts(hashes, tokens):
    with pytest.raises(ValueError):
        cacheable_blocks(hashes, tokens)


def test_text_and_hash_keys_agree_when_tokens_cover_whole_blocks():
    text = " ".join(f"w{i}" for i in range(300))
    hashes = prompt_hashes(tokenize(text))
    assert key_from_prompt(text, 64) == key_from_hashes(hashes, 4)
    assert key_from_prompt(text, 32) == key_from_hashes(hashes, 2)
    # only the first tokens matter
    assert key_from_prompt(text + " tail words", 64) == key_from_prompt(text, 64)
    assert key_from_prompt("x " + text, 64) != key_from_prompt(text, 64)


def test_short_prefixes_use_what_there_is():
    assert key_from_hashes((5, 6), 4) == format(6, "016x")
    assert key_from_prompt("just three words", 64) == format(prompt_hashes(tokenize("just three words"), partial=True)[-1], "016x")


@pytest.mark.parametrize("call", [
    lambda: key_from_hashes((), 4),
    lambda: key_from_hashes((1,), 0),
    lambda: key_from_prompt("   ", 64),
    lambda: key_from_prompt("a", 0),
    lambda: check_key(""),
    lambda: check_key("k" * 257),
    lambda: check_key("é" * 129),   # 258 bytes in UTF-8
])
def test_invalid_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_valid_keys_pass():
    assert check_key("k" * 256) == "k" * 256
    assert check_key("é" * 128) == "é" * 128


# ------------------------------------------------------------ the request path's cheap forms (issue 22)

_ASCII_MIX = st.sampled_from(list("ab9 \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x00,"))


@given(st.text(alphabet=_ASCII_MIX, min_size=200, max_size=1500)
       | st.text(alphabet=_ASCII_MIX | st.sampled_from(["\u00e9", "\u00a0", "\u3000", "\x85"]), max_size=600))
def test_count_tokens_is_the_whitespace_split_count(text):
    assert routing.count_tokens(text) == len(text.split())


@pytest.mark.parametrize("text", ["word " * 300, " word" * 300, "\x1cx" * 300, "x\x1f" * 300, "\t\n" * 200 + "y",
                                  "a" * 1000, " " * 1000, "\r\n".join(["line of words"] * 100)])
def test_count_tokens_on_long_ascii_edges(text):
    assert routing.count_tokens(text) == len(text.split())


_LONG = "system: " + " ".join(f"w{i}" for i in range(3000)) + "\nuser: hi"
# (text, key of the first 64 tokens, key of the first 16), pinned from the derivation before the
# request path was tuned: a dispatcher must keep giving every prompt the key it always had
_GOLDEN_KEYS = [
    ("hello", "1d323f25ce5f0070", "1d323f25ce5f0070"),
    ("a b c", "a0d28423dbc3a78d", "a0d28423dbc3a78d"),
    (_LONG, "0005cd707255cda1", "bcab980c21281a70"),
    ("  leading\tand\ttabs\n\nand\x1cfile sep " * 20, "0fede7d5c38aaee0", "d10443b6e3483b32"),
    ("unicode\u00a0nbsp \u3000ideographic caf\u00e9 " * 30, "bc8885b25677d5b1", "d4fdcaab5eb395c7"),
    (" ".join(str(i) for i in range(63)), "41f9a424a9fff118", "81cafbe5126c0d81"),
    (" ".join(str(i) for i in range(64)), "ec8b7cbd2ecd0594", "81cafbe5126c0d81"),
    (" ".join(str(i) for i in range(65)), "ec8b7cbd2ecd0594", "81cafbe5126c0d81"),
]


@pytest.mark.parametrize("text,key64,key16", _GOLDEN_KEYS)
def test_key_derivation_gives_the_keys_it_always_gave(text, key64, key16):
    assert routing.key_from_prompt(text) == key64
    assert routing.key_from_prompt(text, 16) == key16


def test_http_request_key_is_unchanged_with_tenant_and_salt():
    from services.dispatcher.keys import request_key

    assert request_key(_LONG, None, tenant="t1", salt="s") == "t1/0005cd707255cda1~e64984c3aacf6ede"


@pytest.mark.parametrize("tokens", [64, 16, 1])
def test_memoised_prompt_keys_are_the_derived_keys(tokens):
    from services.dispatcher.keys import PromptKeys

    keys = PromptKeys(tokens, size=3)           # small: the memo is emptied and refilled on the way
    texts = [t for t, _, _ in _GOLDEN_KEYS] + ["x " * 5, "\u00a0".join(["w"] * 70), "a\x1cb c"]
    for _ in range(2):                          # misses, then hits
        for text in texts:
            assert keys(text) == routing.key_from_prompt(text, tokens), text
    assert len(keys._memo) <= 3
    with pytest.raises(ValueError):
        keys(" \t\n")


@given(st.text(alphabet=_ASCII_MIX | st.sampled_from(["\u00a0", "\u3000", "\u00e9"]), min_size=1, max_size=400))
def test_memoised_prompt_keys_agree_on_any_text(text):
    from services.dispatcher.keys import PromptKeys

    keys = PromptKeys(8)
    try:
        expected = routing.key_from_prompt(text, 8)
    except ValueError:
        with pytest.raises(ValueError):
            keys(text)
        return
    assert keys(text) == expected == keys(text)


@given(st.lists(st.integers(0, routing.VOCAB_SIZE - 1), min_size=1, max_size=100))
def test_last_block_hash_is_the_chains_last(ids):
    assert routing.last_block_hash(ids) == prompt_hashes(ids, partial=True)[-1]


@given(st.text(alphabet=_ASCII_MIX | st.sampled_from(["\u00a0", "\u3000", "\u00e9", "\x00"]), max_size=200))
def test_word_ids_are_token_ids(text):
    words = text.split()
    assert routing.word_ids(words) == [routing.token_id(w) for w in words]


@given(st.lists(st.text(alphabet=_ASCII_MIX | st.sampled_from(["\u00a0", "\u00e9"]), max_size=10), max_size=12),
       st.integers(1, 6))
def test_memoised_keys_of_texts_that_start_alike(parts, tokens):
    """Texts that are prefixes of one another (a word may continue past a memoised head)."""
    from services.dispatcher.keys import PromptKeys

    keys = PromptKeys(tokens, size=5, bucket=2)
    keys.PROBE = 2                              # short heads memoised too
    texts = ["".join(parts[:i]) for i in range(len(parts) + 1)]
    for text in texts + texts[::-1]:
        try:
            expected = routing.key_from_prompt(text, tokens)
        except ValueError:
            with pytest.raises(ValueError):
                keys(text)
            continue
        assert keys(text) == expected, text
