"""What a failed ``explore`` command must look like to its user."""


def one_line_failure(out, fragment):
    """``out`` (a finished ``subprocess.run``) failed with one line on stderr containing
    ``fragment``, and no traceback; returns that line."""
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], out.stderr
    return lines[0]


def explore_json(*args, timeout: float = 3600) -> tuple[float, dict]:
    """``(wall seconds, the JSON it printed last)`` of ``explore ARGS --json`` run as a user runs
    it (a fresh process); a failure ends the calling script with the command and stderr's last line."""
    import json
    import subprocess
    import sys
    import time

    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "explorer.cli", *map(str, args), "--json"], capture_output=True,
                         text=True, timeout=timeout)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"explore {' '.join(map(str, args))} failed: {out.stderr.strip().splitlines()[-1:]}")
    return wall, json.loads(out.stdout.strip().splitlines()[-1])
