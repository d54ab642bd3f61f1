"""The README's two set-up commands on a fresh clone, timed: the figures the README states.

    python scripts/setup_time.py [--commands main,tests] [--keep DIR]

Clones this repository's HEAD (``git clone``, so only committed files: what CI and a new user
get) into a temporary directory, then runs each of the README's two ``bash`` blocks under
"Set-up on a fresh machine" there, exactly as written, in ``bash -e``, each in a clone of its
own (a fresh ``.venv``).  Prints one table row per command: wall seconds, exit status, and for
the test command pytest's own summary line (tests and their seconds).  Nothing outside the
temporary directory is written (``--keep DIR`` keeps the clones there instead).

The commands are read from the README, not copied here, so the figure is of the README's own
commands; a README whose set-up section does not hold exactly two ``bash`` blocks is an error.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Set-up on a fresh machine"


def readme_commands(readme: str) -> dict[str, str]:
    """``{"main": ..., "tests": ...}``: the two ``bash`` blocks of the README's set-up section,
    in order."""
    start = readme.find(SECTION)
    if start < 0:
        raise SystemExit(f"README.md has no {SECTION!r} section")
    end = readme.find("\n## ", start + len(SECTION))
    blocks = re.findall(r"```bash\n(.*?)```", readme[start:end if end > 0 else None], flags=re.S)
    if len(blocks) != 2:
        raise SystemExit(f"README.md's set-up section holds {len(blocks)} bash blocks, not 2")
    return {"main": blocks[0].strip(), "tests": blocks[1].strip()}


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def time_command(name: str, command: str, work: Path) -> dict:
    """Clone HEAD into ``work/name`` and run ``command`` there; its wall seconds and outcome."""
    clone = work / name
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    shared = ROOT.parent / "shared"  # the data's sibling folder, beside the clone as CI has it
    if shared.exists() and not (work / "shared").exists():
        (work / "shared").symlink_to(shared)
    log = clone.parent / f"{name}.log"
    started = time.perf_counter()
    with open(log, "w") as out:
        status = subprocess.run(["bash", "-e", "-c", command], cwd=clone, stdout=out, stderr=subprocess.STDOUT,
                                env={k: v for k, v in os.environ.items()
                                     if k not in ("VIRTUAL_ENV", "PYTHONPATH")}).returncode
    seconds = time.perf_counter() - started
    summary = ""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if re.search(r"\d+ (passed|failed)", line):
            summary = line.strip("= ")
            break
    if name == "tests" and status == 0:
        summary += f"; unit tier: {unit_tier(clone)}"
    return {"command": name, "seconds": seconds, "status": status, "summary": summary, "log": str(log)}


def unit_tier(clone: Path) -> str:
    """``python -m pytest -q -m unit --collect-only`` in the clone's venv: the README's unit-tier count."""
    out = subprocess.run(["bash", "-c", ". .venv/bin/activate && python -m pytest -q -m unit --collect-only"],
                         cwd=clone, capture_output=True, text=True).stdout
    found = re.findall(r"(\d+)/\d+ tests collected", out)
    return f"{found[-1]} tests" if found else "not counted"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", default="main,tests", help="which of the README's commands (main, tests)")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep the clones")
    args = parser.parse_args()
    from harness.machine import machine_line

    commands = readme_commands((ROOT / "README.md").read_text())
    wanted = [c for c in args.commands.split(",") if c]
    unknown = set(wanted) - set(commands)
    if unknown:
        raise SystemExit(f"unknown command(s) {sorted(unknown)}: main, tests")
    load = os.getloadavg()
    head = commit()  # what is cloned: HEAD when the script starts
    rows = []
    with tempfile.TemporaryDirectory(prefix="setup-time-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in wanted:
            print(f"[{name}] running the README's command on a fresh clone of {head}...", file=sys.stderr)
            rows.append(time_command(name, commands[name], work))
            print(f"[{name}] {rows[-1]['seconds']:.0f} s, exit {rows[-1]['status']}", file=sys.stderr)
    end = os.getloadavg()
    print(f"`python scripts/setup_time.py {' '.join(sys.argv[1:])}` on a fresh clone of {head}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print("| README command | wall seconds | exit | pytest |")
    print("|---|---:|---:|---|")
    for r in rows:
        print(f"| {r['command']} | {r['seconds']:.0f} | {r['status']} | {r['summary'] or '-'} |")
    print(f"\n{machine_line()}; load average {load[0]:.1f} at the start, {end[0]:.1f} at the end "
          "(other work on the machine makes these longer: one run, not a median)")
    if any(r["status"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
