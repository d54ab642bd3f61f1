"""Which regime boundaries every fit of an explore loop could have kept, replayed from its store.

For each store given (a runs directory of ``explore``, e.g. one of ``calibration.py``'s
``CACHE/calibration-*/OP-SEED``), the operator's usable profiles are taken in store order and,
for every prefix of two or more, fitted by the full ML-II fit with its boundary search
(``ExplorationCore.base_fit``, the fit the loop makes when it holds no hyperparameters): a
superset of the fits the loop made.  One line per prefix whose search tried a boundary: kept or
not, and each step's boundary, whole gain, gain without one profile (where the code checked out
computes it) and verdict.  Training data only: no held-out answer is read.

Two rules make the same loop on the same measurements when their lines agree on every prefix;
run this with each rule's code checked out (``PYTHONPATH=that tree``) and compare the outputs.

    python scripts/boundary_replay.py STORE [STORE ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.plugins import use_plugin

use_plugin("unseen_operators", Path(__file__).resolve().parent)

from explorer.search.core import ExplorationCore, _usable  # noqa: E402
from explorer.search.store import Store  # noqa: E402
from operators.plugins import load_plugins  # noqa: E402

load_plugins()


def replay(store: Path) -> list[str]:
    """The lines of one store (its directory is named ``OP-SEED``)."""
    operator = store.name.rsplit("-", 1)[0]
    records = _usable(Store(runs_dir=store).records(operator))
    core = ExplorationCore(operator, memory_limit=2**30, memory_cap=12 * 2**30, seed=0)
    lines, tried, kept = [], 0, 0
    for k in range(2, len(records) + 1):
        model = core.base_fit(records[:k])
        regime = None if model is None else model.info.get("regime")
        if not regime:
            continue
        tried += 1
        kept += bool(regime["kept"])
        steps = "; ".join(f"{s['boundary']}: gain {s['gain']}"
                          + (f", {s['gain_without_one']} without one" if "gain_without_one" in s else "")
                          + (" kept" if s["kept"] else " refused") for s in regime["steps"])
        lines.append(f"{store.name} {k:2d} profiles: {'KEPT ' + regime['boundary'] if regime['kept'] else 'none'}"
                     f" ({steps})")
    lines.append(f"{store.name}: {len(records)} profiles, {tried} prefixes tried a boundary, {kept} kept one")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="+", type=Path)
    for store in parser.parse_args().stores:
        for line in replay(store):
            print(line, flush=True)


if __name__ == "__main__":
    main()
