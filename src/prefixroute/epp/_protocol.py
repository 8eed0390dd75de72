"""The endpoint picker protocol, v1.0.0, as messages of Envoy's ext_proc API.

The Gateway API Inference Extension's proposal 004 (``004-endpoint-picker-protocol``, version
v1.0.0 of 2025-07-29) says what an endpoint picker (EPP) reads and writes:

* **Subset** (proxy to EPP): the request's ``metadata_context`` may hold, under the namespace
  ``envoy.lb.subset_hint``, a list ``x-gateway-destination-endpoint-subset`` of ``ip:port``.
  Then the EPP MUST pick from that list only, and answer 503 (an ``ImmediateResponse``) when the
  list is empty or none of it is eligible.
* **Destination** (EPP to proxy): the pick goes in the request header
  ``x-gateway-destination-endpoint`` AND in the response's ``dynamic_metadata`` under the
  namespace ``envoy.lb``, key ``x-gateway-destination-endpoint``, with the same value: one
  ``ip:port``, or several as ``ip:port,ip:port,...`` (commas, no spaces), the primary first;
  "if retry is configured, the proxy will go sequentially down the list until one valid
  endpoint is found". No ready endpoint: 503; a request to shed: 429.
* **Served** (proxy to EPP): on the response, ``metadata_context`` under ``envoy.lb`` says
  which endpoint served it (``x-gateway-destination-endpoint-served``), for proxies that went
  down a list of endpoints. Envoy 1.40 does not set that entry itself; its ext_proc filter can
  send the same fact as an attribute instead (``response_attributes: ["upstream.address"]``),
  which we read when the metadata is absent.
* **Health**: the gRPC health service answers for ``liveness``, ``readiness`` and
  ``envoy.service.ext_proc.v3.ExternalProcessor``.

By default we send one endpoint: plain Envoy's ``ORIGINAL_DST`` cluster reads the header as one
address, and a list there is no address at all (the request fails: no healthy upstream). A list
(``--fallbacks N``) is for proxies that read it: Envoy's ``override_host`` load-balancing policy
(``envoy.load_balancing_policies.override_host``) over a cluster that knows the pool's
endpoints, with a route retry policy. This module only builds and reads messages; it decides
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

PROTOCOL_VERSION = "v1.0.0"  # of proposal 004-endpoint-picker-protocol
DESTINATION_HEADER = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE = "envoy.lb"  # dynamic metadata namespace of the pick
SUBSET_NAMESPACE = "envoy.lb.subset_hint"  # filter metadata namespace of the subset
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"  # under DESTINATION_NAMESPACE
BODY_PIECE_BYTES = 62_000  # a request body handed back in full duplex, at most per message
EXT_PROC_ATTRIBUTES = "envoy.filters.http.ext_proc"  # where Envoy puts the attributes it sends
UPSTREAM_ADDRESS = "upstream.address"  # Envoy's attribute: the upstream host's ip:port
# The gRPC health services the protocol names (the empty name is gRPC's "whole server"), and
# the one the reference picker's chart probes without leader election.
LIVENESS = "liveness"  # serving while the process runs, leader or not (the others: _server)
HEALTH_SERVICES = (
    "", LIVENESS, "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "inference-extension"
)  # fmt: skip

# The generated messages carry no type information (mypy sees Any): these name them in signatures.
Request: TypeAlias = Any  # pb.ProcessingRequest
Response: TypeAlias = Any  # pb.ProcessingResponse
Body: TypeAlias = Any  # pb.HttpBody
# Body modes (ext_proc's ProcessingMode.BodySendMode); the protocol's streaming mode is full duplex.
NONE = processing_mode_pb2.ProcessingMode.NONE
BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
STREAMED = processing_mode_pb2.ProcessingMode.STREAMED
BUFFERED_PARTIAL = processing_mode_pb2.ProcessingMode.BUFFERED_PARTIAL
FULL_DUPLEX_STREAMED = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


def headers_of(message: pb.HttpHeaders) -> dict[str, str]:
    """The headers of a headers message, lower-case names (Envoy sends ``raw_value``)."""
    out: dict[str, str] = {}
    for h in message.headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out[h.key.lower()] = value
    return out


def subset_of(request: pb.ProcessingRequest) -> list[str] | None:
    """The subset hint of ``request``: None when absent (pick from the whole pool)."""
    meta = request.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in meta:
        return None
    fields = meta[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    value = fields[SUBSET_KEY]
    if value.HasField("list_value"):
        return [v.string_value for v in value.list_value.values if v.HasField("string_value")]
    if value.HasField("string_value"):  # tolerated: a comma-separated string
        return [s.strip() for s in value.string_value.split(",") if s.strip()]
    return []


def served_of(request: pb.ProcessingRequest) -> str | None:
    """The endpoint the proxy says served the response, when it says so: the protocol's
    metadata entry, else Envoy's ``upstream.address`` attribute."""
    meta = request.metadata_context.filter_metadata
    if DESTINATION_NAMESPACE in meta:
        value = meta[DESTINATION_NAMESPACE].fields.get(SERVED_KEY)
        if value is not None and value.HasField("string_value"):
            return str(value.string_value)
    if EXT_PROC_ATTRIBUTES in request.attributes:
        value = request.attributes[EXT_PROC_ATTRIBUTES].fields.get(UPSTREAM_ADDRESS)
        if value is not None and value.HasField("string_value"):
            return str(value.string_value)
    return None


def destination(endpoints: Sequence[str]) -> str:
    """The header's and the metadata's value: the primary first, then the fallbacks."""
    return ",".join(endpoints)


def _mutation(headers: Mapping[str, str], remove: Sequence[str] = ()) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        remove_headers=list(remove),
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode("utf-8")),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
            for k, v in headers.items()
        ],
    )


def destination_metadata(endpoint: str) -> struct_pb2.Struct:
    meta = struct_pb2.Struct()
    meta.update({DESTINATION_NAMESPACE: {DESTINATION_HEADER: endpoint}})
    return meta


def request_headers_response(
    headers: Mapping[str, str], endpoint: str | None = None, remove: Sequence[str] = ()
) -> pb.ProcessingResponse:
    """Continue the request, setting ``headers`` and removing ``remove`` (and the pick's
    metadata, with ``endpoint``: the :func:`destination` value)."""
    out = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=_mutation(headers, remove))
        )
    )
    if endpoint is not None:
        out.dynamic_metadata.CopyFrom(destination_metadata(endpoint))
    return out


def request_body_response(
    headers: Mapping[str, str] | None = None,
    endpoint: str | None = None,
    streamed: bytes | None = None,
    end_of_stream: bool = False,
    remove: Sequence[str] = (),
    replaced: bytes | None = None,
) -> pb.ProcessingResponse:
    """Continue the request body: buffered mode may set ``headers`` (and remove ``remove``)
    here, as they are not sent yet, and replace the whole body with ``replaced``; full-duplex
    mode hands the body back as ``streamed``."""
    common = pb.CommonResponse()
    if headers or remove:
        common.header_mutation.CopyFrom(_mutation(headers or {}, remove))
    if replaced is not None:
        common.body_mutation.body = replaced
    if streamed is not None:
        common.body_mutation.streamed_response.CopyFrom(
            pb.StreamedBodyResponse(body=streamed, end_of_stream=end_of_stream)
        )
    out = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    if endpoint is not None:
        out.dynamic_metadata.CopyFrom(destination_metadata(endpoint))
    return out


def body_pieces(body: bytes, end_of_body: bool) -> list[pb.ProcessingResponse]:
    """``body`` handed back in full duplex, in pieces of at most ``BODY_PIECE_BYTES``, the last
    one marked ``end_of_body`` (an empty body is one empty piece). Envoy takes any size, but some
    data planes cap a streamed chunk at 64 KiB: the reference picker hands bodies back in
    62,000-byte pieces (``BodyByteLimit``, ``BuildChunkedBodyResponses`` in its pkg/common), and
    a 4 MB prompt went back here as one message."""
    n = BODY_PIECE_BYTES
    pieces = [body[i : i + n] for i in range(0, len(body), n)] or [b""]
    last = len(pieces) - 1
    return [
        request_body_response(streamed=piece, end_of_stream=end_of_body and i == last)
        for i, piece in enumerate(pieces)
    ]


def pick_responses(
    headers: Mapping[str, str], endpoint: str, remove: Sequence[str], full_duplex: bool,
    headers_only: bool, body: bytes, replaced: bytes | None, end_of_body: bool,
) -> list[pb.ProcessingResponse]:  # fmt: skip
    """A pick as Envoy takes it: the headers answer alone when no body message is to be
    answered (none came: ``headers_only``); in full duplex, the headers answer and the body
    handed back (``replaced`` in its place, when set); buffered, all in the body answer."""
    if headers_only:
        return [request_headers_response(headers, endpoint, remove)]
    if full_duplex:
        sent = body if replaced is None else replaced
        picked = request_headers_response(headers, endpoint, remove)
        return [picked, *body_pieces(sent, end_of_body)]
    return [request_body_response(headers, endpoint, remove=remove, replaced=replaced)]


def request_trailers_response() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def response_headers_response(headers: Mapping[str, str]) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=_mutation(headers))
        )
    )


def response_body_response(
    streamed: bytes | None = None, end_of_stream: bool = False, replaced: bytes | None = None
) -> pb.ProcessingResponse:
    """Continue a response chunk; in full-duplex mode the chunk itself goes back, in buffered
    mode ``replaced`` takes the whole body's place."""
    common = pb.CommonResponse()
    if replaced is not None:
        common.body_mutation.body = replaced
    if streamed is not None:
        common.body_mutation.streamed_response.CopyFrom(
            pb.StreamedBodyResponse(body=streamed, end_of_stream=end_of_stream)
        )
    return pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))


def response_trailers_response() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def immediate_response(
    status: int, body: bytes, headers: Mapping[str, str] | None = None, details: str = ""
) -> pb.ProcessingResponse:
    """Answer the client now, without any upstream (errors: 400, 429, 503...)."""
    all_headers = {"content-type": "application/json", **(headers or {})}
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=_mutation(all_headers),
            body=body,
            details=details,
        )
    )
