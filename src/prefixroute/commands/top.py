"""``prefixroute top``: the gateway's fleet page in the terminal, for operators on SSH.

It polls the gateway's ``/dashboard/state.json`` (the document the page draws; its shape is in
``prefixroute.gateway._fleetview``) and redraws with rich's ``Live``: one row per replica (load,
queued work, learned speed, index size, prefix hit rate predicted against reported) and the
latest routing decisions with their reasons. Rates (requests/s) come from two polls, so the
first frame and ``--once`` show totals only.

The token goes as ``Authorization: Bearer``, read from ``--admin-token-file`` or
``$PREFIXROUTE_ADMIN_TOKEN``, never from the command line (``ps`` shows it to every user).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, NoReturn

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from prefixroute.commands._args import check_http_url, check_positive
from prefixroute.core import ConfigError
from prefixroute.gateway import ADMIN_TOKEN_ENV, read_secret

TOKEN_ENV = ADMIN_TOKEN_ENV  # as ``prefixroute serve``
STATE_PATH = "/dashboard/state.json"
DEFAULT_URL = "http://127.0.0.1:8000"
# The replica table's columns (short, so that the table fits 100 columns).
COLUMNS = ("replica", "health", "in fl", "queue tok", "queue s", "tok/s", "step ms", "blocks",
           "req/s", "pred%", "hit%")  # fmt: skip
MAX_WAIT_S = 86_400  # seconds: the longest --interval or --timeout (a day)
HEALTH_STYLE = {"healthy": "green", "unhealthy": "red", "draining": "yellow"}


def add_parser(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "top",
        help="watch a running gateway's replicas and routing decisions live in the terminal",
        description="The gateway's /dashboard in the terminal: per replica load, queued work, "
        "learned speed, index size and prefix hit rate, and the latest decisions. "
        "Ctrl-C quits.",
    )
    p.add_argument(
        "--url", default=DEFAULT_URL, help="the gateway's base URL (default %(default)s)"
    )
    p.add_argument(
        "--admin-token-file",
        metavar="PATH",
        help=f"file holding the gateway's admin token (default: ${TOKEN_ENV}, else none)",
    )
    p.add_argument(
        "--interval", type=float, default=1.0, help="seconds between polls (default %(default)s)"
    )
    p.add_argument(
        "--decisions", type=int, default=10, help="recent decisions shown (default %(default)s)"
    )
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--timeout", type=float, default=5.0, help="per poll, seconds (default 5)")
    p.set_defaults(run=run)


def read_token(path: str | None) -> str | None:
    """The token from ``path``, else from ``$PREFIXROUTE_ADMIN_TOKEN``, else None. The file is
    read as ``serve`` reads it (:func:`read_secret`): not UTF-8, empty or several lines long is
    one line of error, the same one ``serve`` gives."""
    if path is None:
        return os.environ.get(TOKEN_ENV) or None
    return read_secret(path, "admin token")


def fetch_state(url: str, token: str | None, timeout_s: float) -> dict[str, Any]:
    """The gateway's fleet state; a clear :class:`ConfigError` when it cannot be had."""
    request = urllib.request.Request(url.rstrip("/") + STATE_PATH)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            doc: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the answer's socket open: the status is all that is read
        if exc.code == 401:
            raise ConfigError(
                f"{url} wants a valid admin token (--admin-token-file or ${TOKEN_ENV})"
            ) from None
        if exc.code == 404:
            raise ConfigError(
                f"{url} has no {STATE_PATH}: point --url at a prefixroute gateway's base URL "
                "(not a replica, no path); a gateway serves it with an admin token or on a "
                "loopback address, and with --admin-port on the admin listener"
            ) from None
        raise ConfigError(f"{url} answered HTTP {exc.code} for {STATE_PATH}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(f"cannot reach the gateway at {url}: {reason}") from None
    except ValueError as exc:
        raise ConfigError(f"{url} sent a state document that is not JSON: {exc}") from None
    return doc


SNAPSHOT_WIDTH = 200  # columns of a snapshot written to a pipe or a file


def _short(url: str) -> str:
    """A replica URL without its scheme: the table fits 100 columns."""
    return url.partition("://")[2] or url


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}" if whole > 0 else "-"


def render(
    state: dict[str, Any], previous: dict[str, Any] | None = None, decisions: int = 10
) -> Group:
    """One frame: the header line, the replica table and the latest decisions."""
    return Group(_header(state), _replica_table(state, previous), _decisions(state, decisions))


def _header(state: dict[str, Any]) -> Text:
    totals = state["totals"]
    stamp = time.strftime("%H:%M:%S", time.localtime(state["time"]))
    return Text.assemble(
        ("prefixroute top", "bold"),
        f"  {stamp}  policy {state['policy']}, {state['mode']} mode  |  "
        f"{totals['requests']:,} requests, {totals['in_flight']} in flight, prefix hit "
        f"{_pct(totals['actual_cached'], totals['prompt_tokens'])}% reported / "
        f"{_pct(totals['predicted_cached'], totals['prompt_tokens'])}% predicted, "
        f"{totals['index_entries']:,} index entries",
    )


def _replica_table(state: dict[str, Any], previous: dict[str, Any] | None) -> Table:
    """One row per replica; requests/s from the previous poll, when there is one."""
    before: dict[str, dict[str, Any]] = {}
    dt = 0.0
    if previous is not None:
        before = {r["id"]: r for r in previous["replicas"]}
        dt = state["time"] - previous["time"]
    table = Table(
        box=box.SIMPLE_HEAD, header_style="bold", show_edge=False, padding=(0, 1),
        collapse_padding=True,
        caption="tok/s: learned prefill speed (*: not yet, the fleet's or the configured); "
        "pred% / hit%: prefix hit predicted / reported",
        caption_justify="left",
    )  # fmt: skip
    for name in COLUMNS:
        table.add_column(name, justify="left" if name in ("replica", "health") else "right")
    for r in state["replicas"]:
        speed = r["speed"]
        old = before.get(r["id"])
        rate = f"{(r['requests'] - old['requests']) / dt:.1f}" if old and dt > 0 else "-"
        table.add_row(
            _short(r["id"]),
            Text(r["status"], style=HEALTH_STYLE.get(r["status"], "")),
            str(r["in_flight"]),
            f"{r['queued_prefill_tokens']:,}",
            f"{r['queued_prefill_s']:.3f}",
            f"{speed['prefill_tokens_per_s']:,.0f}{_unlearned(speed)}",
            f"{1000 * speed['decode_step_s']:.1f}",
            f"{r['index_blocks']:,}",
            rate,
            _pct(r["predicted_cached"], r["prompt_tokens"]),
            _pct(r["actual_cached"], r["prompt_tokens"]),
        )
    return table


def _unlearned(speed: dict[str, Any]) -> str:
    """``*`` beside a speed the replica has not taught the router yet (a gateway that does not
    say counts as learned)."""
    return "" if speed.get("estimates_from", "learned") == "learned" else "*"


def _decisions(state: dict[str, Any], decisions: int) -> Table:
    recent = Table(
        box=box.SIMPLE_HEAD, title="recent decisions", title_justify="left",
        header_style="bold", pad_edge=False,
    )  # fmt: skip
    for name in ("time", "replica", "reason", "status", "predicted cached"):
        numeric = name in ("status", "predicted cached")
        recent.add_column(name, justify="right" if numeric else "left")
    for d in state["decisions"][:decisions]:
        predicted = d["predicted_cached"]
        recent.add_row(
            time.strftime("%H:%M:%S", time.localtime(d["time"])),
            _short(d["replica"]),
            d["reason"],
            Text(str(d["status"]), style="red" if d["status"] >= 400 else ""),
            "-" if predicted is None else f"{predicted:,}",
        )
    return recent


def check_flags(args: argparse.Namespace) -> None:
    """Every flag checked before the first poll, so that a typo is one line of error rather
    than a urllib traceback (a URL) or a poll that can never succeed (a timeout of zero)."""
    check_http_url(args.url, "--url")
    for flag, value in (("--interval", args.interval), ("--timeout", args.timeout)):
        check_positive(value, flag)
        if value > MAX_WAIT_S:  # time.sleep and socket timeouts overflow on 1e308
            raise ConfigError(f"{flag} must be at most {MAX_WAIT_S:,} s, got {value:g}")
    if args.decisions < 0:
        raise ConfigError(f"--decisions must be 0 or more, got {args.decisions}")


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    token = read_token(args.admin_token_file)
    console: Console = _Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # A snapshot for a script or a pipe: rich would assume 80 columns and cut the table;
        # its lines are only as long as the table needs.
        console = _Console(width=SNAPSHOT_WIDTH)
    state = fetch_state(args.url, token, args.timeout)
    if args.once:
        console.print(render(state, None, args.decisions))
        return 0
    try:
        if console.is_terminal:
            with Live(render(state, None, args.decisions), console=console,
                      auto_refresh=False) as live:  # fmt: skip
                _follow(args, token, state, lambda frame: live.update(frame, refresh=True))
        else:  # a file or a pipe: rich's Live draws only when it stops, so a frame per poll
            _follow(args, token, state, lambda frame: _print_frame(console, frame), first=True)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `top | head`: the reader has seen enough (_Console)
        return 0


class _Console(Console):
    """rich's console, but a reader that goes away (``top | head``) ends top with status 0, as
    having done its job, where rich exits 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # rich's own steps: nothing more written, stdout to /dev/null
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise BrokenPipeError


def _follow(
    args: argparse.Namespace, token: str | None, state: dict[str, Any],
    show: Callable[[Group], None], first: bool = False,
) -> NoReturn:  # fmt: skip
    """Poll every ``--interval`` and ``show`` each frame, for ever (``first``: the first poll's
    frame too). A poll that fails is said in the frame, and polling goes on."""
    if first:
        show(render(state, None, args.decisions))
    previous: dict[str, Any] | None = None
    while True:
        time.sleep(args.interval)
        try:
            previous, state = state, fetch_state(args.url, token, args.timeout)
        except ConfigError as exc:  # a restart, a blip: say so and keep polling
            frame = render(state, None, args.decisions)
            frame.renderables.insert(0, Text(f"{exc} (retrying)", style="red"))
            show(frame)
            continue
        show(render(state, previous, args.decisions))


def _print_frame(console: Console, frame: Group) -> None:
    """One frame, at once, where there is no terminal to redraw (a pipe holds its bytes)."""
    console.print(time.strftime("%H:%M:%S"), frame)
    console.file.flush()
