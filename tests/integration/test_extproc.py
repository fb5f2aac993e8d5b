"""The endpoint picker (services/dispatcher/extproc.py) driven as Envoy's ext_proc filter
drives it: one Process stream per request over real gRPC on 127.0.0.1:0, request_headers,
request_body (BUFFERED: one message; STREAMED: chunks), then the response phases; the
picks follow the plan and come back in x-gateway-destination-endpoint."""

from __future__ import annotations

import asyncio
import json

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from services.http import oai
from services.core import routing
from services.dispatcher.__main__ import parse_args
from services.dispatcher.extproc import DESTINATION_HEADER, endpoint_of
from services.dispatcher.keys import request_key
from services.dispatcher.service import serve
from services.engine.fleet import EngineFleet
from tests.integration.test_dispatcher import dispatcher_config, hand_plan


def _hdrs(pairs: dict[str, str], end: bool) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]),
        end_of_stream=end))


def _body(data: bytes, end: bool = True) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=data, end_of_stream=end))


RESPONSE_PHASES = [
    ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")]))),
    ep.ProcessingRequest(response_body=ep.HttpBody(body=b'{"choices": []}', end_of_stream=True)),
]


async def _exchange(stub, messages: list[ep.ProcessingRequest]) -> list[ep.ProcessingResponse]:
    """Envoy's order: send one message, wait for its answer, then the next (an immediate
    response ends the exchange)."""
    call = stub.Process()
    out = []
    for msg in messages:
        await call.write(msg)
        reply = await asyncio.wait_for(call.read(), 5)
        out.append(reply)
        if reply.HasField("immediate_response"):
            break
    await call.done_writing()
    return out


def _mutation(reply: ep.ProcessingResponse) -> dict[str, str]:
    phase = reply.WhichOneof("response")
    common = getattr(reply, phase).response
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def test_picks_follow_the_plan_through_ext_proc():
    chat = {"model": "m", "messages": [{"role": "system", "content": "You are the billing assistant."},
                                       {"role": "user", "content": "refund please"}]}
    text = oai.parse_request(chat, oai.CHAT).text
    body_key = request_key(text, None, key_tokens=routing.DEFAULT_KEY_TOKENS)

    async def main():
        fleet = await EngineFleet(3, time_scale=0.01).start()
        service = await serve(dispatcher_config(fleet, ext_proc_port=0))
        table = {f"k{i}": (i % 3,) for i in range(6)}
        table[body_key] = (2,)
        service.router.set_plan(hand_plan(5, ("e0", "e1", "e2"), table), flat=False, source="test")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{service.ext_proc_port}") as ch:
                stub = ep_grpc.ExternalProcessorStub(ch)
                base = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
                by_header = []
                for i in range(6):           # key header: picked at request_headers; body passes through
                    by_header.append(await _exchange(stub, [_hdrs({**base, "x-cacheroute-key": f"k{i}"}, False),
                                                            _body(json.dumps(chat).encode())] + RESPONSE_PHASES))
                raw = json.dumps(chat).encode()
                buffered = await _exchange(stub, [_hdrs(base, False), _body(raw)] + RESPONSE_PHASES)
                streamed = await _exchange(stub, [_hdrs(base, False), _body(raw[:10], False), _body(raw[10:])]
                                           + RESPONSE_PHASES)
                bad = await _exchange(stub, [_hdrs(base, False), _body(b"{not json")])
                no_key = await _exchange(stub, [_hdrs(base, True)])
        finally:
            await service.stop(0)
            await fleet.stop()
        return [fleet.address(i) for i in range(3)], by_header, buffered, streamed, bad, no_key

    addresses, by_header, buffered, streamed, bad, no_key = asyncio.run(main())
    for i, replies in enumerate(by_header):
        assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body", "response_headers",
                                                               "response_body"]
        picked = _mutation(replies[0])
        assert picked[DESTINATION_HEADER] == addresses[i % 3]
        assert picked["x-cacheroute-replica"] == f"e{i % 3}" and picked["x-cacheroute-reason"] == "planned"
        assert picked["x-cacheroute-plan-version"] == "5"
        assert replies[0].request_headers.response.clear_route_cache
        md = replies[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields
        assert md[DESTINATION_HEADER].string_value == addresses[i % 3]
        assert not _mutation(replies[1])               # nothing more to change at the body
    for replies in (buffered, streamed):             # key from the body, as the HTTP front door derives it
        assert not _mutation(replies[0])
        assert _mutation(replies[-3])[DESTINATION_HEADER] == addresses[2]
        assert replies[-3].WhichOneof("response") == "request_body"
    assert bad[-1].immediate_response.status.code == 400
    assert json.loads(bad[-1].immediate_response.body)["error"]["type"] == "invalid_request_error"
    assert no_key[-1].immediate_response.status.code == 400


def test_endpoint_of_and_the_flag():
    assert endpoint_of("10.0.0.5:50061") == "10.0.0.5:50061"
    assert endpoint_of("vllm+http://10.0.0.5:8000") == "10.0.0.5:8000"
    assert endpoint_of("https://engine.example") == "engine.example:443"
    assert parse_args(["--port", "0", "--replicas", "e0=127.0.0.1:1"]).ext_proc_port == -1
    assert parse_args(["--port", "0", "--replicas", "e0=127.0.0.1:1", "--ext-proc-port", "9002"]).ext_proc_port == 9002
