"""One line describing the machine a benchmark ran on (printed under every table)."""

import os
import platform

import numpy as np
import psutil

from explorer.core.environment import cpu_model


def machine_line() -> str:
    cpu = cpu_model() or platform.machine()
    return (f"{cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, "
            f"Linux {platform.release()}, Python {platform.python_version()}, NumPy {np.__version__}")
