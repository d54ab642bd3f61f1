"""One line describing the machine a benchmark ran on (printed under every table)."""

import os
import platform

import numpy as np
import psutil


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, "
            f"Linux {platform.release()}, Python {platform.python_version()}, NumPy {np.__version__}")
