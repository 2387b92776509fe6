#!/usr/bin/python3
"""Draining a host of running guests: two agents, one on the first libvirtd (qemu:///system) and
one on the second (contrib/second-libvirtd.sh), GUESTS tiny TCG guests (contrib/tiny-guest.sh)
on the first (the guests' `clean-traffic` filter on the first daemon only: two daemons in one
network namespace break each other's ebtables chains), then `toyvm host drain` timed from the first host to the second and back, one
move at a time and all at once, `toyvm audit` required clean after each drain. For comparison,
in the same run: one live move alone (`toyvm migrate`), one cold move of a running guest
(`migrate --cold`: powered off, its disk streamed, booted there; until the command returns) and
one resize on its own host (`toyvm resize`, its disk grown by 1 GB each time).

  usage: drain.py --build DIR [--guests 3] [--rounds 2]
"""

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testbed"))
from cloud import ROOT, Cloud, wait_until  # noqa: E402

INVENTORY = "VCPU:8,MEMORY_MB:4096,DISK_GB:40"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--guests", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    subprocess.run([str(ROOT / "contrib" / "start-libvirtd.sh")], check=True)
    second = subprocess.run([str(ROOT / "contrib" / "second-libvirtd.sh"), "start"], check=True, capture_output=True,
                            text=True).stdout.split("\n")
    second_uri, first_from_second = second[0], second[1]
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="toyvm-drain-"))
    os.chmod(workdir, 0o755)
    images = workdir / "images"
    subprocess.run([str(ROOT / "contrib" / "tiny-guest.sh"), str(images / "tiny")], check=True,
                   stdout=subprocess.DEVNULL)
    os.chmod(images, 0o755)
    cloud = Cloud(pathlib.Path(args.build), workdir)

    # Two daemons in one network namespace share the kernel's ebtables, and their nwfilters
    # break each other's chains when both work at once: the filter is on the first host only.
    def agent(name, uri, reached_as, guest_filter):
        config = workdir / f"{name}.toml"
        config.write_text(f"[compute]\nlibvirt_uri = '{uri}'\ndomain_type = 'qemu'\nimage_dir = '{images}'\n"
                          f"network = 'default'\nstop_timeout = 0\nmove_libvirt_uri = '{reached_as}'\n"
                          f"move_address = '127.0.0.1'\nguest_filter = '{guest_filter}'\n")
        cloud.start_agent(name, INVENTORY, config, libvirt_uri=None)
        return cloud.wait_agent(name, 60)

    def drain(source, target, parallel):
        """Drains `source` onto `target`; seconds."""
        cloud.run("host", "enable", target)
        wait_until(f"{target} READY", lambda: any(h["name"] == target and h["status"] == "READY"
                                                  for h in cloud.hosts()), 30)
        started = time.monotonic()
        drained = cloud.run("host", "drain", source, "--parallel", str(parallel), timeout=900)
        took = time.monotonic() - started
        if drained.returncode != 0:
            raise RuntimeError(f"drain of {source} failed: {drained.stdout} {drained.stderr}")
        audited = cloud.run("audit")
        if audited.returncode != 0:
            raise RuntimeError(f"audit after the drain of {source}: {audited.stdout}")
        return took

    try:
        agent("a", "qemu:///system", first_from_second, "clean-traffic")
        agent("b", second_uri, second_uri, "")
        cloud.run("host", "disable", "b")
        placed = cloud.run("schedule", "resources=VCPU:1,MEMORY_MB:128,DISK_GB:1", "--image", "tiny", "--count",
                           str(args.guests), "--wait", "--timeout", "300", timeout=400)
        if placed.returncode != 0:
            raise RuntimeError(f"schedule failed: {placed.stdout} {placed.stderr}")
        uuids = [line.split()[-1] for line in placed.stdout.splitlines() if line.startswith("NOTIFIED")]
        cloud.run("host", "enable", "b")
        wait_until("b READY", lambda: any(h["name"] == "b" and h["status"] == "READY" for h in cloud.hosts()), 30)
        singles = []
        for _ in range(args.rounds):
            for target in ("b", "a"):
                started = time.monotonic()
                moved = cloud.run("migrate", uuids[0], "--host", target, timeout=300)
                if moved.returncode != 0:
                    raise RuntimeError(f"migrate failed: {moved.stderr}")
                singles.append(time.monotonic() - started)
        colds, resizes = [], []
        for round_number in range(args.rounds):
            for target in ("b", "a"):
                started = time.monotonic()
                moved = cloud.run("migrate", uuids[0], "--host", target, "--cold", timeout=300)
                if moved.returncode != 0:
                    raise RuntimeError(f"migrate --cold failed: {moved.stderr}")
                colds.append(time.monotonic() - started)
            started = time.monotonic()
            resized = cloud.run("resize", uuids[0], f"resources=VCPU:1,MEMORY_MB:128,DISK_GB:{round_number + 2}",
                                "--host", "a", timeout=300)
            if resized.returncode != 0:
                raise RuntimeError(f"resize failed: {resized.stderr}")
            resizes.append(time.monotonic() - started)
        results = {1: [], args.guests: []}
        for _ in range(args.rounds):
            for parallel in results:
                results[parallel].append(drain("a", "b", parallel))
                results[parallel].append(drain("b", "a", parallel))
        print(f"one live move (toyvm migrate): {min(singles):.1f} / {statistics.median(singles):.1f} / "
              f"{max(singles):.1f} s (min / median / max of {len(singles)})")
        print(f"one cold move of a running guest (migrate --cold): {min(colds):.1f} / {statistics.median(colds):.1f} / "
              f"{max(colds):.1f} s (min / median / max of {len(colds)})")
        print(f"one resize on its own host: {min(resizes):.1f} / {statistics.median(resizes):.1f} / "
              f"{max(resizes):.1f} s (min / median / max of {len(resizes)})")
        for parallel, times in results.items():
            print(f"drain of {args.guests} running guests, --parallel {parallel}: {min(times):.1f} / "
                  f"{statistics.median(times):.1f} / {max(times):.1f} s (min / median / max of {len(times)})")
    finally:
        for line in cloud.run("show").stdout.splitlines()[1:]:
            cloud.run("destroy", line.split()[0])
        cloud.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
