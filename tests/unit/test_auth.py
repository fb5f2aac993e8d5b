"""services.auth: the one key ring behind the HTTP API keys and the gRPC data-plane token."""

from __future__ import annotations

import pytest

from services.auth import AuthError, KeyRing, bearer, bearer_of_metadata, default_tenant, keyring, parse_key_lines


def test_an_empty_ring_accepts_everyone_with_the_empty_tenant():
    ring = keyring()
    assert not ring.enabled
    assert ring.tenant_of(None) == "" and ring.tenant_of("anything") == ""


def test_keys_map_to_tenants_and_the_deployment_token_is_accepted(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# comment\n\nsk-a:acme\nsk-b\n  sk-c : beta \n")
    ring = keyring(api_key="sk-single", api_key_file=str(path), auth_token="deploy")
    assert ring.tenant_of("sk-a") == "acme"
    assert ring.tenant_of("sk-b") == default_tenant("sk-b") != default_tenant("sk-single")
    assert ring.tenant_of("sk-c") == "beta"
    assert ring.tenant_of("sk-single") == default_tenant("sk-single")
    assert ring.tenant_of("deploy") == ""
    assert default_tenant("sk-b").startswith("k") and "sk-b" not in default_tenant("sk-b")


@pytest.mark.parametrize("presented,missing", [(None, True), ("", True), ("sk-", False), ("sk-a ", False),
                                                ("SK-A", False), ("sk-a" * 5000, False), ("\udcff", False)])
def test_missing_and_wrong_keys_are_refused(presented, missing):
    ring = KeyRing({"sk-a": "acme"})
    with pytest.raises(AuthError) as info:
        ring.tenant_of(presented)
    assert info.value.missing is missing
    assert "sk-a" not in str(info.value)
    assert not ring.accepts(presented)


@pytest.mark.parametrize("text", ["sk-a:", ":acme", "sk a:acme", "k:x\nk:y"])
def test_malformed_key_files_are_one_line_errors(text):
    with pytest.raises(ValueError) as info:
        parse_key_lines(text, "keys.txt")
    assert "\n" not in str(info.value) and "keys.txt line" in str(info.value)


@pytest.mark.parametrize("header,expected", [(None, None), ("Bearer abc", "abc"), ("bearer  abc ", "abc"),
                                             ("Basic abc", ""), ("abc", "")])
def test_bearer_values(header, expected):
    assert bearer(header) == expected


@pytest.mark.parametrize("metadata,expected", [((), None), ((("authorization", "Bearer t"),), "t"),
                                               ((("x", "y"), ("authorization", b"bearer t2")), "t2"),
                                               ((("authorization", "Basic t"),), "")])
def test_bearer_of_grpc_metadata_is_the_same_parser(metadata, expected):
    assert bearer_of_metadata(metadata) == expected


def test_engine_key_lines_give_a_key_per_url_and_a_default():
    from services.auth import EngineKeys, parse_engine_key_lines

    default, by_url = parse_engine_key_lines("# keys\nhttp://a:1/ ka\n\nkd\nhttps://b:2 kb\n")
    assert (default, by_url) == ("kd", {"http://a:1": "ka", "https://b:2": "kb"})
    keys = EngineKeys(default, by_url)
    assert (keys.for_url("http://a:1"), keys.for_url("https://b:2/"), keys.for_url("http://c:3")) == ("ka", "kb", "kd")
    assert "ka" not in repr(keys) and "kd" not in repr(keys)
    for bad in ("http://a:1\n", "http://a:1 k extra\n", "k1\nk2\n", "notaurl k\n"):
        with pytest.raises(ValueError) as err:
            parse_engine_key_lines(bad, "f")
        assert str(err.value).startswith("f line ") and "k1" not in str(err.value) and "extra" not in str(err.value)
