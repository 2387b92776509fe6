#!/usr/bin/python3
"""toyvm's benchmark: where toyvm stands against Placement's own limit.

Starts a private etcd and Placement on loopback and compute agents on libvirt's test driver
(the testbed, contrib/testbed/cloud.py), and measures in one run: the raw floor (candidates +
claim + etcd Txn on kept-alive connections), one `toyvm schedule` process, throughput at
several concurrencies against Placement's ceiling for the same request mix, schedule -> ACTIVE
latency and the agent's CPU and memory, conflicts and overbooking under 16 concurrent
schedulers, candidate latency at 10, 100 and 1,000 providers, the metadata service, and real
TCG guests through qemu:///system (schedule -> ACTIVE with an IP, one at a time and four at
once). Prints a table, writes JSON and draws PNG plots with gnuplot.

    contrib/bench/run.py [--quick] [--only-guests | --no-guests] [--kvm] [--out DIR]
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import re
import tempfile
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "contrib" / "testbed"))
from cloud import Cloud, free_port, wait_until  # noqa: E402
# No disk: the agents run on libvirt's test driver, whose storage pool holds 100 GiB, so
# thousands of 1 GiB disks would fail their builds (and send them from host to host).
QUERY = "resources=VCPU:1,MEMORY_MB:64"
BIG = "VCPU:100000,MEMORY_MB:100000000,DISK_GB:1000000"
SINGLE_BLOCK = 20  # one schedule at a time: the sides alternate this many at a time
ENABLED_ONLY = "required=!COMPUTE_STATUS_DISABLED"  # what `toyvm schedule` adds to every query
LEASES = "/var/lib/libvirt/dnsmasq/virbr0.status"  # the default network's leases


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values):
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "n": len(values)}


def merged(samples):
    """One measurement out of several runs of the same mode: lists joined, counts added."""
    out = {}
    for sample in samples:
        for key, value in sample.items():
            if isinstance(value, list):
                out.setdefault(key, []).extend(value)
            elif isinstance(value, dict):
                counts = out.setdefault(key, {})
                for k, v in value.items():
                    counts[k] = counts.get(k, 0) + v
            elif isinstance(value, (int, float)):
                out[key] = out.get(key, 0) + value
    return out


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
            bench.measure("floor", "--count", "20")

            schedule = [bench.toyvm, "--etcd", bench.etcd_url, "--placement", bench.placement_url, "schedule", QUERY]
            # The floor's requests from a process each, started as `toyvm schedule` starts, with
            # the filter toyvm adds: what any one-shot command on these libraries pays.
            process_floor = [bench.bench, "floor", "--etcd", bench.etcd_url, "--placement", bench.placement_url,
                             "--count", "1", "--start-like-schedule", "--query", QUERY + "&" + ENABLED_ONLY]
            single = alternated(bench, n_single, 1, {"floor": ("floor", []),
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
                sides = {"floor": ("floor", [])}
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


class Scheduled:
    """One `toyvm schedule --wait` in the background, with the time each line arrived."""

    def __init__(self, bench, args):
        self.start = time.monotonic()
        self.wall_start = time.time()
        self.proc = subprocess.Popen([bench.toyvm, "schedule", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=bench.env)
        self.lines = []
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic() - self.start, line.strip(), time.time()))
        self.proc.wait()

    def result(self, bench, agent_log):
        self.thread.join()
        if self.proc.returncode != 0:
            raise SystemExit(f"bench: schedule failed ({self.proc.returncode}): {self.proc.stderr.read()}")
        uuid = next(l.rsplit(" ", 1)[1] for _, l, _ in self.lines if l.startswith("NOTIFIED TARGET"))
        active = next(t for t, l, _ in self.lines if l == f"INSTANCE {uuid} ACTIVE")
        with_ip, wall = next((t, w) for t, l, w in self.lines if l.startswith(f"INSTANCE {uuid} ACTIVE "))
        # dnsmasq rewrites its lease file when it hands out a lease: from then until the line
        # above is toyvm's (the agent's poll, its etcd write, the watch to `schedule`).
        leased = os.stat(LEASES).st_mtime
        # The guest prints its uptime when DHCP answers: the boot's part of the wait.
        def lease_uptime():
            found = re.search(r"address \S+ at uptime ([0-9.]+)", bench.run("show", uuid, "--console").stdout)
            return float(found.group(1)) if found else None
        wait_until("the guest's address on its console", lease_uptime, timeout=60)
        uptime = lease_uptime()
        discovery = wall - leased
        return {"uuid": uuid, "active_s": active, "ip_s": with_ip, "guest_uptime_at_lease_s": uptime,
                "address_discovery_s": discovery, "toyvm_share_s": active + discovery,
                "qemu_and_firmware_s": with_ip - active - discovery - uptime,
                "steps_s": self.steps(uuid, agent_log)}

    def steps(self, uuid, agent_log):
        """schedule -> ACTIVE step by step, from the lines' arrival and the agent's `-v` log."""
        logged = {}
        for line in agent_log.read_text(errors="replace").splitlines():
            if f"instance {uuid}: " not in line:
                continue
            stamp, _, text = line.split(" ", 2)
            at = datetime.datetime.fromisoformat(stamp).timestamp()
            event = text.split(": ", 1)[1]
            for key in ("building", "disk", "active"):
                if event.startswith(key):
                    logged.setdefault(key, (at, event))
        wall = {l.split(",")[0] if l.startswith("NOTIFIED") else l: w for _, l, w in self.lines}
        notified, active = wall["NOTIFIED TARGET"], wall[f"INSTANCE {uuid} ACTIVE"]
        disk, define, start = (float(ms) / 1000 for ms in re.findall(r"([0-9.]+) ms", logged["disk"][1]))
        return {"claim_and_handover": notified - self.wall_start,
                "to_the_agent": logged["building"][0] - notified,
                "disk": disk, "define": define, "start": start,
                "active_to_schedule": active - logged["active"][0]}


def measure_guests(bench, rounds, kvm):
    """schedule -> ACTIVE with an IP for real guests under TCG: one at a time, then four at once;
    with `kvm`, one at a time under KVM too."""
    subprocess.run([str(ROOT / "contrib" / "start-libvirtd.sh")], check=True)
    images = bench.dir / "images"
    subprocess.run([str(ROOT / "contrib" / "tiny-guest.sh"), str(images / "tiny")], check=True,
                   stdout=subprocess.DEVNULL)
    os.chmod(bench.dir, 0o755)
    os.chmod(images, 0o755)

    def start_agent(name, domain_type):
        config = bench.dir / f"{name}.toml"
        config.write_text(f"[compute]\nlibvirt_uri = 'qemu:///system'\ndomain_type = '{domain_type}'\n"
                          f"image_dir = '{images}'\nnetwork = 'default'\nnic_model = 'e1000'\nstop_timeout = 0\n")
        trait = f"CUSTOM_BENCH_{name.upper()}"
        bench.start_agent(name, "VCPU:8,MEMORY_MB:4096,DISK_GB:40", config, ("--trait", trait), libvirt_uri=None,
                          verbose=True)
        wait_until(f"compute {name} on qemu:///system", lambda: f"{name} " in bench.run("show", "--hosts").stdout,
                   timeout=90)
        query = f"resources=VCPU:1,MEMORY_MB:128,DISK_GB:1&required={trait}"
        return [query, "--image", "tiny", "--wait", "--timeout", "300"], bench.dir / f"{name}.log"

    def destroy(rows):
        for row in rows:
            subprocess.run([bench.toyvm, "destroy", row["uuid"]], env=bench.env, capture_output=True, check=True)

    def one_at_a_time(args, log):
        rows = []
        for _ in range(rounds):
            rows.append(Scheduled(bench, args).result(bench, log))
            destroy(rows[-1:])
        return rows

    median = lambda rows, key: statistics.median(r[key] for r in rows)
    keys = ("active_s", "ip_s", "guest_uptime_at_lease_s", "address_discovery_s", "toyvm_share_s",
            "qemu_and_firmware_s")
    summarise = lambda rows: {**{k: median(rows, k) for k in keys},
                              "steps_s": {step: statistics.median(r["steps_s"][step] for r in rows)
                                          for step in rows[0]["steps_s"]}}
    results = {"libvirt_start_s": libvirt_start_floor(bench.dir, rounds)}
    try:
        args, log = start_agent("tcg", "qemu")
        one = one_at_a_time(args, log)
        together = [Scheduled(bench, args) for _ in range(4)]
        four = [s.result(bench, log) for s in together]
        destroy(four)
        results.update({"single": summarise(one), "single_rounds": one, "four": summarise(four),
                        "four_slowest_ip_s": max(r["ip_s"] for r in four), "four_rounds": four})
        if kvm:
            rows = one_at_a_time(*start_agent("kvm", "kvm"))
            results.update({"kvm_single": summarise(rows), "kvm_single_rounds": rows})
    finally:  # no guest outlives the benchmark, even a failed one
        for line in bench.run("show").stdout.splitlines()[1:]:
            subprocess.run([bench.toyvm, "destroy", line.split()[0]], env=bench.env, capture_output=True)
    return results


def libvirt_start_floor(workdir, rounds):
    """What a start costs without toyvm, in the same run (medians, seconds): libvirt's
    virDomainCreate of a bare domain (128 MB, one vCPU, an e1000 NIC on `default`, no disk)
    with no filter and with `clean-traffic` and DHCP learning, toyvm's default guest_filter,
    interleaved, timed by virsh itself (`--timing`, its own start-up left out); and QEMU alone,
    from exec to its monitor answering `quit`, with the same machine and NIC."""
    uri = "qemu:///system"
    learning = ("<filterref filter='clean-traffic'>"
                "<parameter name='CTRL_IP_LEARNING' value='dhcp'/></filterref>")
    names = {kind: f"toyvm-bench-{kind.replace('_', '-')}-{os.getpid()}" for kind in ("no_filter", "clean_traffic")}
    times = {kind: [] for kind in (*names, "qemu_alone")}
    try:
        for kind, filterref in (("no_filter", ""), ("clean_traffic", learning)):
            xml = workdir / f"{names[kind]}.xml"
            xml.write_text(f"<domain type='qemu'><name>{names[kind]}</name><memory unit='MiB'>128</memory>"
                           "<vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type></os><devices>"
                           f"<interface type='network'><source network='default'/><model type='e1000'/>"
                           f"{filterref}</interface><serial type='pty'/></devices></domain>")
            subprocess.run(["virsh", "-c", uri, "define", str(xml)], check=True, capture_output=True)
        for _ in range(rounds):
            for kind, name in names.items():
                out = subprocess.run(["virsh", "-t", "-c", uri, "start", name], check=True, capture_output=True,
                                     text=True).stdout
                times[kind].append(float(re.search(r"\(Time: ([0-9.]+) ms\)", out).group(1)) / 1000)
                subprocess.run(["virsh", "-c", uri, "destroy", name], check=True, capture_output=True)
            started = time.monotonic()
            subprocess.run(["qemu-system-x86_64", "-machine", "pc,accel=tcg", "-m", "128", "-S", "-display", "none",
                            "-nodefaults", "-netdev", "user,id=n0", "-device", "e1000,netdev=n0", "-monitor", "stdio"],
                           input="quit\n", check=True, capture_output=True, text=True)
            times["qemu_alone"].append(time.monotonic() - started)
    finally:
        for name in names.values():
            subprocess.run(["virsh", "-c", uri, "destroy", name], capture_output=True)
            subprocess.run(["virsh", "-c", uri, "undefine", name], capture_output=True)
    return {kind: statistics.median(values) for kind, values in times.items()}


def report(results):
    lines = [f"machine: {results['machine']['cpus']} cpus, {results['machine']['cpu']}", ""]
    if "guests" in results:
        g = results["guests"]
        rows = [(f"one at a time ({len(g['single_rounds'])} rounds)", g["single"]),
                (f"four at once (slowest {g['four_slowest_ip_s']:.2f})", g["four"])]
        if "kvm_single" in g:
            rows.append((f"KVM, one at a time ({len(g['kvm_single_rounds'])} rounds)", g["kvm_single"]))
        lines += [
            "| real guest (tiny-guest), medians in s | schedule -> ACTIVE with IP | of which toyvm: "
            "schedule -> ACTIVE | toyvm: lease -> IP shown | guest: kernel boot to DHCP lease | "
            "QEMU start + firmware | toyvm's share |",
            "|---|---|---|---|---|---|---|",
            *[f"| {label} | {r['ip_s']:.2f} | {r['active_s']:.2f} | {r['address_discovery_s']:.2f} | "
              f"{r['guest_uptime_at_lease_s']:.2f} | {r['qemu_and_firmware_s']:.2f} | "
              f"{r['toyvm_share_s'] / r['ip_s'] * 100:.1f}% |"
              for label, r in rows],
            "",
            "| schedule -> ACTIVE by step, medians in s | claim + hand-over (schedule process) | to the agent "
            "(watch) | disk overlay | define | start | ACTIVE to schedule (etcd write + watch) |",
            "|---|---|---|---|---|---|---|",
            *[f"| {label} | " + " | ".join(f"{r['steps_s'][k]:.3f}" for k in (
                "claim_and_handover", "to_the_agent", "disk", "define", "start", "active_to_schedule")) + " |"
              for label, r in rows],
            "",
        ]
        if "libvirt_start_s" in g:
            floor, start = g["libvirt_start_s"], g["single"]["steps_s"]["start"]
            lines += [
                "| a start without toyvm, medians in s | QEMU alone (exec to `quit`) | libvirt, bare domain, "
                "no filter | libvirt, bare domain, clean-traffic + DHCP learning | toyvm's start step | "
                "toyvm: schedule -> ACTIVE above the latter floor |",
                "|---|---|---|---|---|---|",
                f"| one at a time | {floor['qemu_alone']:.3f} | {floor['no_filter']:.3f} | "
                f"{floor['clean_traffic']:.3f} | {start:.3f} | "
                f"{g['single']['active_s'] - floor['clean_traffic']:.3f} |",
                "",
            ]
    if "floor_ms" not in results:
        return "\n".join(lines)
    return "\n".join(lines + report_scheduling(results))


def report_scheduling(results):
    f, s = results["floor_ms"], results["schedule_ms"]

    def by_round(rounds):
        return ([f"| the same, round by round ({len(rounds)} rounds of {SINGLE_BLOCK} each): middle half | "
                 f"{percentile(rounds, 25) * 100:+.1f}% to {percentile(rounds, 75) * 100:+.1f}% | |"]
                if rounds else [])

    lines = [
        "| measure | p50 | p99 |",
        "|---|---|---|",
        f"| raw floor: candidates + claim + etcd Txn (ms) | {f['p50']:.2f} | {f['p99']:.2f} |",
        *([f"| the floor as one process per instance, started as `schedule` starts (ms) | "
           f"{p['p50']:.2f} | {p['p99']:.2f} |",
           f"| process floor above the floor | {results['process_floor_overhead'] * 100:+.1f}% | |",
           *by_round(results["process_floor_overhead_rounds"])]
          if (p := results.get("process_floor_ms")) else []),
        f"| one `toyvm schedule` process (ms) | {s['p50']:.2f} | {s['p99']:.2f} |",
        f"| schedule overhead above the floor | {results['schedule_overhead'] * 100:+.1f}% | |",
        *by_round(results.get("schedule_overhead_rounds")),
        *([f"| schedule above the process floor | {s['p50'] / p['p50'] * 100 - 100:+.1f}% | |"] if p else []),
        f"| work -> ACTIVE on the test driver (ms; {results['active_failed']} of the builds failed) | "
        f"{results['active_ms']['p50']:.2f} | {results['active_ms']['p99']:.2f} |",
        "",
        "| concurrency | toyvm inst/s | Placement ceiling inst/s | fraction | the process floor's fraction "
        "| toyvm p50 / p99 ms | 409s | extra attempts per success |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["throughput"]:
        lat = row["toyvm_latency_ms"]
        process = f"{row['process_floor_fraction'] * 100:.0f}%" if "process_floor_fraction" in row else ""
        lines.append(f"| {row['concurrency']} | {row['toyvm_per_s']:.1f} | {row['ceiling_per_s']:.1f} | "
                     f"{row['fraction_of_ceiling'] * 100:.0f}% | {process} | {lat['p50']:.1f} / {lat['p99']:.1f} | "
                     f"{row['conflicts_409']} | {row['extra_attempts_per_success']:.3f} |")
    groups = ("placement", "etcd", "agents", "client")
    lines += [
        "",
        "| concurrency | CPU ms per instance | Placement | etcd | agents | client processes | all | etcd Txns per instance |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {row['concurrency']} | {side.replace('_', ' ')} | " + " | ".join(f"{row['cpu_ms_per_instance'][side][g]:.1f}" for g in groups)
          + f" | {sum(row['cpu_ms_per_instance'][side][g] for g in groups):.1f}"
          + f" | {row['etcd_txns_per_instance'][side]:.2f} |"
          for row in results["throughput"] for side in row["cpu_ms_per_instance"]],
    ]
    if single := results.get("single_cpu_ms_per_instance"):
        lines += [
            "",
            "| one at a time (the p50 rows above) | CPU ms per instance | Placement | etcd | agents | client processes | all |",
            "|---|---|---|---|---|---|---|",
            *[f"| | {side.replace('_', ' ')} | " + " | ".join(f"{cpu[g]:.1f}" for g in groups)
              + f" | {sum(cpu[g] for g in groups):.1f} |" for side, cpu in single.items()],
        ]
    agent, batch = results["agent"], results["batch"]
    lines += [
        "",
        f"batch: one `toyvm schedule --count {batch['instances']}` process: {batch['per_s']:.1f} inst/s, "
        f"{batch['fraction_of_ceiling_16'] * 100:.0f}% of the ceiling at concurrency 16",
        *[f"saturation (host_subset_size {sat['host_subset_size']}): {sat['attempts']} schedules by 16 processes "
          f"for {sat['slots']} slots: {sat['succeeded']} succeeded, {sat['no_allocations']} NO ALLOCATIONS LEFT, "
          f"{sat['conflicts_409']} conflicts (409)" for sat in results["saturation"]],
        f"overbooked providers after everything: {results['overbooked_providers']}",
        f"agent: CPU {agent['cpu_ms_per_instance']:.3f} ms per instance",
        "",
        "| memory (MB) | RSS | PSS | RSS above the floor as it starts | RSS above the floor, its pages given back "
        "| PSS above the latter |",
        "|---|---|---|---|---|---|",
        *[f"| {label} | {rss / 1024:.1f} | {pss / 1024:.1f} | "
          + (f"{(rss - floor[0]) / 1024:+.1f} | {(rss - floor[1]) / 1024:+.1f} | {(pss - floor[2]) / 1024:+.1f} |"
             if floor else "| | |")
          for label, rss, pss, floor in (
              ("floor: a bare libvirt connection (test:///default)", agent["floor_rss_kb"], agent["floor_pss_kb"],
               None),
              ("floor: the same, its start-up pages given back as the agent does", agent["floor_released_rss_kb"],
               agent["floor_released_pss_kb"], None),
              (f"agent, idle (median over {agent['idle_window_s'][0]}-{agent['idle_window_s'][1]} s after start; "
               f"the largest {agent['idle_max_rss_kb'] / 1024:.1f})", agent["idle_rss_kb"], agent["idle_pss_kb"],
               (agent["floor_rss_kb"], agent["floor_released_rss_kb"], agent["floor_released_pss_kb"])),
              (f"floor holding {agent['instances']} of the agent's domains", agent["floor_busy_rss_kb"],
               agent["floor_busy_pss_kb"], None),
              ("floor: the same, its pages given back", agent["floor_busy_released_rss_kb"],
               agent["floor_busy_released_pss_kb"], None),
              (f"agent with {agent['instances']} instances, right after building them", agent["rss_kb"],
               agent["pss_kb"], (agent["floor_busy_rss_kb"], agent["floor_busy_released_rss_kb"],
                                 agent["floor_busy_released_pss_kb"])),
              (f"agent with {agent['instances']} instances, quiet for a few seconds", agent["settled_rss_kb"],
               agent["settled_pss_kb"], (agent["floor_busy_rss_kb"], agent["floor_busy_released_rss_kb"],
                                         agent["floor_busy_released_pss_kb"])))],
        "",
        "| providers | candidates limit=50 p50 ms | no limit p50 ms | toyvm decision limit=50 ms | no limit ms |",
        "|---|---|---|---|---|",
    ]
    md = results["mdserver"]
    lines_md = [
        "",
        f"mdserver: {md['requests_per_s']:.0f} requests/s for meta_data.json, p50 {md['p50_ms']:.3f} ms, "
        f"p99 {md['p99_ms']:.3f} ms ({md['tool']}, {md['non_2xx']} non-2xx); "
        f"RSS {md['rss_kb'] / 1024:.1f} MB with {md['guests']} guests indexed",
    ]
    for row in results["scale"]:
        lines.append(f"| {row['providers']} | {row['candidates_limit50_ms']['p50']:.1f} | "
                     f"{row['candidates_nolimit_ms']['p50']:.1f} | {row['decision_limit50_ms']['p50']:.3f} | "
                     f"{row['decision_nolimit_ms']['p50']:.3f} |")
    return lines + lines_md


def plot(results, out):
    if not shutil.which("gnuplot"):
        print("bench: gnuplot not found, no plots", file=sys.stderr)
        return
    data = out / "concurrency.dat"
    data.write_text("".join(f"{r['concurrency']} {r['toyvm_latency_ms']['p50']} {r['toyvm_latency_ms']['p99']} "
                            f"{r['floor_latency_ms']['p50']} {r['floor_latency_ms']['p99']}\n"
                            for r in results["throughput"]))
    scale = out / "providers.dat"
    scale.write_text("".join(f"{r['providers']} {r['candidates_limit50_ms']['p50']} "
                             f"{r['candidates_nolimit_ms']['p50']}\n" for r in results["scale"]))
    script = f"""
set terminal pngcairo size 800,500 noenhanced
set grid
set key left top
set output '{out}/latency-vs-concurrency.png'
set title 'Schedule latency against concurrency'
set xlabel 'concurrent schedulers'
set ylabel 'ms'
set logscale x 2
plot '{data}' using 1:2 with linespoints title 'toyvm schedule p50', \\
     '{data}' using 1:3 with linespoints title 'toyvm schedule p99', \\
     '{data}' using 1:4 with linespoints title 'raw floor p50', \\
     '{data}' using 1:5 with linespoints title 'raw floor p99'
unset logscale x
set output '{out}/latency-vs-providers.png'
set title 'GET /allocation_candidates latency against providers'
set xlabel 'resource providers'
set logscale x 10
plot '{scale}' using 1:2 with linespoints title 'limit=50 p50', \\
     '{scale}' using 1:3 with linespoints title 'no limit p50'
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


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
    text = report(results)
    (args.out / "report.md").write_text(text + "\n")
    print(text)
    print(f"\nwritten: {args.out}/results.json, report.md, latency-vs-concurrency.png, latency-vs-providers.png")


if __name__ == "__main__":
    main()
