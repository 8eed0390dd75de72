"""Write the table of gateway settings in docs/configuration.md from ``GatewayConfig``'s fields.

    .venv/bin/python scripts/config_table.py           # rewrite the table in docs/configuration.md
    .venv/bin/python scripts/config_table.py --check   # exit 1 when the table is out of date

Each field's help, default and flag are declared once, in ``prefixroute/gateway/_config.py``;
``tests/commands/test_settings.py`` fails when docs/configuration.md's copy drifts from them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prefixroute.commands._settings import with_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if stale")
    args = parser.parse_args()
    text = DOC.read_text(encoding="utf-8")
    wanted = with_table(text)
    if wanted == text:
        return 0
    if args.check:
        print(f"{DOC.name}: the gateway settings table is out of date; run {__file__}")
        return 1
    DOC.write_text(wanted, encoding="utf-8")
    print(f"{DOC.name}: gateway settings table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
