#!/usr/bin/env python3
"""A seeded fault campaign: several agents on libvirt's test driver, a random mix of
operations (schedule, --count, server groups, bad images, stop, start, destroy, schedules of
two projects at the edges of their quotas, by the admin and by the projects' members several
at once, through two `toyvm scheduler` services whose leader takes them in batches) and faults
(agents or a scheduler service killed -9 or stopped and restarted, an agent killed and its host evacuated before it
comes back, an agent restarted with its state dir wiped, etcd restarted or its history
compacted, Placement's uWSGI restarted), and operators acting at once with the agents and
each other (two evacuations of one dead host, `destroy --force` racing an evacuation, `audit
--fix` during a large batch, a work value this toyvm cannot read written and later put back,
batches with user data near its limit, live and cold moves, resizes, and host drains). Then it lets things settle
and requires: `toyvm audit` clean, every instance ACTIVE, STOPPED, ERROR or gone, no move left
in flight, no provider over its capacity, no guest lost that had work (audit's
instance_without_domain), each project within its quota with Placement counting exactly its
instances that hold something, the projects' views of the records exactly the records, and
every member's request answered and gone.
etcd runs with TLS and its auth on, as members need (each signs in by its own certificate).
libvirt's test driver can neither migrate a domain nor stream or resize a volume: every move
and resize here gets as far as its books and the destination's files (a cold one: its guest
powered off) and is then undone (or meets a fault on the way), which is what it checks;
the moves that finish are checked on real daemons in the guests suite and in
contrib/chaos/moves.py, the campaign of moves with real guests.
The seed fixes the sequence of operations and faults (what they meet depends on timing); it
is printed first, and `--seed` replays it.

  usage: chaos.py --build DIR [--seconds N] [--seed S] [--agents N] [--junit FILE]
"""

import argparse
import json
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from xml.sax.saxutils import escape

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testbed"))
from cloud import ROOT, Cloud, wait_until  # noqa: E402

INVENTORY = "VCPU:16,MEMORY_MB:8192,DISK_GB:64"
FLAVORS = ["resources=VCPU:1,MEMORY_MB:256,DISK_GB:1", "resources=VCPU:2,MEMORY_MB:512,DISK_GB:2"]
FINAL = {"ACTIVE", "STOPPED", "ERROR"}
# Projects whose quotas the campaign schedules against, at their edges: (name, limits).
PROJECTS = [("p1", {"instances": 6, "VCPU": 8}), ("p2", {"instances": 4})]
SCHEDULERS = ["scheduler1", "scheduler2"]


class ChaosCloud(Cloud):
    """One etcd (TLS, auth on), Placement on sqlite, `agents` agents with short leases and
    resyncs, two scheduler services, a member in each project."""

    def __init__(self, build, dir, agents):
        super().__init__(build, dir, etcd_secure=True)
        self.config = dir / "agent.toml"
        # etcd's TLS and user as every other process of the cloud has them, and the agents' own.
        self.config.write_text(pathlib.Path(self.env["TOYVM_CONFIG"]).read_text() +
                               "[compute]\nlease_ttl = 3\nresync_interval = 5\nstop_timeout = 0\n"
                               "move_prepare_timeout = 10\n"
                               f"image_dir = '{dir / 'images'}'\n")
        self.config.chmod(0o600)  # it holds etcd's password
        (dir / "images").mkdir()
        (dir / "images" / "good.raw").write_bytes(b"\0" * 4096)
        self.agents = [f"host{i}" for i in range(agents)]
        for name in self.agents:
            self.start_agent(name)
        for name in self.agents:
            self.wait_agent(name)
        for name, limits in PROJECTS:
            made = self.run("project", "create", name, *[f"--limit={k}={v}" for k, v in limits.items()])
            if made.returncode != 0:
                raise RuntimeError(f"project create {name}: {made.stderr}")
            added = self.run("project", "add-member", name, f"m-{name}")
            if added.returncode != 0:
                raise RuntimeError(f"project add-member {name}: {added.stderr}")
        self.members = {name: self.member_config(f"m-{name}") for name, _ in PROJECTS}
        for name in SCHEDULERS:
            self.start_scheduler(name)

    def start_scheduler(self, name):
        return self.spawn(name, [self.toyvm, "scheduler", "--name", name], self.env)

    def start_agent(self, name, inventory=INVENTORY, config=None):
        return super().start_agent(name, inventory, config or self.config)


class Campaign:
    def __init__(self, cloud, seed):
        self.cloud = cloud
        self.rng = random.Random(seed)
        self.counts = {}
        self.log = open(cloud.dir / "campaign.log", "w")
        self.unreadable = {}  # work key -> the value it had before we made it unreadable
        self.user_data = cloud.dir / "user-data-64k"
        self.user_data.write_text("#cloud-config\n# " + "x" * (64 * 1024 - 20) + "\n")

    def note(self, what, detail=""):
        self.counts[what] = self.counts.get(what, 0) + 1
        print(f"{time.monotonic():.1f} {what} {detail}", file=self.log, flush=True)

    def listed(self):
        """The instances, to pick what to act on: a listing that failed picks nothing."""
        try:
            return self.cloud.instances()
        except (RuntimeError, json.JSONDecodeError, subprocess.TimeoutExpired):
            return []

    def known(self):
        return [i["uuid"] for i in self.listed()]

    def operation(self):
        rng, cloud = self.rng, self.cloud
        kind = rng.choices(["schedule", "count", "group", "bad_image", "destroy", "stop", "start", "migrate",
                            "migrate_cold", "resize", "project", "members"],
                           weights=[6, 2, 2, 1, 4, 2, 2, 2, 1, 1, 3, 3])[0]
        flavor = rng.choice(FLAVORS)
        if kind == "members":
            self.members(flavor)
            return
        if kind == "project":  # at the edge of its quota: placed, or refused with exit 7
            args = ["schedule", flavor, "--project", rng.choice(PROJECTS)[0], "--count", str(rng.randint(1, 3))]
        elif kind == "schedule":
            args = ["schedule", flavor, "--image", "good.raw"]
        elif kind == "count":
            args = ["schedule", flavor, "--count", str(rng.randint(2, 5))]
        elif kind == "group":
            args = ["schedule", flavor, "--group", f"g{rng.randint(1, 3)}", "--group-policy",
                    rng.choice(["anti-affinity", "soft-anti-affinity"])]
        elif kind == "bad_image":
            args = ["schedule", flavor, "--image", "missing.raw"]
        else:
            known = self.known()
            if not known:
                return
            # The sequence of choices stays the same for a seed; what they name may differ.
            pick = known[rng.randrange(1 << 30) % len(known)]
            if kind == "migrate_cold":
                args = ["migrate", pick, "--cold", "--no-wait"]
            elif kind == "resize":
                args = ["resize", pick, rng.choice(FLAVORS), "--no-wait"]
            else:
                args = [kind, pick, "--no-wait"]
        try:
            result = cloud.run(*args, timeout=60)
            self.note(kind, f"exit {result.returncode}")
        except subprocess.TimeoutExpired:
            self.note(kind, "timed out")

    def members(self, flavor):
        """A project's members scheduling at once through the service (a batch), at the edge of
        their project's quota: placed whole, refused with exit 7, or no room (1)."""
        rng, cloud = self.rng, self.cloud
        project = rng.choice(PROJECTS)[0]
        member = ["--config", str(cloud.members[project])]
        theirs = [i["uuid"] for i in self.listed() if i.get("project") == project]
        if theirs and rng.random() < 0.5:  # room made by the member itself, through the service
            gone = cloud.run(*member, "destroy", theirs[rng.randrange(1 << 30) % len(theirs)], timeout=90)
            self.note("members_destroy", f"exit {gone.returncode}")
        asked = [[*member, "schedule", flavor, "--count", str(rng.randint(1, 2))]
                 for _ in range(rng.randint(2, 5))]
        procs = [subprocess.Popen([cloud.toyvm, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=cloud.env) for args in asked]
        exits = []
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=90)
                exits.append(f"{proc.returncode}:{out.count('NOTIFIED')}")
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                exits.append("timed out")
        self.note("members", f"{project} exits:placed {' '.join(exits)}")

    def kill_host(self, name):
        self.cloud.stop(name, signal.SIGKILL)
        wait_until(f"agent {name} gone", lambda: not self.cloud.agent_alive(name), 30)

    def operator(self):
        """What operators do while the agents run: at once with each other, and with bad data."""
        rng, cloud = self.rng, self.cloud
        kind = rng.choices(["double_evacuate", "force_racing_evacuate", "audit_fix_during_batch", "unreadable_work",
                            "restore_work", "big_user_data", "drain"], weights=[1, 1, 1, 1, 1, 1, 1])[0]
        try:
            if kind == "drain":
                name = rng.choice(cloud.agents)
                drained = cloud.run("host", "drain", name, "--parallel", "2", "--timeout", "60", timeout=240)
                lines = drained.stdout.splitlines()
                self.note(kind, f"exit {drained.returncode}, {sum(l.startswith('MOVED') for l in lines)} moved, "
                                f"{sum(l.startswith('STAYED') for l in lines)} stayed")
                cloud.run("host", "enable", name)
                return
            if kind in ("double_evacuate", "force_racing_evacuate"):
                name = rng.choice(cloud.agents)
                provider = cloud.provider(name)
                on_it = [i["uuid"] for i in cloud.instances() if i["host"] == provider]
                self.kill_host(name)
                racers = [["evacuate", name], ["evacuate", name]]
                if kind == "force_racing_evacuate" and on_it:
                    racers[1] = ["destroy", on_it[rng.randrange(1 << 30) % len(on_it)], "--force"]
                procs = [subprocess.Popen([cloud.toyvm, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=cloud.env) for args in racers]
                outs = [p.communicate(timeout=180) for p in procs]
                self.note(kind, "; ".join(f"{' '.join(a)}: exit {p.returncode}, {o[0].count('EVACUATED')} moved"
                                          for a, p, o in zip(racers, procs, outs)))
                cloud.start_agent(name)
            elif kind == "audit_fix_during_batch":
                batch = subprocess.Popen([cloud.toyvm, "schedule", rng.choice(FLAVORS), "--count", "30"],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cloud.env)
                audit = cloud.run("audit", "--fix", "--grace", "0.5", timeout=120)
                out, _ = batch.communicate(timeout=180)
                self.note(kind, f"batch exit {batch.returncode} ({out.count('NOTIFIED')} placed), "
                                f"audit exit {audit.returncode}, {audit.stdout.count('(fixed)')} fixed")
            elif kind == "unreadable_work":
                instances = [i for i in cloud.instances() if i["state"] in ("ACTIVE", "STOPPED")]
                if not instances:
                    return
                pick = instances[rng.randrange(1 << 30) % len(instances)]
                key = f"/toyvm/v1/work/{pick['host']}/{pick['uuid']}"
                value = self.cloud.etcdctl("get", key, "--print-value-only").stdout.strip()
                if '"power":"' not in value or key in self.unreadable:
                    return
                # What a newer writer might leave: a power state this toyvm does not know.
                garbled = value.replace('"power":"running"', '"power":"paused"').replace(
                    '"power":"stopped"', '"power":"paused"')
                self.cloud.etcdctl("put", key, garbled)
                self.unreadable[key] = (value, garbled)
                self.note(kind, pick["uuid"])
            elif kind == "restore_work":
                self.restore_unreadable(1)
            else:
                result = cloud.run("schedule", FLAVORS[0], "--count", str(rng.randint(2, 12)), "--user-data",
                                   str(self.user_data), timeout=120)
                self.note(kind, f"exit {result.returncode}, {result.stdout.count('NOTIFIED')} placed")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            self.note(kind, f"not done: {e}")

    def restore_unreadable(self, how_many=None):
        """Puts back what unreadable_work garbled, where it is still as garbled."""
        for key in list(self.unreadable)[:how_many]:
            value, garbled = self.unreadable.pop(key)
            if self.cloud.etcdctl("get", key, "--print-value-only").stdout.strip() == garbled:
                self.cloud.etcdctl("put", key, value)
                self.note("restore_work", key)

    def fault(self):
        rng, cloud = self.rng, self.cloud
        kind = rng.choices(["kill_agent", "term_agent", "wipe_agent", "evacuate_agent", "restart_etcd",
                            "restart_placement", "compact_etcd", "operator", "kill_scheduler"],
                           weights=[4, 3, 1, 1, 1, 1, 1, 4, 1])[0]
        if kind == "operator":
            self.operator()
            return
        if kind == "kill_scheduler":  # the leader or the one standing by; the other leads on
            name = rng.choice(SCHEDULERS)
            cloud.stop(name, signal.SIGKILL)
            cloud.start_scheduler(name)
            self.note(kind, name)
            return
        if kind == "evacuate_agent":
            # A host that dies and is evacuated while the operations go on; then it comes back.
            name = rng.choice(cloud.agents)
            cloud.stop(name, signal.SIGKILL)
            try:
                wait_until(f"agent {name} gone", lambda: not cloud.agent_alive(name), 30)
                result = cloud.run("evacuate", name, timeout=120)
                self.note(kind, f"exit {result.returncode}: {result.stdout.count('EVACUATED')} moved, "
                                f"{result.stdout.count('NO ALLOCATIONS')} without room; {result.stderr.strip()}")
                # 0: all moved, 1: some had no room, 5: some changed meanwhile (left for later)
                self.note(f"evacuate_exit_{result.returncode}")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                self.note(kind, f"not done: {e}")
            cloud.start_agent(name)
            return
        if kind in ("kill_agent", "term_agent", "wipe_agent"):
            name = rng.choice(cloud.agents)
            cloud.stop(name, signal.SIGKILL if kind == "kill_agent" else signal.SIGTERM)
            if kind == "wipe_agent":
                # The host comes back as a new provider; the old one's work is left to its
                # operator (destroy --force below, as for a host that is gone for good).
                shutil.rmtree(cloud.dir / name, ignore_errors=True)
            cloud.start_agent(name)
        elif kind == "restart_etcd":
            cloud.restart_etcd()
        elif kind == "compact_etcd":
            self.note(kind, f"at revision {cloud.compact_etcd()}")
            return
        else:
            cloud.restart_placement()
        self.note(kind)

    def run(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.rng.random() < 0.15:
                self.fault()
            else:
                self.operation()

    def settle(self):
        """Every agent up, every instance final, dead hosts' work removed; then the checks."""
        cloud = self.cloud
        self.restore_unreadable()
        for name in cloud.agents:
            if cloud.procs[name].poll() is not None:
                cloud.start_agent(name)
        for name in cloud.agents:
            cloud.wait_agent(name, 60)
        live = {h["provider"] for h in cloud.answered_listing("--hosts") if h["alive"]}
        for instance in cloud.answered_listing():
            if instance["host"] not in live:
                result = cloud.run("destroy", instance["uuid"], "--force")
                self.note("destroy_force", f"exit {result.returncode}")
        problems = []
        # Every instance final and the audit clean in the same look, within a deadline: an agent
        # that has just come back rebuilds what its test driver lost, so a look that finds all
        # final a moment before it starts proves nothing.
        deadline = time.monotonic() + 180
        while True:
            try:
                not_final, unlisted = [i for i in cloud.instances() if i["state"] not in FINAL], None
            except RuntimeError as e:  # unknown is not final
                not_final, unlisted = [], str(e)
            audit = cloud.run("audit", "--json")
            moving = cloud.etcdctl("get", "--prefix", "--keys-only", "/toyvm/v1/moves/").stdout.split()
            if (not unlisted and not not_final and not moving and audit.returncode == 0) or time.monotonic() > deadline:
                break
            time.sleep(1)  # the polling interval
        found = json.loads(audit.stdout).get("discrepancies", []) if audit.stdout.startswith("{") else []
        if audit.returncode != 0:
            problems.append(f"toyvm audit exit {audit.returncode}: {audit.stdout.strip()} {audit.stderr.strip()}")
        if unlisted:
            problems.append(f"the instances not listed: {unlisted}")
        if not_final:
            problems.append(f"{len(not_final)} instance(s) not in a final state: " +
                            ", ".join(f"{i['uuid']} {i['state']} on {i['host']}" for i in not_final))
        if moving:
            problems.append(f"{len(moving)} move(s) still in flight: {' '.join(moving)}")
        over = cloud.overbooked()
        if over:
            problems.append(f"providers over capacity: {over}")
        problems += self.check_projects()
        # Every member's request answered, and gone with its reply (its command erases both).
        left = []
        for _ in range(30):
            left = cloud.etcdctl("get", "--prefix", "--keys-only", "/toyvm/v1/requests/").stdout.split()
            left += cloud.etcdctl("get", "--prefix", "--keys-only", "/toyvm/v1/replies/").stdout.split()
            if not left:
                break
            time.sleep(1)  # the polling interval
        if left:
            problems.append(f"members' requests or replies left behind: {' '.join(left)}")
        return problems, found

    def check_projects(self):
        """Each project within its quota as Placement counts it, that count the project's
        instances that hold something (ACTIVE or STOPPED), and its views its records exactly."""
        problems = []
        instances = self.cloud.answered_listing()
        for name, limits in PROJECTS:
            shown = self.cloud.run("project", "show", name, "--json")
            if shown.returncode != 0:
                problems.append(f"project show {name}: exit {shown.returncode} {shown.stderr.strip()}")
                continue
            used = json.loads(shown.stdout)["used"]
            for limit, most in limits.items():
                if used.get(limit, 0) > most:
                    problems.append(f"project {name} above its quota: {limit} {used.get(limit, 0)} > {most}")
            holding = [i["uuid"] for i in instances if i.get("project") == name and i["state"] in ("ACTIVE", "STOPPED")]
            if used.get("instances", 0) != len(holding):
                problems.append(f"project {name}: Placement counts {used.get('instances', 0)} instances, "
                                f"{len(holding)} hold something")
        records = {i["uuid"]: i.get("project", "default") for i in instances}
        views = self.cloud.etcdctl("get", "--prefix", "--keys-only", "/toyvm/v1/project-instances/").stdout.split()
        seen = {key.rsplit("/", 1)[1]: key.split("/")[-2] for key in views}
        if seen != records:
            problems.append(f"projects' views differ from the records: views {sorted(seen.items())}, "
                            f"records {sorted(records.items())}")
        return problems


def write_junit(path, name, problems, seconds):
    failure = f'<failure message="{escape(problems[0])}">{escape(chr(10).join(problems))}</failure>' if problems else ""
    pathlib.Path(path).write_text(
        f'<?xml version="1.0"?>\n<testsuites><testsuite name="chaos" tests="1" failures="{int(bool(problems))}">'
        f'<testcase classname="chaos" name="{escape(name)}" time="{seconds:.1f}">{failure}</testcase>'
        "</testsuite></testsuites>\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--junit", default="")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"chaos: seed {seed} ({args.seconds:.0f} s, {args.agents} agents); replay with --seed {seed}", flush=True)
    started = time.monotonic()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="toyvm-chaos-"))
    cloud = None
    problems, found, counts = [], [], {}
    try:
        cloud = ChaosCloud(args.build, workdir, args.agents)
        campaign = Campaign(cloud, seed)
        campaign.run(args.seconds)
        problems, found = campaign.settle()
        counts = campaign.counts
    except Exception as e:  # a server that never came back is a finding too
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        if cloud:
            cloud.shutdown()
    print("chaos: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for problem in problems:
        print(f"chaos: FAILED: {problem}")
    for d in found:
        print(f"chaos: discrepancy {d['kind']} {d['instance']} {d['provider']}: {d['detail']}")
    if args.junit:
        write_junit(args.junit, f"seed {seed}", problems, time.monotonic() - started)
    if problems or args.keep:
        print(f"chaos: logs in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
