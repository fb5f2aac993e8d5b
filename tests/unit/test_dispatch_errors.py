"""The one EngineError mapping (services.dispatcher.dispatch.ERRORS): every kind a backend can
raise has an HTTP status with an OpenAI-shaped error and a gRPC status, one line each."""

from __future__ import annotations

import grpc
import orjson
import pytest

from services.backends.base import EngineError
from services.dispatcher.dispatch import ERRORS, grpc_error, http_error
from services.errors import status_for

CASES = [  # kind, code, detail -> HTTP status, OpenAI code, gRPC status, message
    ("invalid", "unsupported_parameter", "cannot honour tools", 400, "unsupported_parameter",
     grpc.StatusCode.INVALID_ARGUMENT, "cannot honour tools"),
    ("invalid", "INVALID_ARGUMENT", "max_tokens too large", 400, None, grpc.StatusCode.INVALID_ARGUMENT,
     "max_tokens too large"),
    ("full", "RESOURCE_EXHAUSTED", ": queue full", 429, "too_many_requests", grpc.StatusCode.RESOURCE_EXHAUSTED,
     "replica e1: queue full"),
    ("timeout", "first_byte", "sent nothing for 60s", 504, "engine_timeout", grpc.StatusCode.UNAVAILABLE,
     "replica e1 sent nothing for 60s"),
    ("unreachable", "ClientConnectorError", "is unreachable (ClientConnectorError)", 502, "engine_unreachable",
     grpc.StatusCode.UNAVAILABLE, "replica e1 is unreachable (ClientConnectorError)"),
    ("failed", "HTTP 500", "answered HTTP 500", 502, "engine_error", grpc.StatusCode.UNAVAILABLE,
     "replica e1 answered HTTP 500"),
    ("denied", "HTTP 401", "answered HTTP 401: bad key", 502, "engine_denied", grpc.StatusCode.PERMISSION_DENIED,
     "replica e1 answered HTTP 401: bad key"),
    ("no_replica", "no_healthy_replica", "no healthy replica", 503, "no_healthy_replica",
     grpc.StatusCode.UNAVAILABLE, "no healthy replica"),
]


@pytest.mark.parametrize("kind,code,detail,status,oai_code,grpc_code,message", CASES)
def test_each_kind_maps_once_to_http_and_grpc(kind, code, detail, status, oai_code, grpc_code, message):
    error = EngineError(kind, code, detail)
    error.replica_id = "e1"
    api = http_error(error)
    body = orjson.loads(api.body())["error"]
    assert (api.status, body["code"], body["message"]) == (status, oai_code, message)
    assert status_for(grpc_error(error)) == (grpc_code, message)


def test_every_engine_error_kind_has_a_mapping():
    assert set(EngineError.KINDS) | {"no_replica"} == set(ERRORS)
