#!/usr/bin/python3
"""Evacuation at scale: AGENTS agents on libvirt's test driver (etcd and Placement on sqlite as
in the fault campaign), INSTANCES instances packed onto one host, that host's agent killed -9,
then `toyvm evacuate` timed, the instances waited for ACTIVE elsewhere, the host brought back
and `toyvm audit` required clean.

  usage: evacuate.py --build DIR [--agents 200] [--instances 16]
"""

import argparse
import collections
import pathlib
import signal
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testbed"))
from cloud import Cloud, wait_until  # noqa: E402

INVENTORY = "VCPU:16,MEMORY_MB:16384,DISK_GB:160"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--instances", type=int, default=16)
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="toyvm-evacuate-"))
    cloud = Cloud(pathlib.Path(args.build), workdir)
    config = workdir / "agent.toml"
    config.write_text("[compute]\nlease_ttl = 3\n")
    names = [f"h{i}" for i in range(args.agents)]
    ok = False
    try:
        started = time.monotonic()
        for name in names:
            cloud.start_agent(name, INVENTORY, config)
        wait_until("every agent", lambda: sum(h["alive"] for h in cloud.hosts()) == args.agents, 600)
        print(f"{args.agents} agents up in {time.monotonic() - started:.1f} s", flush=True)
        placed = cloud.run("schedule", "resources=VCPU:1,MEMORY_MB:256,DISK_GB:1", "--count", str(args.instances),
                           "--policy", "pack")
        hosts = collections.Counter(line.split(", ")[1] for line in placed.stdout.splitlines()
                                    if line.startswith("NOTIFIED"))
        rp, count = hosts.most_common(1)[0]
        victim = next(name for name in names if cloud.provider(name) == rp)
        wait_until("every instance ACTIVE", lambda: all(i["state"] == "ACTIVE" for i in cloud.instances()), 120)
        cloud.stop(victim, signal.SIGKILL)
        wait_until(f"{victim}'s lease to end", lambda: not cloud.agent_alive(victim), 30)
        started = time.monotonic()
        evacuated = cloud.run("evacuate", victim)
        took = time.monotonic() - started
        moved = evacuated.stdout.count("EVACUATED")
        print(f"evacuate of {count} instances: exit {evacuated.returncode}, {moved} moved in {took:.2f} s "
              f"({took / max(moved, 1) * 1000:.0f} ms each) {evacuated.stderr.strip()}", flush=True)
        started = time.monotonic()
        wait_until("ACTIVE elsewhere", lambda: all(i["state"] == "ACTIVE" and i["host"] != rp
                                                   for i in cloud.instances()), 120)
        print(f"every instance ACTIVE elsewhere {time.monotonic() - started:.2f} s later", flush=True)
        cloud.start_agent(victim, INVENTORY, config)
        wait_until(f"{victim} back", lambda: cloud.agent_alive(victim), 60)
        audit = cloud.run("audit")
        print(f"audit exit {audit.returncode}: {audit.stdout.strip()}; overbooked: {cloud.overbooked() or 'none'}")
        ok = evacuated.returncode == 0 and moved == count and audit.returncode == 0
    finally:
        cloud.finish(ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
