"""A pipeline's learnt run noise with and without its members' floor
(``explorer.search.core.member_noise_floor``), from a ``bench_pipelines.py`` cache.

For each spec: its members' learnt single-run noise (``MemoryModel.hyperparameters``:
``relative_run_sd``, ``abs_noise_sd_bytes``, from ``<cache>/runs``), the floor they give, and
the pipeline's profiles of ``explore SPEC --budget 10`` (``<cache>/explored/<spec>-composed``)
fitted as the loop fits them (``ExplorationCore.fit``, the composed prior) without the floor
and with it: what the pipeline learns from its own repeats alone, and what it keeps.

    python scripts/pipeline_noise.py --cache runs/bench/pipelines [--pipelines SPEC;SPEC]

Prints Markdown and the machine line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import operators
from bench_pipelines import CONFIDENCE, ISSUE_PIPELINES
from explorer.search.core import ExplorationCore, composed_prior, member_noise_floor
from explorer.measure.profiling import default_memory_cap
from explorer.search.store import SOURCE_PROFILE, Store
from explorer.model.load import load_model
from explorer.core.units import parse_size
from harness.machine import machine_line


def noise(h: dict) -> str:
    return f"{100 * h['relative_run_sd']:.2f}% + {h['abs_noise_sd_bytes'] / 1024:.0f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, type=Path, help="a bench_pipelines.py --cache")
    parser.add_argument("--pipelines", default=ISSUE_PIPELINES, help="specs separated by ';'")
    parser.add_argument("--memory-limit", default="1GiB", help="the target memory the explorations used")
    args = parser.parse_args()
    runs = args.cache / "runs"
    print(f"## Learnt single-run noise (relative sd + absolute sd), `{args.cache}`\n")
    print("| pipeline | members (each: relative + absolute) | floor | profiles | pipeline, without the floor "
          "| pipeline, with the floor |")
    print("|---|---|---|---:|---|---|")
    for spec in [operators.get(s).name for s in args.pipelines.split(";") if s]:
        op = operators.get(spec)
        names = list(dict.fromkeys(m.name for m in op.members))
        members = "; ".join(f"`{n}` {noise(load_model(n, runs_dir=runs).hyperparameters)}" for n in names)
        floor = member_noise_floor(op, runs)
        explored = args.cache / "explored" / f"{spec}-composed"
        records = [r for r in Store(explored).records(op.name) if r.source == SOURCE_PROFILE]
        fits = []
        for with_floor in (None, floor):
            core = ExplorationCore(op.name, memory_limit=parse_size(args.memory_limit),
                                   memory_cap=default_memory_cap(), confidence=CONFIDENCE,
                                   prior_model=composed_prior(op, runs), noise_floor=with_floor)
            model = core.fit(records)
            fits.append("-" if model is None else noise(model.hyperparameters))
        floor_text = f"{100 * floor.relative_sd:.2f}% + {floor.absolute_sd_bytes / 1024:.0f} KiB"
        print(f"| `{spec}` | {members} | {floor_text} | {len(records)} | {fits[0]} | {fits[1]} |")
    print(f"\n{machine_line()}")


if __name__ == "__main__":
    main()
