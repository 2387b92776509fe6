#!/usr/bin/python3
"""A project member's schedule through the scheduler service against the cloud admin's direct
schedule, in one run on one cloud: etcd with TLS, client certificates and its auth on (the
admin is root, the member a user of its own with the project's role; both sign in by
certificate), Placement on sqlite, AGENTS agents on libvirt's test driver, one `toyvm
scheduler` (its debug log, each batch's steps timed, kept in a failed run's directory). Each schedule is a `toyvm schedule` process, as a user runs it: SEQUENTIAL one after another for each path (p50,
p99), then 16 users at once making ROUNDS each (instances a second), every instance destroyed
between the paths; then `toyvm audit` clean and the project's use exact.

And the batching path against Placement's ceiling, in the same run: USERS members at once
asking the service for one instance after another (`toyvm-bench members`: kept-alive
connections, no process per schedule), against the same number of loops each claiming one
instance at a time straight from Placement (`toyvm-bench floor`: GET candidates, PUT the
claim, one etcd write: Placement's one-claim-at-a-time ceiling).

With --postgresql, Placement runs on PostgreSQL with WORKERS workers (as `bench.sh --scale`
runs it) instead of sqlite with 2.

  usage: projects.py --build DIR [--agents 4] [--sequential 40] [--rounds 6] [--users 16] [--claims 480]
                     [--postgresql] [--placement-workers 4] [--batching-only] [--keep]
"""

import argparse
import concurrent.futures
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testbed"))
from cloud import Cloud, wait_until  # noqa: E402

# No disk: each agent's test driver pools 100 GiB, fewer than the instances a measure places.
QUERY = "resources=VCPU:1,MEMORY_MB:64"
# The same as the service asks Placement: with the traits toyvm adds (its hosts, none disabled).
FLOOR_QUERY = QUERY + "&required=CUSTOM_TOYVM_HOST&required=!COMPUTE_STATUS_DISABLED"
INVENTORY = "VCPU:4000,MEMORY_MB:1024000,DISK_GB:100000"


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--sequential", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--claims", type=int, default=480, help="instances in each rate measure against the ceiling")
    parser.add_argument("--postgresql", action="store_true", help="Placement on PostgreSQL, not sqlite")
    parser.add_argument("--placement-workers", type=int, default=None, help="Placement's workers (2; 4 on PostgreSQL)")
    parser.add_argument("--batching-only", action="store_true", help="only the batching path against the ceiling")
    parser.add_argument("--keep", action="store_true", help="keep the working directory and its logs")
    args = parser.parse_args()
    workers = args.placement_workers or (4 if args.postgresql else 2)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="toyvm-projects-"))
    cloud = Cloud(pathlib.Path(args.build), workdir, etcd_secure=True, postgresql=args.postgresql,
                  placement_workers=workers)
    ok = False
    try:
        for i in range(args.agents):
            cloud.start_agent(f"h{i}", INVENTORY)
        wait_until("every agent", lambda: sum(h["alive"] for h in cloud.hosts()) == args.agents, 120)
        cloud.spawn("scheduler", [cloud.toyvm, "-v", "scheduler"], cloud.env)
        for command in (["project", "create", "bench"], ["project", "add-member", "bench", "alice"]):
            done = cloud.run(*command)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)}: {done.stderr}")
        member = ["--config", str(cloud.member_config("alice"))]
        # The admin signs in as the member does, by certificate (root's): a password's bcrypt
        # costs every process tens of milliseconds, which would be measured instead.
        admin = ["--config", str(cloud.member_config("root"))]
        # (before the command, after it)
        paths = {"admin, direct": (admin, ["--project", "bench"]), "member, through the service": (member, [])}

        def schedule(extra):
            started = time.monotonic()
            done = cloud.run(*extra[0], "schedule", QUERY, *extra[1])
            if done.returncode != 0:
                raise RuntimeError(f"schedule {extra}: exit {done.returncode}: {done.stderr}")
            return time.monotonic() - started

        def destroy_all():
            uuids = [i["uuid"] for i in cloud.instances()]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                refused = [done for done in pool.map(lambda uuid: cloud.run("destroy", uuid, "--no-wait"), uuids)
                           if done.returncode != 0]
            if refused:
                raise RuntimeError(f"{len(refused)} destroy(s) refused, the first: {refused[0].stderr}")
            wait_until("every instance gone", lambda: not cloud.instances(), 300)

        results = {}
        for name, extra in ({} if args.batching_only else paths).items():
            schedule(extra)  # warm: the first pays for the caches
            seq = [schedule(extra) for _ in range(args.sequential)]
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(args.users) as pool:
                list(pool.map(lambda _: schedule(extra), range(args.users * args.rounds)))
            wall = time.monotonic() - started
            results[name] = (statistics.median(seq), percentile(seq, 99), args.users * args.rounds / wall)
            destroy_all()
        if results:
            print(f"{'path':<30} {'p50 ms':>8} {'p99 ms':>8} {f'at {args.users}, /s':>12}")
            for name, (p50, p99, rate) in results.items():
                print(f"{name:<30} {p50 * 1000:8.1f} {p99 * 1000:8.1f} {rate:12.1f}")
            (a50, _, arate), (m50, _, mrate) = results.values()
            print(f"member / admin: p50 x{m50 / a50:.2f}, throughput x{mrate / arate:.2f}")

        bench = str(pathlib.Path(args.build) / "contrib" / "bench" / "toyvm-bench")
        common = ["--placement", cloud.placement_url, "--etcd", cloud.etcd_url,
                  "--concurrency", str(args.users), "--count", str(args.claims)]

        def rate(mode, *extra):
            done = subprocess.run([bench, mode, *common, *extra], capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"toyvm-bench {mode}: exit {done.returncode}: {done.stderr[-2000:]}")
            measured = json.loads(done.stdout)
            return measured["ok"] / measured["wall_s"], percentile(measured["latencies_ms"], 50)

        # Ceiling and batching path twice each, alternating, so that neither has the quieter minutes.
        ceilings, batched = [], []
        for _ in range(2):
            ceilings.append(rate("floor", "--config", str(cloud.member_config("root")), "--release-after",
                                 "--query", FLOOR_QUERY))
            batched.append(rate("members", "--config", str(cloud.member_config("alice")), "--project", "bench",
                                "--query", QUERY))
            destroy_all()
        ceiling, batching = max(c[0] for c in ceilings), max(b[0] for b in batched)
        print(f"{args.users} at once, one instance each: Placement's one-claim ceiling "
              f"{' / '.join(f'{c[0]:.1f}' for c in ceilings)} inst/s (p50 {ceilings[-1][1]:.1f} ms); through the "
              f"service's batches {' / '.join(f'{b[0]:.1f}' for b in batched)} inst/s (p50 {batched[-1][1]:.1f} ms): "
              f"x{batching / ceiling:.2f} of the ceiling (the best of each)")
        audit = cloud.run("audit")
        used = cloud.run("project", "show", "bench", "--json")
        print(f"audit exit {audit.returncode}; project bench after destroying all: {used.stdout.strip()}")
        ok = audit.returncode == 0 and '"instances":0' in used.stdout
    finally:
        cloud.finish(ok and not args.keep)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
