"""Endpoints from Kubernetes pods, as an ``InferencePool`` selects them: list, watch, resync.

:class:`PodEndpoints` keeps the set of *ready* pods matching a label selector in one namespace and
publishes ``podIP:targetPort`` for each, as the Inference Extension's own picker addresses pool
members. The loop is the usual informer's, by hand:

1. list the pods (remembering the list's ``resourceVersion``) and publish;
2. watch from that version, applying ADDED / MODIFIED / DELETED, publishing on each change;
3. when the watch ends (its ``timeout_seconds`` is the resync period) list again, so a missed
   event cannot linger; a watch that says its version is too old (410 Gone, or an ERROR event)
   lists again at once; any other failure waits ``backoff_s`` and lists again.

A pod counts when it has an IP, its ``Ready`` condition is ``True`` and it is not being deleted
(``deletionTimestamp`` set: it is draining, new requests must go elsewhere).

A pod may say its own speed priors in annotations, for a pool that mixes GPU generations (a
Deployment per generation, one selector over both): ``prefixroute.io/prefill-tokens-per-s``
and ``prefixroute.io/decode-step-s``, and its batch size ``prefixroute.io/max-running``, numbers
as ``SpeedPrior`` takes them. A value that is no such number is logged once per pod and ignored
(the pod still serves, at the fleet's priors).

The ``kubernetes`` client is an optional extra (``pip install 'prefixroute[kubernetes]'``),
imported only by :class:`KubernetesPods`; the loop itself talks to a two-method
:class:`PodSource`, so tests drive it with a fake API. The client blocks, so the loop runs in a
thread and hands each new endpoint set to ``publish`` (the picker posts it onto its event loop).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prefixroute.core import ConfigError, SpeedPrior

log = logging.getLogger(__name__)

# A pod's own speed priors, by annotation: SpeedPrior's fields.
SPEED_ANNOTATIONS = {
    "prefixroute.io/prefill-tokens-per-s": "prefill_tokens_per_s",
    "prefixroute.io/decode-step-s": "decode_step_s",
    "prefixroute.io/max-running": "max_running",  # its engine's --max-num-seqs
}


@dataclass(frozen=True, slots=True)
class PodInfo:
    name: str
    ip: str | None  # status.podIP; None until scheduled and networked
    ready: bool  # the Ready condition is True
    deleting: bool  # metadata.deletionTimestamp is set
    speed: SpeedPrior | None = None  # its own speed priors, from its annotations
    speed_problem: str | None = None  # why its speed annotations were ignored


def pod_info(pod: Any) -> PodInfo:
    """The fields we need from a ``V1Pod`` (the client's model, read by attribute)."""
    meta, status = pod.metadata, pod.status
    conditions = (status.conditions if status is not None else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    speed, problem = annotated_speed(meta.annotations or {})
    return PodInfo(
        name=meta.name,
        ip=status.pod_ip if status is not None else None,
        ready=ready,
        deleting=meta.deletion_timestamp is not None,
        speed=speed,
        speed_problem=problem,
    )


def annotated_speed(annotations: dict[str, str]) -> tuple[SpeedPrior | None, str | None]:
    """The speed priors a pod's annotations give (None: none), and what was wrong with them
    (None: nothing; the priors are then None too). Annotation values are strings."""
    given = {key: annotations[a] for a, key in SPEED_ANNOTATIONS.items() if a in annotations}
    if not given:
        return None, None
    try:
        return SpeedPrior.from_mapping({key: float(v) for key, v in given.items()}), None
    except (ValueError, ConfigError) as exc:
        return None, f"speed annotations {given} ignored: {exc}"


class DiscoveryError(Exception):
    """A failure to say in one line (no traceback): the source's own words say it all."""


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410 Gone): list again."""


class PodSource(Protocol):
    def list(self) -> tuple[list[Any], str]:
        """The matching pods now, and the list's resourceVersion."""
        ...

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, Any]]:
        """(event type, pod) from ``resource_version`` on, ending after ``timeout_s``; raises
        WatchExpired when the version is too old."""
        ...


class KubernetesPods:
    """A :class:`PodSource` over the real ``kubernetes`` client (``CoreV1Api``)."""

    def __init__(self, namespace: str, selector: str, api: Any = None) -> None:
        try:
            import kubernetes  # noqa: F401 (the optional extra)
        except ImportError as exc:
            raise ConfigError(
                "--k8s-selector needs the kubernetes client: pip install 'prefixroute[kubernetes]'"
            ) from exc
        self.namespace = namespace
        self.selector = selector
        if api is None:
            api = _default_api()
        self.api = api

    def list(self) -> tuple[list[Any], str]:
        pods = self.api.list_namespaced_pod(self.namespace, label_selector=self.selector)
        return list(pods.items), str(pods.metadata.resource_version)

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, Any]]:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        w = watch.Watch()
        try:
            for event in w.stream(
                self.api.list_namespaced_pod,
                self.namespace,
                label_selector=self.selector,
                resource_version=resource_version,
                timeout_seconds=timeout_s,
            ):
                kind = event["type"]
                if kind == "ERROR":
                    raise WatchExpired(str(event.get("raw_object")))
                yield kind, event["object"]
        except ApiException as exc:
            if exc.status == 410:
                raise WatchExpired(str(exc.reason)) from exc
            raise
        finally:
            w.stop()


def _default_api() -> Any:
    """In a pod: the service account; elsewhere: ~/.kube/config."""
    from kubernetes import client

    load_cluster_config("--k8s-selector")
    return client.CoreV1Api()


def load_cluster_config(flag: str) -> None:
    """Make the client's default configuration this cluster's: the service account in a pod,
    else the kubeconfig. Neither usable: a :class:`ConfigError` naming ``flag``, the option that
    needs a cluster."""
    import yaml  # type: ignore[import-untyped]  # the client's own dependency (kubeconfig)
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError, yaml.YAMLError) as exc:  # none, or unreadable
            why = " ".join(str(exc).split())  # YAML's errors span lines
            raise ConfigError(
                f"{flag}: not in a pod (no service account) and no usable kubeconfig "
                f"($KUBECONFIG or ~/.kube/config): {why}"
            ) from exc


def _address(pod: PodInfo) -> str:  # endpoints sort by pod IP (one port for all)
    return pod.ip or ""


class PodEndpoints:
    """Ready pods of a selector as ``ip:port`` endpoints, kept current (see the module doc)."""

    def __init__(
        self,
        source: PodSource,
        target_port: int | None,
        publish: Callable[[dict[str, SpeedPrior | None]], None],
        resync_s: int = 60,
        backoff_s: float = 1.0,
    ) -> None:
        self.source = source
        # The port of every pod; a source that knows its own (an InferencePool's ports, as
        # last read: ``target_ports``) overrides it.
        self.target_port = target_port
        self.publish = publish  # called with the whole endpoint set after each change
        self.resync_s = resync_s  # watch timeout: a full list at least this often, seconds
        self.backoff_s = backoff_s  # wait after a failure, seconds
        self.pods: dict[str, PodInfo] = {}
        self.lists = 0  # full lists done (start, resyncs, recoveries)
        self._published: dict[str, SpeedPrior | None] | None = None
        self._warned: set[str] = set()  # pods whose bad speed annotations were logged
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ports(self) -> tuple[int, ...]:
        """The target ports: the source's own when it has some, else ``target_port``."""
        own: tuple[int, ...] = getattr(self.source, "target_ports", ())
        return own or ((self.target_port,) if self.target_port is not None else ())

    def endpoints(self) -> dict[str, SpeedPrior | None]:
        """The ready pods' endpoints (each pod at each port), sorted, each with its own speed
        priors (None: none)."""
        ready = sorted((p for p in self.pods.values() if p.ip and p.ready and not p.deleting),
                       key=_address)  # fmt: skip
        return {f"{p.ip}:{port}": p.speed for p in ready for port in self.ports()}

    def _seen(self, info: PodInfo) -> PodInfo:
        if info.speed_problem is not None and info.name not in self._warned:
            self._warned.add(info.name)
            log.warning("pod %s: %s", info.name, info.speed_problem)
        return info

    def relist(self) -> str:
        """List every pod again (dropping ones gone unseen); returns the resourceVersion."""
        items, version = self.source.list()
        self.lists += 1
        self.pods = {info.name: self._seen(info) for info in map(pod_info, items)}
        self._publish()
        return version

    def apply(self, kind: str, pod: Any) -> None:
        info = self._seen(pod_info(pod))
        if kind == "DELETED":
            self.pods.pop(info.name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.pods[info.name] = info
        self._publish()

    def cycle(self) -> None:
        """One list, then one watch until it ends: the unit the thread repeats."""
        version = self.relist()
        try:
            for kind, pod in self.source.watch(version, self.resync_s):
                if self._stop.is_set():
                    return
                self.apply(kind, pod)
        except WatchExpired as exc:
            log.info("pod watch expired (%s): listing again", exc)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="epp-pods", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop after the current event; a watch blocked on the API is left to its daemon
        thread (it ends with its timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.cycle()
            except DiscoveryError as exc:  # e.g. the pool is missing: keep the endpoints, retry
                log.warning("pod discovery: %s; retrying in %.1f s", exc, self.backoff_s)
                self._stop.wait(self.backoff_s)
            except Exception:  # the API or the network: keep the last endpoints, retry
                log.exception("pod discovery failed; retrying in %.1f s", self.backoff_s)
                self._stop.wait(self.backoff_s)

    def _publish(self) -> None:
        endpoints = self.endpoints()
        if endpoints != self._published:
            self._published = endpoints
            self.publish(endpoints)
