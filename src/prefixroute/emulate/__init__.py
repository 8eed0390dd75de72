"""An emulated vLLM-like replica: the simulator's replica model served over HTTP in real time.

Start replicas in-process (tests, ``serve --emulate``, ``bench``)::

    from prefixroute.emulate import EmulatorConfig, start_replicas
    from prefixroute.sim.replica import ReplicaConfig

    cluster = await start_replicas(4, EmulatorConfig(ReplicaConfig(block_size=1), time_scale=0.01))
    cluster.urls          # ["http://127.0.0.1:40123", ...]
    await cluster.stop()

or from the command line: ``prefixroute emulate --port 8001``.

The engine alone, without HTTP (``prefixroute.ray_serve`` runs one inside each Serve replica):
:class:`EngineLoop` over a ``ReplicaModel``; ``submit`` returns a :class:`Generation` whose queue
carries output-token counts, then ``FINISHED`` or ``ABORTED``; ``release`` it when done.
:func:`parse_request` reads an OpenAI request body into prompt token ids as the server does.
"""

from prefixroute.emulate._config import EmulatorConfig
from prefixroute.emulate._engine import ABORTED, FINISHED, EngineLoop, EngineStopped, Generation
from prefixroute.emulate._errors import EmulateError
from prefixroute.emulate._openai import Endpoint, ParsedRequest, parse_request
from prefixroute.emulate._server import EmulatedCluster, EmulatedReplica, start_replicas
from prefixroute.emulate._tokenizer import EmulatedTokenizer, count_tokens, render_chat, tokenize

__all__ = [
    "ABORTED",
    "FINISHED",
    "EmulatedCluster",
    "EmulateError",
    "EmulatedReplica",
    "EmulatedTokenizer",
    "EmulatorConfig",
    "Endpoint",
    "EngineLoop",
    "EngineStopped",
    "Generation",
    "ParsedRequest",
    "count_tokens",
    "parse_request",
    "render_chat",
    "start_replicas",
    "tokenize",
]
