# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Where, when and on what a measurement ran: the stamp every benchmark JSON carries (date, commit, library
versions, CPU, cores, threads, the machine's load), so that a figure can be traced to its run and compared only with
runs on like machines.

Example:
    >>> stamp = run_stamp("cpu"); stamp["cores"] >= 1 and "load_average_1min" in stamp
    True
"""

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch

from ..modeling_dflash import HUB_KERNELS
from ..timing_dflash import synchronized_clock


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_commit() -> str | None:
    """The git commit of the hf_dflash checkout that runs (with ``+dirty`` for uncommitted changes), None when it
    is an installed copy."""
    folder = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def busy_cpu_seconds() -> float | None:
    """CPU-seconds all processes have spent busy since boot (Linux: /proc/stat), None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """Cores kept busy by OTHER processes while a measurement runs: the machine's busy CPU time minus this
    process's own, over the wall time (a quiet machine reads ~0; one other single-threaded job, ~1).

    Example:
        >>> load = OtherLoad(); load.cores() is None or load.cores() >= 0
        True
    """

    def __init__(self):
        self.start = (busy_cpu_seconds(), self.own_seconds(), synchronized_clock("cpu"))

    @staticmethod
    def own_seconds() -> float:
        times = os.times()
        return times.user + times.system

    def cores(self) -> float | None:
        busy, own, wall = busy_cpu_seconds(), self.own_seconds(), synchronized_clock("cpu")
        if busy is None or self.start[0] is None or wall <= self.start[2]:
            return None
        return max(0.0, round(((busy - self.start[0]) - (own - self.start[1])) / (wall - self.start[2]), 2))


def load_average() -> float | None:
    """The machine's 1-minute load average (runnable processes, this one included), None where the OS has none.

    Example:
        >>> load = load_average(); load is None or load >= 0
        True
    """
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def run_stamp(device, load_before: float | None = None) -> dict:
    """When, where and with what a measurement ran: UTC time, commit, library versions, CPU, cores, torch threads,
    whether models were loaded with transformers' hub kernels (hf-dflash's loaders leave them off: ``HUB_KERNELS``),
    and the 1-minute load average before the run (`load_before`, taken by the caller when it starts) and now.

    Example:
        >>> sorted(run_stamp("cpu"))[:4]
        ['commit', 'cores', 'cpu', 'date']
    """
    import transformers

    from .. import __version__

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": source_commit(),
        "hf_dflash": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if str(device).startswith("cuda") else None,
        "hub_kernels": HUB_KERNELS,
        "load_average_1min": {"before": load_before, "after": load_average()},
    }
