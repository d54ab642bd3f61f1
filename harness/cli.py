"""What a failed ``explore`` command must look like to its user."""


def one_line_failure(out, fragment):
    """``out`` (a finished ``subprocess.run``) failed with one line on stderr containing
    ``fragment``, and no traceback; returns that line."""
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], out.stderr
    return lines[0]
