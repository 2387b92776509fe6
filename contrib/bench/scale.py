#!/usr/bin/python3
"""toyvm at scale: many agents on libvirt's test driver against Placement on PostgreSQL and a
3-member etcd. Starts every agent at once, places instances with several concurrent users,
each running `schedule --count BATCH_SIZE` after another, waits until all are ACTIVE, measures
what one look costs Placement on the full cloud and what the cloud costs at rest, then destroys
everything. Prints a table and writes JSON.

    contrib/bench/scale.py [--agents 200] [--instances 2000] [--batches 8] [--batch-size 250] [--out DIR] [--keep]
    contrib/bench/scale.py --simulated --agents 10000 --instances 20000

With --simulated the agents are simulated hosts of one process (`toyvm compute --simulate`,
in-memory hypervisors, toyvm's own agent code), and one schedule's wall time is sampled first
at 10 such hosts, then at --agents, in the same run. --evacuate N: one more host with N
instances (at most 16) dies among them and is evacuated. --floor: after the destroy, as many
placed again by bare requests to Placement from this script's threads (a look and one claim a
batch, nothing of toyvm's), the ceiling toyvm's placing is measured against in the same run;
--floor-first: the same before toyvm's placing too, on the fresh cloud (its claims given back
after), so that each side meets Placement's tables in the other's state once. --alternate N:
toyvm's placing in N rounds, each after the floor's round of the same batches (given back
before toyvm's): the machine drifts over minutes (the floor alone has read 100 to 190 a second
in one run), and alternated rounds meet it alike.
"""

import argparse
import http.client
import json
import os
import pathlib
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testbed"))
from cloud import ROOT, Cloud, free_port, wait_until  # noqa: E402

QUERY = "resources=VCPU:1,MEMORY_MB:256,DISK_GB:1"
INVENTORY = "VCPU:16,MEMORY_MB:16384,DISK_GB:160"  # room for 16 of QUERY
# etcd's rates at rest are read over one `stats_interval` (30 s): each agent reports its host's
# figures once in it, and a shorter window would count a share that depends on when it opens.
AT_REST_S = 30
# What a run may try on etcd (--etcd-arg, repeated): its history compacted within the run, and the
# `map` freelist of its bbolt backend, whose allocations do not grow with the free pages as the
# default `array`'s do. Measured at 20,000 instances (history.md): neither placing nor
# destroying clearly faster; so by default etcd runs on its own defaults.
ETCD_TRIED = ["--auto-compaction-mode=periodic", "--auto-compaction-retention=5m",
              "--experimental-backend-bbolt-freelist-type=map"]


def rss_kib(pid):
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def etcd_writes(metrics):
    """Writes applied to etcd's store so far (puts, deletes and transactions that wrote)."""
    return sum(v for k, v in metrics.items()
               if k.startswith(("etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total")))


def etcd_rate(cloud, seconds):
    """etcd's writes/s, raft proposals/s and client bytes received/s over `seconds`, and the CPU
    (ms a second) etcd and the agents spend meanwhile."""
    def sample():
        members = [cloud.etcd_metrics(i) for i in range(len(cloud.etcd_urls))]
        received = sum(v for m in members for k, v in m.items()
                       if k.startswith("etcd_network_client_grpc_received_bytes_total"))
        return etcd_writes(members[0]), members[0].get("etcd_server_proposals_committed_total", 0), received
    w0, p0, b0 = sample()
    c0 = cpu_by_group()
    time.sleep(seconds)
    c1 = cpu_by_group()
    w1, p1, b1 = sample()
    return {"writes_per_s": (w1 - w0) / seconds, "proposals_per_s": (p1 - p0) / seconds,
            "client_bytes_per_s": (b1 - b0) / seconds,
            "cpu_ms_per_s": {group: round(1000 * (c1[group] - c0[group]) / seconds, 1)
                             for group in ("etcd", "agents", "machine")}}


# Who spends the machine's CPU while the cloud fills, by process name: the cloud's servers
# live through the phase; the users' `toyvm schedule` processes are this script's children,
# counted as each is waited for.
CPU_GROUPS = {"etcd": ("etcd",), "Placement": ("uwsgi", "placement-api"), "PostgreSQL": ("postgres",),
              "agents": ("toyvm",)}


def cpu_by_group():
    """CPU seconds so far of every process in each of CPU_GROUPS, the finished children's
    (`schedules`), this script's (`users`) and the whole machine's busy time (`machine`)."""
    tick = os.sysconf("SC_CLK_TCK")
    spent = dict.fromkeys(CPU_GROUPS, 0.0)
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().rsplit(")", 1)
        except OSError:
            continue  # gone meanwhile
        comm, fields = name.split("(", 1)[1], rest.split()
        for group, names in CPU_GROUPS.items():
            if comm in names:
                spent[group] += (int(fields[11]) + int(fields[12])) / tick
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent["schedules"] = children.ru_utime + children.ru_stime
    own = resource.getrusage(resource.RUSAGE_SELF)
    spent["users"] = own.ru_utime + own.ru_stime  # this script: the floor's threads
    busy = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    spent["machine"] = (sum(busy) - busy[3] - busy[4]) / tick  # all but idle and iowait
    return spent


def etcd_requests(cloud):
    """etcd's requests answered so far, all members (the agents reach one, the schedules
    another), by method, the raft proposals it committed, and the keys they put and deleted
    (each applied by every member)."""
    counts = {"Txn": 0, "Range": 0, "proposals": 0, "puts": 0, "deletes": 0}
    for member in range(len(cloud.etcd_urls)):
        for name, value in cloud.etcd_metrics(member).items():
            for method in ("Txn", "Range"):
                if name.startswith("grpc_server_handled_total") and f'grpc_method="{method}"' in name:
                    counts[method] += value
    one = cloud.etcd_metrics()
    counts["proposals"] = one.get("etcd_server_proposals_committed_total", 0)
    counts["puts"] = one.get("etcd_mvcc_put_total", 0)
    counts["deletes"] = one.get("etcd_mvcc_delete_total", 0)
    return counts


def etcd_calls(cloud):
    """etcd's calls started so far, all members, by method (a watch or keep-alive stream is one
    call, however many it carries), and the watchers open now."""
    counts = {}
    for member in range(len(cloud.etcd_urls)):
        for name, value in cloud.etcd_metrics(member).items():
            if name.startswith("grpc_server_started_total"):
                method = re.search(r'grpc_method="(\w+)"', name).group(1)
                counts[method] = counts.get(method, 0) + value
            elif name.startswith("etcd_debugging_mvcc_watcher_total"):
                counts["watchers"] = counts.get("watchers", 0) + value
    return counts


def etcd_db_size(cloud):
    m = cloud.etcd_metrics()
    size = m.get("etcd_mvcc_db_total_size_in_bytes", m.get("etcd_debugging_mvcc_db_total_size_in_bytes", 0))
    in_use = m.get("etcd_mvcc_db_total_size_in_use_in_bytes", 0)
    return {"db_bytes": size, "db_in_use_bytes": in_use}


def schedule_latencies(cloud, samples):
    """Wall times of `samples` single schedules one after the other, each destroyed after."""
    times = []
    for _ in range(samples):
        started = time.monotonic()
        result = cloud.run("schedule", QUERY)
        times.append(time.monotonic() - started)
        if result.returncode == 0:
            cloud.run("destroy", result.stdout.split()[-1])
    times.sort()
    return {"p50_ms": 1000 * times[len(times) // 2], "p99_ms": 1000 * times[min(len(times) - 1, int(len(times) * 0.99))],
            "samples": samples}


def start_simulated(cloud, workdir, name, count, config, extra=()):
    proc = cloud.spawn(name, [cloud.toyvm, "--config", str(config), "compute", "--simulate", str(count), "--state-dir",
                              str(workdir / name), "--inventory", INVENTORY, "--name", name, *extra], cloud.env)
    return {name: proc}


def victim_with_instances(cloud, workdir, count):
    """One more simulated host, alone alive, and `count` instances placed on it: nothing in
    their queries ties them to it, so its evacuation may take them anywhere. It lives on
    while the many start, with a short lease: its death is known in seconds."""
    config = workdir / "victim.toml"
    config.write_text(re.sub(r"lease_ttl = \d+", "lease_ttl = 3", pathlib.Path(cloud.env["TOYVM_CONFIG"]).read_text()))
    start_simulated(cloud, workdir, "victim", 1, config)
    victim = "victim-00001"
    wait_until("the victim alone alive", lambda: [h["name"] for h in cloud.hosts() if h["alive"]] == [victim], 120, 2)
    placed = cloud.run("schedule", QUERY, "--count", str(count), "--wait", timeout=600)
    uuids = [line.split()[-1] for line in placed.stdout.splitlines() if line.startswith("NOTIFIED")]
    if placed.returncode != 0 or len(uuids) != count:
        raise RuntimeError(f"the victim's {count} instances: exit {placed.returncode}: {placed.stderr.strip()}")
    return {"name": victim, "config": config, "uuids": uuids, "rp": placed_on(placed)}


def evacuate(cloud, workdir, victim):
    """The victim's process killed -9, then `toyvm evacuate` timed; its instances must be
    ACTIVE elsewhere, and audit clean once it is back."""
    cloud.stop("victim", signal.SIGKILL)
    wait_until("the victim's lease to end",
               lambda: not any(h["name"] == victim["name"] and h["alive"] for h in cloud.hosts()), 60, 2)
    started = time.monotonic()
    evacuated = cloud.run("evacuate", victim["name"], timeout=1200)
    took = time.monotonic() - started
    moved = evacuated.stdout.count("EVACUATED")
    if evacuated.returncode != 0:
        raise RuntimeError(f"toyvm evacuate: exit {evacuated.returncode}: {evacuated.stdout[-500:]} {evacuated.stderr[-500:]}")

    def active_elsewhere():
        records = {i["uuid"]: i for i in cloud.instances()}
        return all(u in records and records[u]["state"] == "ACTIVE" and records[u]["host"] != victim["rp"]
                   for u in victim["uuids"])
    wait_until("the evacuated instances ACTIVE elsewhere", active_elsewhere, 300, 2)
    active_s = time.monotonic() - started
    start_simulated(cloud, workdir, "victim", 1, victim["config"])
    wait_until("the victim back", lambda: any(h["name"] == victim["name"] and h["alive"] for h in cloud.hosts()), 120, 2)
    audit = cloud.run("audit", timeout=1800)  # it reads every provider and instance: minutes at 10,000
    return {"instances": len(victim["uuids"]), "moved": moved, "seconds": took,
            "ms_per_instance": took / max(moved, 1) * 1000, "all_active_s": active_s, "audit_exit": audit.returncode,
            "audit": audit.stdout.strip()[-300:]}


def placed_on(schedule):
    lines = [line for line in schedule.stdout.splitlines() if line.startswith("NOTIFIED")]
    return lines[0].split(", ")[1] if lines else ""


def parallel(items, work, threads):
    items, lock, results = list(items), threading.Lock(), []

    def worker():
        while True:
            with lock:
                if not items:
                    return
                item = items.pop()
            outcome = work(item)
            with lock:
                results.append(outcome)
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results


# toyvm's shards' traits (model/uuid.cpp).
SHARD_TRAIT = "CUSTOM_TOYVM_SHARD_{}"
ASKED = {rc: int(n) for rc, n in (part.split(":") for part in QUERY.split("=", 1)[1].split(","))}


def floor_plan(candidates, size):
    """`size` instances spread over the candidates' free room (round robin, from a random
    start), or None when they do not hold them."""
    room = []
    for rp, summary in candidates["provider_summaries"].items():
        r = summary["resources"]
        room.append([rp, min((r[rc]["capacity"] - r[rc]["used"]) // n for rc, n in ASKED.items())])
    room.sort(key=lambda _: uuid.uuid4().int)
    plan = []
    while len(plan) < size:
        given = 0
        for entry in room:
            if entry[1] > 0 and len(plan) < size:
                plan.append(entry[0])
                entry[1] -= 1
                given += 1
        if not given:
            return None
    return plan


class PlacementTally:
    """Placement's answers from its request log since it was made: looks, and claims (POST
    /allocations) by status. What an instance costs Placement in requests, and how many claims
    another batch's came first to (409), read the same way for toyvm's placing and the floor's."""

    def __init__(self, cloud):
        self.log = cloud.placement_log
        self.start = self.log.stat().st_size if self.log.exists() else 0
        config = (self.log.parent / "placement.conf").read_text()
        self.port = re.search(r"postgresql\+psycopg2://postgres@127\.0\.0\.1:(\d+)/", config).group(1)
        self.transactions = self.database_transactions()

    def database_transactions(self):
        """PostgreSQL's transactions in Placement's database so far, committed and rolled back:
        a claim Placement writes again (a provider's generation moved under it) rolls back."""
        done = subprocess.run(["psql", "-h", "127.0.0.1", "-p", self.port, "-U", "postgres", "-At", "-c",
                               "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = 'placement'"],
                              capture_output=True, text=True, check=True)
        committed, rolled_back = map(int, done.stdout.strip().split("|"))
        return committed, rolled_back

    def counts(self):
        with open(self.log, "rb") as log:
            log.seek(self.start)
            text = log.read().decode(errors="replace")
        looks = text.count('"GET /allocation_candidates')
        claims = re.findall(r'"POST /allocations" status: (\d+)', text)
        committed, rolled_back = (now - then for now, then in zip(self.database_transactions(), self.transactions))
        return {"looks": looks, "claims": len(claims), "claims_409": claims.count("409"),
                "db_commits": committed, "db_rollbacks": rolled_back}

    def requests(self):
        """Placement's requests since, by method and path, ids left out: what a host's
        registration costs it."""
        with open(self.log, "rb") as log:
            log.seek(self.start)
            text = log.read().decode(errors="replace")
        paths = re.findall(r'"(GET|PUT|POST|DELETE) (/[^" ?]*)', text)
        counts = {}
        for method, path in paths:
            path = re.sub(r"/[0-9a-f]{8}-[0-9a-f-]{27}", "/{id}", path)
            path = re.sub(r"/traits/CUSTOM_\w+", "/traits/{name}", path)
            counts[f"{method} {path}"] = counts.get(f"{method} {path}", 0) + 1
        return dict(sorted(counts.items(), key=lambda item: -item[1]))

    @staticmethod
    def text(counts):
        return ", ".join(f"{what} {n}" for what, n in counts.items())


def look_costs(cloud, shards, size, samples=5):
    """What one look costs Placement and PostgreSQL in CPU, on the cloud as it is: the median ms
    of `samples` looks one after another, a shard's at random (as a batch's first look asks) and
    the whole cloud's (its last). Placement finds every provider with room for each resource
    class asked, whatever the traits, before it narrows them to the shard: a look's cost grows
    with the hosts and their allocations, a shard's too."""
    query = (f"/allocation_candidates?{QUERY}&required=CUSTOM_TOYVM_HOST&required=!COMPUTE_STATUS_DISABLED"
             f"&limit={max(size, 50)}")
    scopes = {"whole": lambda: ""}
    if shards:
        scopes["shard"] = lambda: "&required=" + SHARD_TRAIT.format(random.randrange(shards))
    costs = {}
    for name, scope in scopes.items():
        spent = []
        for _ in range(samples):
            before = cpu_by_group()
            cloud.placement_get(query + scope())
            after = cpu_by_group()
            spent.append(1000 * sum(after[group] - before[group] for group in ("Placement", "PostgreSQL")))
        costs[name] = statistics.median(spent)
    return costs


# The floor's placings, as said: before toyvm's, alternated with it in rounds, after the destroy.
FLOOR_LABELS = {"floor_first": "the floor first", "floor_alternate": "the floor, alternated", "floor": "the floor"}


def placement_floor(cloud, sizes, users, shards):
    """The users' requests made by bare threads of this script, on the same cloud with its hosts
    alive and nothing of toyvm's placing: for each batch a look at a shard at random (two more,
    then the whole cloud, when it has no room, as a schedule widens its look), a plan spread
    over the candidates' free room, and one POST /allocations; a refused claim looks again.
    Placement's own ceiling for this cloud, which toyvm's placing is measured against. Returns
    how many were placed, the batches that were not (no room, or what Placement said), and a
    function that gives its claims back."""
    url = urllib.parse.urlsplit(cloud.placement_url)
    headers = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39",
               "Content-Type": "application/json"}
    local = threading.local()
    claimed, claimed_lock = [], threading.Lock()

    def request(method, path, body=None):
        for attempt in range(2):  # a kept-alive connection Placement closed meanwhile, once
            if getattr(local, "conn", None) is None:
                local.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
            try:
                local.conn.request(method, path, body=body, headers=headers)
                response = local.conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError):
                local.conn.close()
                local.conn = None
                if attempt:
                    raise

    def batch(size):
        try:
            return place(size), None
        except (RuntimeError, OSError, http.client.HTTPException) as e:
            return 0, str(e)

    def place(size):
        scopes = [SHARD_TRAIT.format(n) for n in sorted(range(shards), key=lambda _: uuid.uuid4().int)[:3]] + [None]
        query = (f"/allocation_candidates?{QUERY}&required=CUSTOM_TOYVM_HOST&required=!COMPUTE_STATUS_DISABLED"
                 f"&limit={max(size, 50)}")
        while scopes:
            status, body = request("GET", query + (f"&required={scopes[0]}" if scopes[0] else ""))
            unknown_shard = status == 400 and "No such trait" in str(body)  # a shard no host joined
            if status != 200 and not unknown_shard:
                raise RuntimeError(f"the floor's look: {status} {body[:200]!r}")
            plan = None if unknown_shard else floor_plan(json.loads(body), size)
            if plan is None:
                scopes.pop(0)
                continue
            claims = {str(uuid.uuid4()): {"allocations": {rp: {"resources": ASKED}}, "project_id": "toyvm",
                                          "user_id": "floor", "consumer_generation": None, "consumer_type": "INSTANCE"}
                      for rp in plan}
            status, body = request("POST", "/allocations", json.dumps(claims))
            if status == 204:
                with claimed_lock:
                    claimed.extend(claims)
                return size
            if status != 409:  # another batch got in first: look again
                raise RuntimeError(f"the floor's claim: {status} {body[:200]!r}")
        raise RuntimeError("no room anywhere")
    def give_back():
        given_back = parallel(claimed, lambda consumer: request("DELETE", f"/allocations/{consumer}")[0], users)
        if any(status != 204 for status in given_back):
            raise RuntimeError("the floor's claims were not all given back")
    outcomes = parallel(sizes, batch, users)
    return sum(n for n, _ in outcomes), [error for _, error in outcomes if error], give_back


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=8, help="concurrent users, each running `schedule --count` after another")
    parser.add_argument("--batch-size", type=int, default=250, help="instances in each `schedule --count`")
    parser.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "bench")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--simulated", action="store_true", help="the agents as simulated hosts of one process")
    parser.add_argument("--samples", type=int, default=40, help="single schedules timed at each size (--simulated)")
    parser.add_argument("--shards", type=int, default=None,
                        help="[placement] shards for agents and schedules (default: one per 100 hosts from 1,000)")
    parser.add_argument("--sample-hosts", type=int, default=None,
                        help="[placement] sample_hosts for schedules (default: 2 from 1,000 hosts)")
    parser.add_argument("--etcd-arg", action="append", dest="etcd_args", default=[],
                        help="a flag for every etcd member (repeat), e.g. " + " ".join(f"--etcd-arg={a}" for a in ETCD_TRIED))
    parser.add_argument("--etcd-gogc", type=int, default=400,
                        help="GOGC for the etcd members (100: Go's own default). At 10,000 hosts the member the "
                             "hosts reach collects its heap of every key's history again and again; 400 "
                             "spends memory (~1.7 GiB) instead of CPU")
    parser.add_argument("--lease-ttl", type=int, default=10, help="[compute] lease_ttl, seconds")
    parser.add_argument("--floor", action="store_true",
                        help="after the destroy, as many placed by bare requests to Placement: its ceiling (--simulated)")
    parser.add_argument("--floor-first", action="store_true",
                        help="the floor before toyvm's placing too, on the fresh cloud, its claims given back after")
    parser.add_argument("--alternate", type=int, default=0,
                        help="toyvm's placing in this many rounds, each after the floor's of the same batches")
    parser.add_argument("--evacuate", type=int, default=0,
                        help="instances on one more host that dies among the others and is evacuated (--simulated)")
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="toyvm-scale-"))
    figures = {"agents": args.agents, "instances": args.instances, "batches": args.batches,
               "batch_size": args.batch_size}
    cloud = None
    try:
        figures["etcd_args"] = args.etcd_args
        # Inherited by the testbed's etcd members, the only Go programs it starts.
        os.environ["GOGC"] = str(args.etcd_gogc)
        figures["etcd_gogc"] = args.etcd_gogc
        cloud = Cloud(args.build, workdir, etcd_members=3, postgresql=True, placement_workers=4,
                      etcd_args=args.etcd_args)
        config = workdir / "agent.toml"
        shards = args.shards if args.shards is not None else (args.agents // 100 if args.agents >= 1000 else 0)
        figures["shards"] = shards
        sample = args.sample_hosts if args.sample_hosts is not None else (2 if args.agents >= 1000 else 0)
        figures["sample_hosts"] = sample
        config.write_text(f"[compute]\nstop_timeout = 0\nlease_ttl = {args.lease_ttl}\n"
                          f"[placement]\nshards = {shards}\nsample_hosts = {sample}\n")
        figures["etcd_empty"] = etcd_db_size(cloud)
        if args.simulated:
            # Ten hosts as a cloud of ten would run: no shards.
            unsharded = workdir / "small.toml"
            unsharded.write_text(f"[compute]\nstop_timeout = 0\nlease_ttl = {args.lease_ttl}\n")
            cloud.env["TOYVM_CONFIG"] = str(unsharded)
            small = start_simulated(cloud, workdir, "small", 10, unsharded)
            wait_until("10 simulated hosts alive", lambda: sum(h["alive"] for h in cloud.hosts()) == 10, 120)
            figures["schedule_at_10"] = schedule_latencies(cloud, args.samples)
            print(f"scale: one schedule at 10 hosts: {figures['schedule_at_10']}", flush=True)
            cloud.stop("small", signal.SIGTERM)
            wait_until("10 simulated hosts gone", lambda: not any(h["alive"] for h in cloud.hosts()), 120)
        cloud.env["TOYVM_CONFIG"] = str(config)  # the schedules' as the agents'
        victim = None
        if args.simulated and args.evacuate > 0:
            victim = victim_with_instances(cloud, workdir, args.evacuate)
        on_victim = len(victim["uuids"]) if victim else 0

        started, cpu_before, tally, calls_before = time.monotonic(), cpu_by_group(), PlacementTally(cloud), etcd_calls(cloud)
        if args.simulated:
            agents = start_simulated(cloud, workdir, "h", args.agents, config)
        else:
            agents = {f"h{i:04d}": cloud.start_agent(f"h{i:04d}", INVENTORY, config) for i in range(args.agents)}
        # Polled every 5 s: each look reads every host record, itself a load at 10,000.
        wait_until("every agent alive", lambda: sum(h["alive"] for h in cloud.hosts()) == args.agents + bool(victim),
                   1800, 5)
        figures["agents_alive_s"] = time.monotonic() - started
        print(f"scale: {args.agents} agents registered and alive in {figures['agents_alive_s']:.1f} s", flush=True)
        figures["registration_cpu_ms_per_host"] = {
            group: round(1000 * (spent - cpu_before[group]) / args.agents, 2) for group, spent in cpu_by_group().items()}
        figures["registration_requests_per_host"] = {
            what: round(n / args.agents, 2) for what, n in tally.requests().items() if n >= args.agents / 10}
        figures["registration_etcd_per_host"] = {
            what: round((n - calls_before.get(what, 0)) / args.agents, 2) for what, n in etcd_calls(cloud).items()
            if n - calls_before.get(what, 0) >= args.agents / 10}
        print(f"scale: CPU ms a host while registering: {figures['registration_cpu_ms_per_host']}; "
              f"Placement's requests a host: {figures['registration_requests_per_host']}; "
              f"etcd's a host: {figures['registration_etcd_per_host']}", flush=True)
        figures["etcd_idle_hosts"] = etcd_rate(cloud, AT_REST_S)
        print(f"scale: etcd at rest with the hosts only: {figures['etcd_idle_hosts']}", flush=True)
        if args.simulated:
            figures["schedule_at_agents"] = schedule_latencies(cloud, args.samples)
            print(f"scale: one schedule at {args.agents} hosts: {figures['schedule_at_agents']}", flush=True)

        # --batches users at once, each placing --batch-size instances after another until all are.
        sizes = [min(args.batch_size, args.instances - first) for first in range(0, args.instances, args.batch_size)]

        def placing(work, part):
            """One round of one side's placing: work(part) places the batches `part` and answers
            how many it placed, what failed and how to give them back. Returns what the round
            took (wall time, CPU by group, Placement's answers, etcd's requests) and that."""
            started, cpu_before, etcd_before = time.monotonic(), cpu_by_group(), etcd_requests(cloud)
            tally = PlacementTally(cloud)
            placed, failures, give_back = work(part)
            answers = tally.counts()
            took = time.monotonic() - started
            return {"placed": placed, "failures": failures, "s": took, "answers": answers,
                    "cpu_s": {group: spent - cpu_before[group] for group, spent in cpu_by_group().items()},
                    "etcd": {what: n - etcd_before[what] for what, n in etcd_requests(cloud).items()}}, give_back

        def totals(rounds):
            """One side's rounds summed: its rate, CPU an instance by group, Placement's answers,
            etcd's requests an instance, and each round's rate (how far the machine drifted)."""
            placed, took = sum(r["placed"] for r in rounds), sum(r["s"] for r in rounds)
            return {"placed": placed, "s": took, "rate_per_s": placed / took,
                    "rounds_per_s": [r["placed"] / r["s"] for r in rounds],
                    "rounds_cpu_ms_per_instance": [{group: 1000 * spent / max(r["placed"], 1)
                                                    for group, spent in r["cpu_s"].items()} for r in rounds],
                    "failures": [failure for r in rounds for failure in r["failures"]],
                    "cpu_ms_per_instance": {group: 1000 * sum(r["cpu_s"][group] for r in rounds) / max(placed, 1)
                                            for group in rounds[0]["cpu_s"]},
                    "etcd_per_instance": {what: sum(r["etcd"][what] for r in rounds) / max(placed, 1)
                                          for what in rounds[0]["etcd"]},
                    "placement_requests": {what: sum(r["answers"][what] for r in rounds) for what in rounds[0]["answers"]}}

        def floor_places(part):
            return placement_floor(cloud, part, args.batches, shards)

        def place(size):
            done = subprocess.run([cloud.toyvm, "schedule", QUERY, "--count", str(size)], env=cloud.env,
                                  capture_output=True, text=True)
            return done.stdout.count("NOTIFIED TARGET"), (done.stderr.strip() if done.returncode != 0 else None)

        def toyvm_places(part):
            outcomes = parallel(part, place, args.batches)
            return sum(n for n, _ in outcomes), [err for _, err in outcomes if err is not None], None

        def floor_figures(rounds):
            floor = totals(rounds)
            del floor["cpu_ms_per_instance"]["schedules"], floor["etcd_per_instance"]
            return floor

        def say_floor(name):
            floor = figures[name]
            for error in floor["failures"]:
                print(f"scale: a batch of the floor failed: {error}", flush=True)
            print(f"scale: {FLOOR_LABELS[name]} (bare requests to Placement): "
                  f"{floor['placed']} in {floor['s']:.1f} s ({floor['rate_per_s']:.0f}/s); CPU ms an instance: " +
                  ", ".join(f"{group} {ms:.2f}" for group, ms in floor["cpu_ms_per_instance"].items()) +
                  "; Placement's answers: " + PlacementTally.text(floor["placement_requests"]), flush=True)

        def measure_floor(name):
            """The floor's whole placing, timed: figures[name]. Returns how to give it back."""
            measured, give_back = placing(floor_places, sizes)
            figures[name] = floor_figures([measured])
            say_floor(name)
            return give_back

        if args.floor_first:
            measure_floor("floor_first")()  # its claims given back: toyvm's placing meets the cloud empty

        # In --alternate rounds, each after the floor's round of the same batches (given back
        # before toyvm's): both sides meet the machine as it is then, and Placement's tables
        # as full.
        rounds = max(args.alternate, 1)
        mine, floors = [], []
        for n in range(rounds):
            part = sizes[n * len(sizes) // rounds:(n + 1) * len(sizes) // rounds]
            if args.alternate:
                measured, give_back = placing(floor_places, part)
                floors.append(measured)
                give_back()
            measured, _ = placing(toyvm_places, part)
            mine.append(measured)
            if floors:
                print(f"scale: round {n + 1} of {rounds}: " + "; ".join(
                    f"{side} {r['placed'] / r['s']:.0f}/s, CPU ms an instance " + ", ".join(
                        f"{group} {1000 * spent / max(r['placed'], 1):.2f}" for group, spent in r["cpu_s"].items())
                    for side, r in (("toyvm", measured), ("the floor", floors[-1]))), flush=True)
            if n + 1 < rounds:  # the agents' last builds are not the next floor's load
                wait_until("this round's instances ACTIVE",
                           lambda: sum(i["state"] == "ACTIVE" for i in cloud.instances()) >=
                           sum(r["placed"] for r in mine) + on_victim, 600)
        placed_at = time.monotonic()
        if floors:
            figures["floor_alternate"] = floor_figures(floors)
            say_floor("floor_alternate")
        toyvm = totals(mine)
        placed = toyvm["placed"]
        figures["place_s"] = toyvm["s"]
        figures["place_rounds_per_s"] = toyvm["rounds_per_s"]
        figures["place_placement_requests"] = toyvm["placement_requests"]
        figures["place_cpu_ms_per_instance"] = toyvm["cpu_ms_per_instance"]
        figures["place_etcd_per_instance"] = toyvm["etcd_per_instance"]
        failed = toyvm["failures"]
        figures["placed"] = placed
        figures["batch_failures"] = failed
        figures["placement_rate_per_s"] = toyvm["rate_per_s"]
        print(f"scale: {placed} placed by {args.batches} users in batches of {args.batch_size} in "
              f"{figures['place_s']:.1f} s", flush=True)
        print("scale: CPU ms an instance while placing: " + ", ".join(
            f"{group} {ms:.2f}" for group, ms in figures["place_cpu_ms_per_instance"].items()) +
            "; etcd an instance: " + ", ".join(
            f"{what} {n:.2f}" for what, n in figures["place_etcd_per_instance"].items()) +
            "; Placement's answers: " + PlacementTally.text(figures["place_placement_requests"]), flush=True)
        for err in failed:
            print(f"scale: a batch failed: {err}", flush=True)
        wait_until("every instance ACTIVE",
                   lambda: sum(i["state"] == "ACTIVE" for i in cloud.instances()) == placed + on_victim, 600)
        # In toyvm's time: its placing, and what its last builds took after.
        figures["all_active_s"] = figures["place_s"] + time.monotonic() - placed_at
        figures["overbooked"] = len(cloud.overbooked())
        print(f"scale: every instance ACTIVE after {figures['all_active_s']:.1f} s; providers over capacity: "
              f"{figures['overbooked']}", flush=True)
        # The looks' share of placing, from what one costs on the cloud as full as placing left it.
        figures["look_cpu_ms"] = look_costs(cloud, shards, args.batch_size)
        figures["looks_cpu_ms_per_instance"] = (figures["look_cpu_ms"].get("shard", figures["look_cpu_ms"]["whole"]) *
                                                toyvm["placement_requests"]["looks"] / max(placed, 1))
        print("scale: one look, Placement and PostgreSQL CPU: " + ", ".join(
            f"{scope} {ms:.1f} ms" for scope, ms in figures["look_cpu_ms"].items()) +
            f"; the looks' share of placing ~{figures['looks_cpu_ms_per_instance']:.2f} ms an instance", flush=True)

        figures["agent_rss_mib"] = sum(rss_kib(p.pid) for p in agents.values()) / 1024
        port = free_port()
        mdserver = cloud.spawn("mdserver", [cloud.toyvm, "mdserver", "--listen", f"127.0.0.1:{port}"], cloud.env)

        def answers():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/latest/meta-data/", timeout=5)
            except urllib.error.HTTPError:
                pass  # an answer: this address is no guest's
            return True
        wait_until("the metadata service", answers, 60)
        figures["mdserver_rss_mib"] = rss_kib(mdserver.pid) / 1024
        figures["etcd_idle_instances"] = etcd_rate(cloud, AT_REST_S)
        print(f"scale: etcd at rest with the instances: {figures['etcd_idle_instances']}", flush=True)
        figures["etcd_full"] = etcd_db_size(cloud)
        # Guests that talk to their consoles, nobody reading them (the test driver writes no
        # console: the benchmark stands in for QEMU and appends a line to each every second).
        logs = [d / "console.log" for d in workdir.glob("h*/instances/*") if d.is_dir()]
        talking = threading.Event()

        def talk():
            while not talking.wait(1.0):
                for log in logs:
                    with open(log, "a") as f:
                        f.write(f"{time.time():.3f} the guest says something\n")
        talker = threading.Thread(target=talk)
        talker.start()
        try:
            figures["etcd_talking_consoles"] = etcd_rate(cloud, AT_REST_S)
        finally:
            talking.set()
            talker.join()

        if victim:
            figures["evacuation"] = evacuate(cloud, workdir, victim)
            print(f"scale: evacuation of a dead host: {figures['evacuation']}", flush=True)

        uuids = [i["uuid"] for i in cloud.instances()]
        # The hosts' records counted while the cloud is destroyed: a host whose lease etcd let
        # lapse is missing until it announces itself again.
        live_counts, destroyed = [], threading.Event()

        def count_live_hosts():
            while not destroyed.wait(5.0):
                try:
                    live_counts.append(sum(h["alive"] for h in cloud.hosts()))
                except RuntimeError:  # a listing that failed (etcd busy) says nothing of the hosts
                    pass
        counter = threading.Thread(target=count_live_hosts)
        counter.start()
        started = time.monotonic()
        # Four `toyvm destroy` at a time, each of 500 instances (32 at once within it).
        chunks = [uuids[i:i + 500] for i in range(0, len(uuids), 500)]
        refused = [code for code in parallel(chunks, lambda chunk: cloud.run("destroy", *chunk, "--no-wait", timeout=600).returncode, 4)
                   if code != 0]
        if refused:
            print(f"scale: {len(refused)} destroy command(s) of 500 failed", flush=True)
        try:
            wait_until("every instance gone", lambda: not cloud.instances(), 3600, 5)
        finally:
            destroyed.set()
            counter.join()
        figures["destroy_all_s"] = time.monotonic() - started
        hosts_total = args.agents + bool(victim)
        figures["hosts_live_while_destroying"] = {"fewest": min(live_counts, default=None), "of": hosts_total}
        figures["hosts_live_after_destroy"] = sum(h["alive"] for h in cloud.answered_listing("--hosts"))
        print(f"scale: hosts live while destroying, fewest: {figures['hosts_live_while_destroying']['fewest']} "
              f"of {hosts_total}; after: {figures['hosts_live_after_destroy']}", flush=True)
        # Nothing left: no instance, nothing held in Placement by toyvm's consumers, audit clean.
        # Microversion 1.9: Placement 8.0.0 answers 500 on PostgreSQL for /usages from 1.38 (its
        # grouping by consumer type).
        request = urllib.request.Request(cloud.placement_url + "/usages?project_id=toyvm", headers={
            "X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.9"})
        left = json.load(urllib.request.urlopen(request, timeout=60))["usages"]
        audit = cloud.run("audit", timeout=1800)
        figures["left_after_destroy"] = {"usages": left, "audit_exit": audit.returncode,
                                         "audit": audit.stdout.strip()[-300:]}
        print(f"scale: after destroying all: {figures['left_after_destroy']}", flush=True)

        if args.floor:
            measure_floor("floor")
        for name in FLOOR_LABELS:
            if name in figures:
                figures["against_" + name] = figures["placement_rate_per_s"] / figures[name]["rate_per_s"]
                print(f"scale: toyvm's rate x{figures['against_' + name]:.2f} of {FLOOR_LABELS[name]}", flush=True)
    finally:
        if cloud:
            cloud.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(figures, indent=2) + "\n")
    rows = [
        *([("one schedule at 10 hosts, p50 / p99",
            f"{figures['schedule_at_10']['p50_ms']:.1f} / {figures['schedule_at_10']['p99_ms']:.1f} ms"),
           (f"one schedule at {args.agents} hosts, p50 / p99",
            f"{figures['schedule_at_agents']['p50_ms']:.1f} / {figures['schedule_at_agents']['p99_ms']:.1f} ms")]
          if "schedule_at_agents" in figures else []),
        ("agents registered and alive", f"{figures.get('agents_alive_s', float('nan')):.1f} s"),
        ("CPU a host while registering", ", ".join(
            f"{group} {ms:.2f}" for group, ms in figures.get("registration_cpu_ms_per_host", {}).items()) + " ms"),
        ("Placement's requests a host", ", ".join(
            f"{what} {n:.2f}" for what, n in figures.get("registration_requests_per_host", {}).items())),
        ("etcd's calls a host", ", ".join(
            f"{what} {n:.2f}" for what, n in figures.get("registration_etcd_per_host", {}).items())),
        ("etcd at rest, hosts only", f"{figures.get('etcd_idle_hosts', {}).get('writes_per_s', float('nan')):.2f} writes/s"),
        ("CPU at rest, hosts only", ", ".join(
            f"{group} {ms:.0f}" for group, ms in figures.get("etcd_idle_hosts", {}).get("cpu_ms_per_s", {}).items())
         + " ms a second"),
        ("instances placed", f"{figures.get('placed', 0)} in {figures.get('place_s', float('nan')):.1f} s "
                             f"({figures.get('placement_rate_per_s', float('nan')):.0f}/s)"),
        ("CPU an instance while placing", ", ".join(
            f"{group} {ms:.2f}" for group, ms in figures.get("place_cpu_ms_per_instance", {}).items()) + " ms"),
        ("all ACTIVE after", f"{figures.get('all_active_s', float('nan')):.1f} s"),
        *([("one look, full, Placement+PG CPU", ", ".join(
            f"{scope} {ms:.1f} ms" for scope, ms in figures["look_cpu_ms"].items()) +
            f" (the looks ~{figures['looks_cpu_ms_per_instance']:.2f} ms an instance)")]
          if "look_cpu_ms" in figures else []),
        ("providers over capacity", f"{figures.get('overbooked', '?')}"),
        ("agents' RSS, total", f"{figures.get('agent_rss_mib', float('nan')):.0f} MiB"),
        ("metadata service RSS", f"{figures.get('mdserver_rss_mib', float('nan')):.1f} MiB"),
        ("etcd at rest, with instances",
         f"{figures.get('etcd_idle_instances', {}).get('writes_per_s', float('nan')):.2f} writes/s, "
         f"{figures.get('etcd_idle_instances', {}).get('client_bytes_per_s', float('nan')) / 1024:.1f} KiB/s in"),
        ("CPU at rest, with instances", ", ".join(
            f"{group} {ms:.0f}" for group, ms in figures.get("etcd_idle_instances", {}).get("cpu_ms_per_s", {}).items())
         + " ms a second"),
        ("etcd DB size, full", f"{figures.get('etcd_full', {}).get('db_in_use_bytes', 0) / 1048576:.1f} MiB in use"),
        ("etcd, consoles talking, unread",
         f"{figures.get('etcd_talking_consoles', {}).get('writes_per_s', float('nan')):.2f} writes/s, "
         f"{figures.get('etcd_talking_consoles', {}).get('client_bytes_per_s', float('nan')) / 1024:.1f} KiB/s in"),
        *([("a dead host evacuated", f"{figures['evacuation']['moved']} of {figures['evacuation']['instances']} in "
                                     f"{figures['evacuation']['seconds']:.1f} s "
                                     f"({figures['evacuation']['ms_per_instance']:.0f} ms each), "
                                     f"audit exit {figures['evacuation']['audit_exit']}")]
          if "evacuation" in figures else []),
        ("destroy all", f"{figures.get('destroy_all_s', float('nan')):.1f} s"),
        ("hosts live while destroying, fewest / after",
         f"{figures.get('hosts_live_while_destroying', {}).get('fewest')} / {figures.get('hosts_live_after_destroy')}"),
        *([("left after, Placement / audit",
            f"{sum(figures['left_after_destroy']['usages'].values())} units held, "
            f"audit exit {figures['left_after_destroy']['audit_exit']}")] if "left_after_destroy" in figures else []),
        *[row for name, label in FLOOR_LABELS.items()
          if name in figures and "against_" + name in figures
          for row in ((f"{label}: bare requests, placed",
                       f"{figures[name]['placed']} in {figures[name]['s']:.1f} s ({figures[name]['rate_per_s']:.0f}/s; "
                       f"toyvm x{figures['against_' + name]:.2f})"),
                      (f"CPU an instance, {label}", ", ".join(
                          f"{group} {ms:.2f}" for group, ms in figures[name]["cpu_ms_per_instance"].items()) + " ms"),
                      (f"Placement's answers, {label}", PlacementTally.text(figures[name]["placement_requests"])))],
        *([("Placement's answers, toyvm", PlacementTally.text(figures["place_placement_requests"]))]
          if "place_placement_requests" in figures else []),
        *([("each round, toyvm / the floor", ", ".join(
            f"{mine:.0f}/{floor:.0f}" for mine, floor in zip(figures["place_rounds_per_s"],
                                                             figures["floor_alternate"]["rounds_per_s"])) + " a second")]
          if "floor_alternate" in figures else []),
    ]
    for name, value in rows:
        print(f"  {name:32} {value}")
    if figures.get("batch_failures"):
        print("scale: failed batches: " + "; ".join(figures["batch_failures"]))
    if args.keep:
        print(f"scale: logs in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
