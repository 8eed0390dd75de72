"""The endpoint picker: prefixroute as an Envoy ``ext_proc`` server (Inference Extension).

Envoy (or a gateway built on it) asks the picker, for each request, which endpoint of a pool
should serve it; the picker answers with the protocol of proposal 004 of the Gateway API
Inference Extension, version :data:`PROTOCOL_VERSION` (``_protocol`` says what that is), and
picks with the same core ``Router``, policies, request parsing and usage accounting as
``prefixroute serve``, built by the gateway's own wiring: the same tenants (API keys, limits,
isolation), tokenizer and precise mode (KV events) from the same settings. With
``EppConfig.fallbacks`` it names fallback endpoints after the primary (the protocol's list).
In-process::

    from prefixroute.epp import EndpointPicker, EppConfig
    from prefixroute.gateway import GatewayConfig

    config = EppConfig(GatewayConfig(replicas=("http://10.0.0.7:8000",)), grpc_port=0)
    async with EndpointPicker(config) as epp:
        epp.address   # "127.0.0.1:41234": Envoy's ext_proc grpc_service

From the command line: ``prefixroute epp --endpoint 10.0.0.7:8000 ...`` (or ``--endpoints-file``,
or ``--k8s-selector`` with the ``kubernetes`` extra). An Envoy to run it behind:
``prefixroute epp --print-envoy-config`` (:func:`envoy_bootstrap`).
"""

from prefixroute.epp._candidates import endpoint_of, fallbacks, replica_of
from prefixroute.epp._endpoints import EndpointSet, FileEndpoints, read_endpoints_file
from prefixroute.epp._envoy_config import MAX_REQUESTS, EnvoyConfig, envoy_bootstrap
from prefixroute.epp._kube import (
    KubernetesPods,
    PodEndpoints,
    PodInfo,
    PodSource,
    load_cluster_config,
    pod_info,
)
from prefixroute.epp._leader import LEASE_NAME, LeaseElector
from prefixroute.epp._pool import V1_GROUP, InferencePoolPods, pool_members
from prefixroute.epp._protocol import (
    DESTINATION_HEADER,
    DESTINATION_NAMESPACE,
    PROTOCOL_VERSION,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
)
from prefixroute.epp._server import EndpointPicker, EppConfig
from prefixroute.epp._shared import PickShared
from prefixroute.epp._stream import PickStream

__all__ = [
    "DESTINATION_HEADER",
    "DESTINATION_NAMESPACE",
    "LEASE_NAME",
    "MAX_REQUESTS",
    "PROTOCOL_VERSION",
    "SUBSET_KEY",
    "SUBSET_NAMESPACE",
    "V1_GROUP",
    "EndpointPicker",
    "EndpointSet",
    "EnvoyConfig",
    "EppConfig",
    "FileEndpoints",
    "InferencePoolPods",
    "KubernetesPods",
    "LeaseElector",
    "PickShared",
    "PickStream",
    "PodEndpoints",
    "PodInfo",
    "PodSource",
    "endpoint_of",
    "envoy_bootstrap",
    "fallbacks",
    "load_cluster_config",
    "pod_info",
    "pool_members",
    "read_endpoints_file",
    "replica_of",
]
