"""Endpoints from an ``InferencePool`` itself (``--pool-name``), as the reference picker finds them.

The Inference Extension's own picker is told its pool's name (``--pool-name``, ``--pool-namespace``
else ``$NAMESPACE``, ``--pool-group``) and reads the pod selector and target ports from the
``InferencePool`` object; ``prefixroute epp`` takes the same flags. :class:`InferencePoolPods` is
a :class:`~prefixroute.epp._kube.PodSource` that reads the pool before every full list of the
pods (at start, at every resync, after any failure), so a changed selector or port is followed
within one resync period, and lists and watches the pods it selects. Each ready pod is an
endpoint at each target port (the v1 API allows several: one engine per port on a pod).

Two API versions, by group (``--pool-group``), with their field names:

* ``inference.networking.k8s.io`` (v1, the default): ``spec.selector.matchLabels`` and
  ``spec.targetPorts[].number``;
* ``inference.networking.x-k8s.io`` (v1alpha2): ``spec.selector`` (a map of labels) and
  ``spec.targetPortNumber``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prefixroute.core import ConfigError
from prefixroute.epp._kube import DiscoveryError, KubernetesPods

V1_GROUP = "inference.networking.k8s.io"
VERSIONS = {V1_GROUP: "v1", "inference.networking.x-k8s.io": "v1alpha2"}


class PoolError(DiscoveryError):
    """The pool cannot be read as a pool (missing, or without a selector or a port)."""


def pool_members(pool: dict[str, Any], group: str = V1_GROUP) -> tuple[str, tuple[int, ...]]:
    """(label selector, target ports) of an ``InferencePool`` object of ``group``'s version, as
    the API returns it (a dict)."""
    spec = pool.get("spec") or {}
    selector = spec.get("selector") or {}
    if VERSIONS.get(group) == "v1":
        labels = selector.get("matchLabels") or {}
        ports = tuple(int(p["number"]) for p in spec.get("targetPorts") or () if "number" in p)
    else:
        labels = selector
        number = spec.get("targetPortNumber")
        ports = (int(number),) if number is not None else ()
    name = (pool.get("metadata") or {}).get("name", "?")
    if not isinstance(labels, dict) or not labels or not all(
        isinstance(v, str) for v in labels.values()
    ):
        raise PoolError(
            f"InferencePool {name} selects no pods (labels go in spec.selector.matchLabels in "
            "v1, spec.selector in v1alpha2)"
        )
    if not ports:
        raise PoolError(f"InferencePool {name} has no target port")
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())), ports


class InferencePoolPods:
    """The pods an ``InferencePool`` selects, re-reading the pool at each full list."""

    def __init__(
        self, namespace: str, name: str, group: str = V1_GROUP, api: Any = None, custom: Any = None
    ) -> None:
        if group not in VERSIONS:
            known = ", ".join(VERSIONS)
            raise ConfigError(f"--pool-group {group!r}: not an InferencePool group ({known})")
        self.namespace, self.name, self.group = namespace, name, group
        self.pods = KubernetesPods(namespace, "", api)  # its selector is the pool's, once read
        if custom is None:
            from kubernetes import client

            custom = client.CustomObjectsApi()
        self.custom = custom
        self.target_ports: tuple[int, ...] = ()  # the pool's, as last read

    @property
    def selector(self) -> str:
        return self.pods.selector

    def read_pool(self) -> None:
        """Read the pool's selector and ports (raises :class:`PoolError`)."""
        from kubernetes.client.exceptions import ApiException

        try:
            pool = self.custom.get_namespaced_custom_object(
                self.group, VERSIONS[self.group], self.namespace, "inferencepools", self.name
            )
        except ApiException as exc:
            raise PoolError(
                f"InferencePool {self.namespace}/{self.name} ({self.group}): "
                f"{exc.status} {exc.reason}"
            ) from exc
        self.pods.selector, self.target_ports = pool_members(pool, self.group)

    def list(self) -> tuple[list[Any], str]:
        self.read_pool()
        return self.pods.list()

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, Any]]:
        return self.pods.watch(resource_version, timeout_s)
