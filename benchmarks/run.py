"""Run every benchmark: ``make bench`` (or ``.venv/bin/python benchmarks/run.py``).

Each benchmark prints its own numbers beside a baseline measured in the same run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).parent
BENCHES = (
    "core_bench", "sim_bench", "gateway_overhead", "policy_sweep", "precise_bench", "scale_sim",
    "heterogeneous", "hotpath", "observability_cost", "epp_overhead", "index_capacity",
    "groups_tail", "sim_jobs",
)


def main() -> int:
    only = set(sys.argv[1:])
    for name in BENCHES:
        if only and name not in only:
            continue
        path = HERE / f"{name}.py"
        if not path.exists():
            print(f"(skipping {name}: not present)")
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        # Registered before it runs, as an import would: dataclasses look their module up.
        sys.modules[name] = module
        spec.loader.exec_module(module)
        print(f"\n# {name}")
        module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
