#!/usr/bin/python3
"""toyvm's benchmark: where toyvm stands against Placement's own limit.

Starts a private etcd and Placement on loopback and compute agents on libvirt's test driver
(the testbed, contrib/testbed/cloud.py), and measures in one run: the raw floor (candidates +
claim + etcd Txn on kept-alive connections), one `toyvm schedule` process, throughput at
several concurrencies against Placement's ceiling for the same request mix, schedule -> ACTIVE
latency and the agent's CPU and memory, conflicts and overbooking under 16 concurrent
schedulers, candidate latency at 10, 100 and 1,000 providers, the metadata service, and real
TCG guests through qemu:///system (schedule -> ACTIVE with an IP, one at a time and four at
once). Prints a table, writes JSON and draws PNG plots with gnuplot. The real guests are
measured in guests.py, the tables and plots drawn in report.py.

    contrib/bench/run.py [--quick] [--only-guests | --no-guests] [--kvm] [--out DIR]
"""

import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "contrib" / "testbed"))
from cloud import Cloud, free_port, wait_until  # noqa: E402
from guests import measure_guests  # noqa: E402
from report import plot, report  # noqa: E402
from procs import cpu_seconds, idle_memory, libvirt_floor, proc_stat, pss_kb  # noqa: E402
from stats import merged, percentile, summary  # noqa: E402
# No disk: the agents run on libvirt's test driver, whose storage pool holds 100 GiB, so
# thousands of 1 GiB disks would fail their builds (and send them from host to host).
QUERY = "resources=VCPU:1,MEMORY_MB:64"
BIG = "VCPU:100000,MEMORY_MB:100000000,DISK_GB:1000000"
SINGLE_BLOCK = 20  # one schedule at a time: the sides alternate this many at a time
# What `toyvm schedule` adds to every query (toyvm's hosts only, none disabled): the floors ask
# the same of Placement.
FLOOR_QUERY = QUERY + "&required=CUSTOM_TOYVM_HOST&required=!COMPUTE_STATUS_DISABLED"


def alternated(bench, count, concurrency, sides, block):
    """Each side at one concurrency, `count` each, in blocks of `block`, the sides in their order
    in even rounds and reversed in odd ones (A, B, B, A, ...). Placement slows down as
    allocations pile up, and this machine's pace changes from one second to the next: short
    blocks, alternated, let every side meet the same of it. `sides` maps a name to a
    toyvm-bench mode and its arguments. Each side gets `cpu_ms`: CPU per instance of Placement,
    etcd, the agents and the client processes; each but the first gets `rounds`, its p50 over
    the first side's in each round of one block each."""
    runs = {name: [] for name in sides}
    rounds = {name: [] for name in sides}
    order = list(sides)
    for round_ in range(max(1, count // block)):
        p50 = {}
        for name in order if round_ % 2 == 0 else reversed(order):
            mode, args = sides[name]
            before, txns_before = bench.cpu_seconds(), bench.etcd_txns()
            sample = bench.measure(mode, "--count", str(block), "--concurrency", str(concurrency), *args)
            after = bench.cpu_seconds()
            sample["cpu_s"] = {k: after[k] - before[k] for k in after}
            sample["etcd_txns"] = bench.etcd_txns() - txns_before
            runs[name].append(sample)
            p50[name] = percentile(sample["latencies_ms"], 50)
        for name in order[1:]:
            rounds[name].append(p50[name] / p50[order[0]] - 1)
    out = {name: merged(samples) for name, samples in runs.items()}
    for name, side in out.items():
        instances = max(1, side.get("ok", len(side.get("latencies_ms", []))))
        side["cpu_ms"] = {k: v * 1000 / instances for k, v in side.pop("cpu_s").items()}
        side["etcd_txns_per_instance"] = side.pop("etcd_txns") / instances
        if name != order[0]:
            side["rounds"] = rounds[name]
    return out


class Bench(Cloud):
    """The testbed as the benchmark runs it (one etcd, Placement on sqlite), with what it
    measures: CPU, etcd's transactions, Placement's conflicts, and toyvm-bench's runs."""

    def __init__(self, build, workdir, placement_workers):
        dir = pathlib.Path(workdir)
        # toyvm as installed: a copy, written back to disk. A file just written by the linker sits
        # in the page cache in a state that costs each exec ~0.2 ms and cannot be paged out.
        (dir / "bin").mkdir(parents=True, exist_ok=True)
        toyvm = shutil.copy2(build / "toyvm" / "toyvm", dir / "bin" / "toyvm")
        # The same for toyvm-bench, which runs the floor as one process per instance too.
        self.bench = shutil.copy2(build / "contrib" / "bench" / "toyvm-bench", dir / "bin" / "toyvm-bench")
        os.sync()
        super().__init__(build, dir, placement_workers=placement_workers, toyvm=toyvm)

    def start_compute(self, name, inventory, extra=()):
        """An agent on the test driver, waited for: (its process, its provider)."""
        proc = self.start_agent(name, inventory, extra=extra)
        return proc, self.wait_agent(name)

    def measure(self, mode, *args, placement=None):
        out = subprocess.run([self.bench, mode, "--etcd", self.etcd_url, "--placement",
                              placement or self.placement_url, *args],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def cpu_seconds(self):
        """CPU used so far by Placement (uWSGI's master and workers), etcd, the compute agents, and
        the processes this driver ran and waited for (toyvm-bench and what it ran)."""
        groups = {"placement": 0.0, "etcd": 0.0, "agents": 0.0}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_text()
                if str(self.dir) not in cmdline:
                    continue
                group = ("placement" if cmdline.startswith("uwsgi") else "etcd" if cmdline.startswith("etcd")
                         else "agents" if "\0compute\0" in cmdline else None)
                if group:
                    groups[group] += cpu_seconds(pid)
            except OSError:
                continue  # it ended meanwhile
        own = os.times()
        groups["client"] = own.children_user + own.children_system
        return groups

    def etcd_txns(self):
        """Transactions etcd has answered so far (its gRPC server's counter)."""
        return sum(v for k, v in self.etcd_metrics().items()
                   if k.startswith("grpc_server_handled_total{") and 'grpc_method="Txn"' in k)

    def conflicts(self):
        """409 answers to claims so far, from Placement's request log."""
        text = self.placement_log.read_text(errors="replace") if self.placement_log.exists() else ""
        return sum(1 for line in text.splitlines() if '"PUT /allocations/' in line and "status: 409" in line)



def run(args):
    results = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                           "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                        if l.startswith("model name")), "?")},
               "command": " ".join(["contrib/bench/run.py", *sys.argv[1:]])}
    n_single = 80 if args.quick else 400
    n_throughput = 200 if args.quick else 1000
    n_active = 200 if args.quick else 1000
    with tempfile.TemporaryDirectory(prefix="toyvm-bench-") as workdir:
        if not args.no_guests:
            guests_dir = pathlib.Path(workdir) / "guests"
            guests_dir.mkdir()
            os.chmod(workdir, 0o755)  # QEMU's user reaches the guests' files through it
            bench = Bench(args.build, guests_dir, 1)
            try:
                results["guests"] = measure_guests(bench, 3 if args.quick else 5, args.kvm)
                print("bench: real guests done", file=sys.stderr)
            finally:
                bench.shutdown()
            if args.only_guests:
                return results
        bench = Bench(args.build, workdir, args.placement_workers)
        try:
            hosts = [bench.start_compute(f"host{i}", BIG)[1] for i in range(args.hosts)]
            results["hosts"] = len(hosts)
            print(f"bench: {len(hosts)} agents up; Placement with {args.placement_workers} workers", file=sys.stderr)

            # Warm Placement up so the first samples do not pay for imports and caches.
            bench.measure("floor", "--count", "20", "--query", FLOOR_QUERY)

            schedule = [bench.toyvm, "--etcd", bench.etcd_url, "--placement", bench.placement_url, "schedule", QUERY]
            # The floor's requests from a process each, started as `toyvm schedule` starts, with
            # the filter toyvm adds: what any one-shot command on these libraries pays.
            process_floor = [bench.bench, "floor", "--etcd", bench.etcd_url, "--placement", bench.placement_url,
                             "--count", "1", "--start-like-schedule", "--query", FLOOR_QUERY]
            single = alternated(bench, n_single, 1, {"floor": ("floor", ["--query", FLOOR_QUERY]),
                                                     "process_floor": ("exec", ["--", *process_floor]),
                                                     "toyvm": ("exec", ["--", *schedule])}, block=SINGLE_BLOCK)
            results["floor_ms"] = summary(single["floor"]["latencies_ms"])
            results["process_floor_ms"] = summary(single["process_floor"]["latencies_ms"])
            results["schedule_ms"] = summary(single["toyvm"]["latencies_ms"])
            results["schedule_overhead"] = results["schedule_ms"]["p50"] / results["floor_ms"]["p50"] - 1
            results["schedule_overhead_rounds"] = single["toyvm"]["rounds"]
            results["process_floor_overhead"] = results["process_floor_ms"]["p50"] / results["floor_ms"]["p50"] - 1
            results["process_floor_overhead_rounds"] = single["process_floor"]["rounds"]
            results["single_cpu_ms_per_instance"] = {name: side["cpu_ms"] for name, side in single.items()}
            print("bench: floor and single schedule done", file=sys.stderr)

            results["throughput"] = []
            for concurrency in (1, 4, 16):
                before = bench.conflicts()
                sides = {"floor": ("floor", ["--query", FLOOR_QUERY])}
                if concurrency == 16:  # what processes that only make the floor's requests reach
                    sides["process_floor"] = ("exec", ["--", *process_floor])
                sides["toyvm"] = ("exec", ["--", *schedule])
                measured = alternated(bench, n_throughput, concurrency, sides,
                                      block=n_throughput // (4 if concurrency == 16 else 10))
                ceiling, run_ = measured["floor"], measured["toyvm"]
                ok = run_["exit_codes"].get("0", 0)
                conflicts = bench.conflicts() - before
                row = {"concurrency": concurrency,
                       "toyvm_per_s": ok / run_["wall_s"],
                       "ceiling_per_s": ceiling["ok"] / ceiling["wall_s"],
                       "toyvm_latency_ms": summary(run_["latencies_ms"]),
                       "floor_latency_ms": summary(ceiling["latencies_ms"]),
                       "succeeded": ok, "failed": n_throughput - ok,
                       "conflicts_409": conflicts,
                       "extra_attempts_per_success": conflicts / ok if ok else float("nan"),
                       "cpu_ms_per_instance": {name: side["cpu_ms"] for name, side in measured.items()},
                       "etcd_txns_per_instance": {name: side["etcd_txns_per_instance"]
                                                  for name, side in measured.items()}}
                row["fraction_of_ceiling"] = row["toyvm_per_s"] / row["ceiling_per_s"]
                if process := measured.get("process_floor"):
                    row["process_floor_per_s"] = process["exit_codes"].get("0", 0) / process["wall_s"]
                    row["process_floor_fraction"] = row["process_floor_per_s"] / row["ceiling_per_s"]
                results["throughput"].append(row)
                print(f"bench: throughput at concurrency {concurrency} done", file=sys.stderr)

            # One process placing a whole batch: `toyvm schedule --count N`.
            batch = bench.measure("exec", "--count", "1", "--", bench.toyvm, "--etcd", bench.etcd_url,
                                  "--placement", bench.placement_url, "schedule", QUERY, "--count", str(n_throughput))
            ceiling16 = results["throughput"][-1]["ceiling_per_s"]
            results["batch"] = {"instances": n_throughput, "wall_s": batch["wall_s"],
                                "per_s": n_throughput / batch["wall_s"] if batch["exit_codes"].get("0") else 0.0,
                                "fraction_of_ceiling_16": (n_throughput / batch["wall_s"]) / ceiling16}
            print("bench: batch done", file=sys.stderr)

            # Saturation: 16 schedulers race for 100 slots on 4 hosts; exactly 100 may win. Run
            # once with host_subset_size 1 and once with 3, to see what randomising saves.
            results["saturation"] = []
            for subset in (1, 3):
                trait = f"CUSTOM_BENCH_SUBSET{subset}"
                for i in range(4):
                    bench.start_compute(f"small{subset}-{i}", "VCPU:25,MEMORY_MB:100000,DISK_GB:10000",
                                        ("--trait", trait))
                config = bench.dir / f"subset{subset}.toml"
                config.write_text(f"[schedule]\nhost_subset_size = {subset}\n")
                before = bench.conflicts()
                sat = bench.measure("exec", "--count", "150", "--concurrency", "16", "--", bench.toyvm,
                                    "--config", str(config), "--etcd", bench.etcd_url, "--placement",
                                    bench.placement_url, "schedule", QUERY + "&required=" + trait)
                results["saturation"].append({
                    "host_subset_size": subset, "attempts": 150, "slots": 100,
                    "succeeded": sat["exit_codes"].get("0", 0), "no_allocations": sat["exit_codes"].get("1", 0),
                    "conflicts_409": bench.conflicts() - before})
            results["overbooked_providers"] = len(bench.overbooked_providers())
            print("bench: saturation done", file=sys.stderr)

            # The agent on its own: idle memory, then 1,000 instances handed over through etcd.
            floor_rss, floor_pss = libvirt_floor(args.build, "test:///default")
            floor_released_rss, floor_released_pss = libvirt_floor(args.build, "test:///default", release=True)
            agent, agent_rp = bench.start_compute("agent", BIG)
            # Idle through its periodic jobs (the host's figures every 30 s, a resync a minute),
            # each followed by its pages given back once quiet: sampled twice a second.
            idle = idle_memory(agent.pid, start_s=6, end_s=36 if args.quick else 66)
            idle_cpu = proc_stat(agent.pid)[0]
            active = bench.measure("active", "--host", agent_rp, "--count", str(n_active))
            busy_cpu, busy_rss, busy_peak = proc_stat(agent.pid)
            busy_pss = pss_kb(agent.pid)
            time.sleep(6)  # quiet for 3 s, it hands the pages of the burst back
            settled_rss, settled_pss = proc_stat(agent.pid)[1], pss_kb(agent.pid)
            # The floor with as many domains, the agent's own XML.
            domain_xml = bench.dir / "domain.xml"
            domain_xml.write_text(subprocess.run(
                [bench.bench, "domain-xml", "--owner", agent_rp, "--instance-dir", str(bench.dir / "agent" / "instances")],
                capture_output=True, text=True, check=True).stdout)
            floor_busy_rss, floor_busy_pss = libvirt_floor(args.build, "test:///default", (domain_xml, n_active))
            floor_busy_released_rss, floor_busy_released_pss = libvirt_floor(
                args.build, "test:///default", (domain_xml, n_active), release=True)
            results["active_ms"] = summary(active["latencies_ms"])
            results["active_failed"] = active["failed"]
            results["agent"] = {"floor_rss_kb": floor_rss, "floor_pss_kb": floor_pss,
                                "floor_released_rss_kb": floor_released_rss, "floor_released_pss_kb": floor_released_pss,
                                "floor_busy_rss_kb": floor_busy_rss, "floor_busy_pss_kb": floor_busy_pss,
                                "floor_busy_released_rss_kb": floor_busy_released_rss,
                                "floor_busy_released_pss_kb": floor_busy_released_pss,
                                "idle_rss_kb": idle["rss_kb"], "idle_pss_kb": idle["pss_kb"],
                                "idle_max_rss_kb": idle["max_rss_kb"], "idle_window_s": idle["window_s"],
                                "instances": n_active, "rss_kb": busy_rss, "pss_kb": busy_pss,
                                "peak_rss_kb": busy_peak, "settled_rss_kb": settled_rss, "settled_pss_kb": settled_pss,
                                "cpu_ms_per_instance": (busy_cpu - idle_cpu) * 1000 / n_active}
            print("bench: agent done", file=sys.stderr)
        finally:
            bench.shutdown()

        # The metadata service: 10,000 guests indexed, 16 keep-alive clients (wrk).
        md_dir = pathlib.Path(workdir) / "mdserver"
        md_dir.mkdir()
        bench = Bench(args.build, md_dir, 1)
        try:
            results["mdserver"] = measure_mdserver(bench, 2000 if args.quick else 10000)
            print("bench: mdserver done", file=sys.stderr)
        finally:
            bench.shutdown()

        # Scale, on a Placement of its own so the providers above do not count.
        scale_dir = pathlib.Path(workdir) / "scale"
        scale_dir.mkdir()
        bench = Bench(args.build, scale_dir, args.placement_workers)
        try:
            results["scale"] = []
            have = 0
            for providers in (10, 100, 1000):
                bench.measure("providers", "--count", str(providers - have))
                have = providers
                samples = 20 if providers < 1000 else 10
                limited = bench.measure("candidates", "--count", str(samples), "--limit", "50")
                unlimited = bench.measure("candidates", "--count", str(samples), "--limit", "0")
                results["scale"].append({
                    "providers": providers,
                    "candidates_limit50_ms": summary(limited["latencies_ms"]),
                    "candidates_nolimit_ms": summary(unlimited["latencies_ms"]),
                    "decision_limit50_ms": summary(limited["decision_ms"]),
                    "decision_nolimit_ms": summary(unlimited["decision_ms"]),
                    "returned_nolimit": unlimited["candidates"]})
                print(f"bench: scale {providers} done", file=sys.stderr)
        finally:
            bench.shutdown()
    return results


def measure_mdserver(bench, guests):
    seeded = bench.measure("seed", "--count", str(guests))["written"]
    port = free_port()
    # The per-source rate limit would measure itself: wrk is one source.
    config = bench.dir / "mdserver.toml"
    config.write_text("[mdserver]\nrate_limit = 0\n")
    md = bench.spawn("mdserver", [bench.toyvm, "--config", str(config), "--etcd", bench.etcd_url, "mdserver",
                                  "--listen", f"127.0.0.1:{port}"])
    url = f"http://127.0.0.1:{port}/openstack/latest/meta_data.json"
    # One wrk thread: the server is one event loop, and a second load thread on a 2-core machine
    # would measure the kernel's scheduler, not the server.
    wait_until("mdserver", lambda: urllib.request.urlopen(url).status == 200)
    _, rss, _ = proc_stat(md.pid)
    out = subprocess.run(["wrk", "-t1", "-c16", "-d10s", "--latency", url], capture_output=True, text=True,
                         check=True).stdout

    def wrk_ms(label):
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0] == label:
                value = parts[1]
                for unit, factor in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
                    if value.endswith(unit):
                        return float(value[:-len(unit)]) * factor
        return float("nan")

    rate = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("Requests/sec"))
    errors = sum(int(n) for line in out.splitlines() if "Non-2xx" in line for n in line.split()[-1:])
    return {"guests": seeded, "rss_kb": rss, "requests_per_s": rate, "p50_ms": wrk_ms("50%"),
            "p99_ms": wrk_ms("99%"), "non_2xx": errors, "tool": "wrk -t1 -c16 -d10s --latency"}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples, for a fast look")
    parser.add_argument("--hosts", type=int, default=10, help="compute agents for the schedule runs")
    parser.add_argument("--placement-workers", type=int, default=2)
    parser.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "bench")
    parser.add_argument("--kvm", action="store_true",
                        help="real guests under KVM too (domain_type = 'kvm'; the host must run KVM guests)")
    guests = parser.add_mutually_exclusive_group()
    guests.add_argument("--only-guests", action="store_true", help="only the real-guest measurements")
    guests.add_argument("--no-guests", action="store_true", help="skip the real-guest measurements")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = run(args)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    if "scale" in results:
        plot(results, args.out)
    text = report(results, SINGLE_BLOCK)
    (args.out / "report.md").write_text(text + "\n")
    print(text)
    print(f"\nwritten: {args.out}/results.json, report.md, latency-vs-concurrency.png, latency-vs-providers.png")


if __name__ == "__main__":
    main()
