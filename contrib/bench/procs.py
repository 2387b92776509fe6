"""What a process costs, read from /proc: CPU seconds, RSS and PSS, sampled while it idles;
and the floor any agent stands on, a process holding only a libvirt connection."""

import os
import pathlib
import re
import statistics
import subprocess
import time


def cpu_seconds(pid):
    """User and system CPU of a process so far."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_stat(pid):
    """(cpu seconds, rss kB, peak rss kB) of a process."""
    cpu = cpu_seconds(pid)
    status = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return cpu, int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


def idle_memory(pid, start_s, end_s):
    """The median RSS and PSS of a process sampled twice a second from `start_s` to `end_s` after
    now, and the largest RSS seen."""
    time.sleep(start_s)
    rss, pss = [], []
    for _ in range(int((end_s - start_s) * 2)):
        rss.append(proc_stat(pid)[1])
        pss.append(pss_kb(pid))
        time.sleep(0.5)
    return {"rss_kb": statistics.median(rss), "pss_kb": statistics.median(pss), "max_rss_kb": max(rss),
            "window_s": [start_s, end_s]}


def pss_kb(pid):
    rollup = pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M).group(1))


def libvirt_floor(build, uri, domains=(), release=False):
    """(RSS kB, PSS kB) of a process that only holds a libvirt connection: any agent's floor.
    `domains`: (XML file, count) to define and start first; on the test driver they live in the
    connecting process, as an agent's do. `release`: it then gives its start-up pages back, as
    an idle agent does."""
    proc = subprocess.Popen([str(build / "contrib" / "bench" / "libvirt-floor"), *(["--release"] if release else []),
                             uri, *map(str, domains)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"bench: libvirt-floor failed on {uri} {domains}")
        return proc_stat(proc.pid)[1], pss_kb(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait()
