"""A null endpoint picker: the fewest Python gRPC steps an ext_proc picker can take per request.

It speaks the same full-duplex exchange as ``prefixroute epp`` (the destination header and
``envoy.lb`` metadata at the request body's end, the body and the answer's chunks handed back)
on the same server setup (grpc.aio on uvloop, the context's read and write), and picks the next
endpoint in turn: no admission, no parsing, no routing, no accounting. Envoy in front of it
measures what Python gRPC alone costs a picker on this machine, the floor under any picker
written this way (``benchmarks/epp_overhead.py``).

Run: ``python benchmarks/_null_picker.py PORT ENDPOINT...`` (``ENDPOINT`` as ``ip:port``).
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from prefixroute.epp import DESTINATION_HEADER, DESTINATION_NAMESPACE


def _headers_answer(endpoint: str) -> Any:
    option = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=DESTINATION_HEADER, raw_value=endpoint.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    mutation = pb.HeaderMutation(set_headers=[option])
    out = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation))
    )
    meta = struct_pb2.Struct()
    meta.update({DESTINATION_NAMESPACE: {DESTINATION_HEADER: endpoint}})
    out.dynamic_metadata.CopyFrom(meta)
    return out


def _streamed(field: str, body: bytes, end_of_stream: bool) -> Any:
    common = pb.CommonResponse()
    common.body_mutation.streamed_response.CopyFrom(
        pb.StreamedBodyResponse(body=body, end_of_stream=end_of_stream)
    )
    return pb.ProcessingResponse(**{field: pb.BodyResponse(response=common)})


class NullPicker(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, endpoints: list[str]) -> None:
        self.turn = itertools.cycle(endpoints)

    async def Process(self, requests: Any, context: Any) -> None:  # noqa: N802 (gRPC's name)
        held: list[bytes] = []  # the request body, until its end (the headers answer first)
        while (req := await context.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
            kind = req.WhichOneof("request")
            if kind == "request_body":
                held.append(req.request_body.body)
                if req.request_body.end_of_stream:
                    await context.write(_headers_answer(next(self.turn)))
                    await context.write(_streamed("request_body", b"".join(held), True))
            elif kind == "response_headers":
                await context.write(pb.ProcessingResponse(response_headers=pb.HeadersResponse()))
            elif kind == "response_body":
                body = req.response_body
                await context.write(_streamed("response_body", body.body, body.end_of_stream))
            elif kind == "request_trailers":
                await context.write(pb.ProcessingResponse(request_trailers=pb.TrailersResponse()))
            elif kind == "response_trailers":
                await context.write(pb.ProcessingResponse(response_trailers=pb.TrailersResponse()))


async def serve(port: int, endpoints: list[str]) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(NullPicker(endpoints), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    import uvloop

    if len(sys.argv) < 3 or not sys.argv[1].isdigit():
        sys.exit("usage: python benchmarks/_null_picker.py PORT ENDPOINT... (ENDPOINT as ip:port)")
    uvloop.run(serve(int(sys.argv[1]), sys.argv[2:]))
