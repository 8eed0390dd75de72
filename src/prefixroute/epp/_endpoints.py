"""Which endpoints the picker may pick: a static list, a file, or (``_kube``) pods.

Every source ends in :meth:`EndpointSet.apply` with the whole set it now sees: new endpoints are
added to the registry (and probed at once, as the gateway probes a replica added by the admin
API), vanished ones removed (their requests in flight still finish and are accounted). So the
registry, the router and the metrics see one membership, however it was discovered.

An endpoint's own speed priors (another GPU than the fleet's) come from its source where it
has them (a pod's annotations, ``_kube``), else from the priors the config gives for its
address (``--replica-speed``: ``registry.priors``). They are read when it joins: a pod's
annotations come from its template, so new priors come with new pods.

The file source reads one ``ip:port`` (or URL) per line, ``#`` comments allowed, and is re-read
when its modification time changes: a ConfigMap mounted as a file updates without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Mapping

from prefixroute._tasks import cancel_and_wait, every
from prefixroute.core import ConfigError, ReplicaId, SpeedPrior
from prefixroute.epp._candidates import replica_of
from prefixroute.gateway import ReplicaRecord, ReplicaRegistry, read_bounded

log = logging.getLogger(__name__)


class EndpointSet:
    """Keeps the registry's membership equal to what a discovery source last saw."""

    def __init__(
        self, registry: ReplicaRegistry, on_added: Callable[[ReplicaRecord], None] | None = None
    ) -> None:
        self.registry = registry
        self.on_added = on_added  # e.g. probe it now

    def apply(
        self, endpoints: Iterable[str] | Mapping[str, SpeedPrior | None]
    ) -> tuple[list[ReplicaId], list[ReplicaId]]:
        """Make the registry hold exactly ``endpoints`` (a mapping: each one's own speed
        priors, None where it has none); returns (added, removed)."""
        given = endpoints if isinstance(endpoints, Mapping) else {}
        wanted: dict[ReplicaId, SpeedPrior | None] = {}
        for endpoint in endpoints:
            try:
                wanted[replica_of(endpoint)] = given.get(endpoint)
            except ConfigError as exc:
                log.warning("endpoint %r skipped: %s", endpoint, exc)
        have = {record.id for record in self.registry}
        added = [rid for rid in wanted if rid not in have]
        removed = [rid for rid in have if rid not in wanted]
        for rid in removed:
            self.registry.remove(rid)
        for rid in added:
            record = self.registry.add(rid, wanted[rid])
            if self.on_added is not None:
                self.on_added(record)
        if added or removed:
            log.info("endpoints: +%d -%d, now %d", len(added), len(removed), len(wanted))
        return added, removed


MAX_ENDPOINTS_BYTES = 16 << 20  # 16 MiB: hundreds of thousands of endpoints


def read_endpoints_file(path: str | os.PathLike[str]) -> list[str]:
    """The endpoints listed in ``path``: one per line, blank lines and ``#`` comments skipped.

    A file that cannot be read or is not UTF-8 is a :class:`ConfigError`, the one error the
    watcher expects: at start it is the CLI's one-line error, later a warning that keeps the
    last good list (a UnicodeDecodeError used to end the watch for good).
    """
    try:
        text = read_bounded(path, MAX_ENDPOINTS_BYTES, "the endpoints file").decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the endpoints file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        why = f"not UTF-8 text (byte {exc.start})"
        raise ConfigError(f"cannot read the endpoints file {path}: {why}") from exc
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


class FileEndpoints:
    """Re-reads an endpoints file whenever its modification time changes."""

    def __init__(self, path: str, target: EndpointSet, interval_s: float = 1.0) -> None:
        self.path = path
        self.target = target
        self.interval_s = interval_s  # how often the file's mtime is checked, seconds
        self._mtime: float | None = None
        self._task: asyncio.Task[None] | None = None

    def poll(self) -> bool:
        """Apply the file if it changed since the last look; returns whether it did."""
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            return False  # gone for a moment (an atomic replace): keep what we have
        if mtime == self._mtime:
            return False
        self._mtime = mtime
        self.target.apply(read_endpoints_file(self.path))
        return True

    def start(self) -> None:
        """Apply the file and keep watching it. A file missing at start is a :class:`ConfigError`
        (a mounted ConfigMap is there before the container starts: a wrong path, most likely);
        one missing later is a replace in progress, and the endpoints stay as they were."""
        try:
            os.stat(self.path)
        except OSError as exc:
            why = exc.strerror
            raise ConfigError(f"cannot read the endpoints file {self.path}: {why}") from exc
        self.poll()
        # Every error is caught, not only ConfigError: a watch that ended on one surprise would
        # leave the picker on a stale list (or none) for good, with nothing said.
        self._task = every(self.interval_s, self._tick, self._failed, "epp-file")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _tick(self) -> None:
        self.poll()

    @staticmethod
    def _failed(exc: Exception) -> None:
        if isinstance(exc, ConfigError):  # a bad file: the last good list stays
            log.warning("endpoints file: %s (keeping the last good list)", exc)
        else:  # a bug: the traceback, and the next tick still comes
            log.exception("endpoints file: reading it failed")
