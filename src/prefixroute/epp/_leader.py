"""Leader election for pickers run active-passive: one Kubernetes Lease, one leader.

The Inference Extension's own picker takes ``--ha-enable-leader-election``: its replicas contend
for a ``coordination.k8s.io`` Lease, and only the leader reports ready, so the picker's Service
(and the Envoy behind it) sends every request to one picker; a standby takes over when the
leader stops renewing. ``prefixroute epp`` takes the same flag (charts that pass it to every
picker work unchanged) and does the same: :class:`LeaseElector` holds the election and tells
the picker when it starts and stops leading, and the picker's gRPC health answers as that
picker's does (``EndpointPicker.lead``).

Several pickers without it all serve, and share one index and load view only through
``--sync-redis``. With it, one picker sees all the traffic and needs no Redis for a consistent
view; but a standby's index is cold when it takes over (it saw no requests) unless it also
shares the leader's view through ``--sync-redis``.

The election is the ``kubernetes`` client's (``LeaderElection`` over a ``LeaseLock``), in a
daemon thread because the client blocks, with controller-runtime's timings (a 15 s lease,
renewed within 10 s, tried every 2 s). Added here, because the client lacks them:

* **stop:** a stopping elector makes no more calls (its loop ends at its next attempt) and a
  leader releases the Lease (holder cleared, a 1 s duration: client-go's ``ReleaseOnCancel``),
  so a standby takes over at its next try, not when the lease would have run out;
* **contend again** after losing the lease: the client's ``run`` returns (controller-runtime
  exits the process instead), and a picker that keeps answering as a standby needs no restart;
* **errors:** an unreachable API server fails that attempt (logged once per failing streak)
  instead of ending the election's thread.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from prefixroute.core import ConfigError

log = logging.getLogger(__name__)

# controller-runtime's defaults (LeaseDuration, RenewDeadline, RetryPeriod), seconds.
LEASE_S = 15
RENEW_S = 10
RETRY_S = 2
LEASE_NAME = "prefixroute-epp"  # --leader-election-id's default


class _Stopped(Exception):
    """The elector is stopping: raised out of the client's loops to end its thread."""


def check_timings(lease_s: int, renew_s: int, retry_s: int) -> None:
    """The client's own rules for the three durations (it exits the process on a broken one):
    whole seconds, ``retry_s >= 1``, ``renew_s > 1.2 * retry_s`` and ``lease_s > renew_s``."""
    if retry_s < 1 or renew_s <= 1.2 * retry_s or lease_s <= renew_s:
        raise ConfigError(
            "leader election needs retry >= 1 s, renew deadline > 1.2x retry and lease > renew "
            f"deadline; got lease {lease_s} s, renew {renew_s} s, retry {retry_s} s"
        )


class LeaseElector:
    """Contend for the Lease ``name`` in ``namespace`` until :meth:`stop`; ``on_change(True)``
    when this process starts leading, ``on_change(False)`` when it stops (both from the
    election's thread). ``api``: a ``CoordinationV1Api`` (default: one over the client's default
    configuration, which :func:`prefixroute.epp._kube.load_cluster_config` sets)."""

    def __init__(
        self,
        name: str,
        namespace: str,
        on_change: Callable[[bool], None],
        identity: str | None = None,
        timings: tuple[int, int, int] = (LEASE_S, RENEW_S, RETRY_S),
        api: Any = None,
    ) -> None:
        try:
            from kubernetes.leaderelection import electionconfig
            from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock
        except ImportError as exc:
            raise ConfigError(
                "--ha-enable-leader-election needs the kubernetes client: "
                "pip install 'prefixroute[kubernetes]'"
            ) from exc
        check_timings(*timings)
        self.name, self.namespace = name, namespace
        # As controller-runtime names a candidate: its pod (the hostname) and a fresh UUID, so a
        # restarted pod is a new candidate and does not take its predecessor's lease for its own.
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4()}"
        self.on_change = on_change
        self.leading = False
        self.elections = 0  # times this process started leading
        self._stopping = threading.Event()
        self._mutex = threading.Lock()  # one API call at a time: a release never races a renewal
        self._failing = False
        self._held = False  # some try took or renewed the Lease: stop() may have one to release
        # The client logs every try at INFO (a standby: "lease held by ..." every retry); this
        # module says what changes.
        client_log = logging.getLogger("leaderelection")
        if client_log.level == logging.NOTSET:
            client_log.setLevel(logging.WARNING)
        self._lock = LeaseLock(name, namespace, self.identity)
        if api is not None:
            self._lock.api_instance = api
        lease_s, renew_s, retry_s = timings
        config = electionconfig.Config(
            self._lock, lease_s, renew_s, retry_s, self._started, self._stopped
        )
        self._election = _election_class()(config, self._attempt)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="epp-leader", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop contending; release the Lease if this process holds it (module docstring)."""
        with self._mutex:
            self._stopping.set()
            if self._held:
                self._release()
            was_leading, self.leading = self.leading, False
        if was_leading:
            self.on_change(False)
        if self._thread is not None:
            self._thread.join(timeout_s)  # asleep between tries: the daemon thread ends later

    # --- in the election's thread ---------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._election.run()  # returns when a leader fails to renew: contend again
            except _Stopped:
                return

    def _attempt(self, attempt: Callable[[], bool]) -> bool:
        """One of the client's tries to take or renew the lease, unless stopping."""
        with self._mutex:
            if self._stopping.is_set():
                raise _Stopped
            try:
                ok = attempt()
            except Exception as exc:  # the API server unreachable, a malformed answer: retried
                if not self._failing:
                    log.warning("leader election: the Lease API failed (%s); retrying", exc)
                self._failing = True
                return False
            self._failing = False
            self._held = self._held or ok
            return ok

    # Under the mutex, so that stop() and these announce changes in the order they happen.
    def _started(self) -> None:
        with self._mutex:
            if self._stopping.is_set():  # stop() began: this process leads no more
                return
            self.leading = True
            self.elections += 1
            log.info("leader election: %s leads (Lease %s/%s)", self.identity, self.namespace,
                     self.name)  # fmt: skip
            self.on_change(True)

    def _stopped(self) -> None:
        with self._mutex:
            if not self.leading:
                return
            self.leading = False
            log.warning("leader election: %s lost the Lease; standing by", self.identity)
            self.on_change(False)

    def _release(self) -> None:
        """Clear the holder (client-go's release: holder "", a 1 s lease), if still ours."""
        api = self._lock.api_instance
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = datetime.now(UTC)
            api.replace_namespaced_lease(self.name, self.namespace, lease)
            log.info("leader election: %s released the Lease", self.identity)
        except Exception as exc:  # a standby then waits the lease out, as after a crash
            log.warning("leader election: could not release the Lease (%s)", exc)


def _election_class() -> type:
    """The client's ``LeaderElection`` with each try routed through the elector (imported late:
    the client is an optional extra)."""
    from kubernetes.leaderelection.leaderelection import LeaderElection

    class _Election(LeaderElection):  # type: ignore[misc]
        def __init__(self, config: Any, attempt: Callable[[Callable[[], bool]], bool]) -> None:
            super().__init__(config)
            self._attempt = attempt

        def try_acquire_or_renew(self) -> bool:
            return self._attempt(super().try_acquire_or_renew)

    return _Election
