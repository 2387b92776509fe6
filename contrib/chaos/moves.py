#!/usr/bin/env python3
"""A seeded campaign of moves with real guests: two libvirt daemons on this machine (the
first on qemu:///system, a second one as a second host, contrib/second-libvirtd.sh), an agent
on each, a few tiny guests (contrib/tiny-guest.sh) under QEMU, and live and cold moves,
resizes and host drains racing faults: agents killed -9 or stopped, either libvirtd killed -9
and started again, a migrate command killed halfway, etcd and Placement restarted, and stops,
starts, schedules and destroys. Then it lets things settle and requires: every instance runs in
exactly one domain across both daemons, on the host its record names (ACTIVE: running,
STOPPED: shut off), no destroyed instance left a domain, `toyvm audit` clean, no move in
flight; and every live move that completed kept its guest's uptime (its serial console counts
on over there, and it did not boot again). It prints the moves that completed, by kind, and
those that were undone. The seed fixes the sequence of operations and faults (what they meet
depends on timing); it is printed first, and `--seed` replays it.
"""

import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testbed"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from chaos import write_junit  # noqa: E402
from cloud import ROOT  # noqa: E402
from two_daemons import TwoDaemons, last_tick, qemu_started, virsh, wait_ticks  # noqa: E402

SMALL = "resources=VCPU:1,MEMORY_MB:128,DISK_GB:1"
BIGGER = ["resources=VCPU:2,MEMORY_MB:128,DISK_GB:1", "resources=VCPU:1,MEMORY_MB:160,DISK_GB:2"]
FINAL = {"ACTIVE", "STOPPED", "ERROR"}


class Campaign:
    def __init__(self, cloud, seed, guests):
        self.cloud = cloud
        self.rng = random.Random(seed)
        self.counts = {}
        self.log = open(cloud.dir / "campaign.log", "w")
        self.all = set()      # every instance this campaign made
        self.pending = {}     # uuid -> (kind, source, destination, ticks before) of a move asked
        self.problems = []
        self.uptime = []      # live moves whose guest did not count on over there
        self.wanted = guests

    def note(self, what, detail=""):
        self.counts[what] = self.counts.get(what, 0) + 1
        print(f"{time.monotonic():.1f} {what} {detail}", file=self.log, flush=True)

    def instances(self):
        """The instances, to pick what to act on: a listing that failed picks nothing."""
        try:
            return self.cloud.instances()
        except Exception:
            return []

    def schedule(self, count):
        result = self.cloud.run("schedule", SMALL, "--image", "tiny", "--count", str(count), "--wait", "--timeout",
                                "300", timeout=360)
        for line in result.stdout.splitlines():
            if line.startswith("NOTIFIED TARGET"):
                self.all.add(line.split()[-1])
        self.note("schedule", f"exit {result.returncode}")
        return result.returncode == 0

    def moving(self):
        """The instances with a move record, or None when etcd did not answer (restarted by the
        campaign, say): an empty answer then is not 'no move'."""
        done = self.cloud.etcdctl("get", "--prefix", "--keys-only", "/toyvm/v1/moves/")
        if done.returncode != 0:
            return None
        return {key.rsplit("/", 1)[-1] for key in done.stdout.split()}

    def follow_moves(self):
        """Moves asked earlier whose record has gone: completed or undone, and a live one that
        completed must not have rebooted its guest."""
        if not self.pending:
            return
        in_flight = self.moving()
        shown = self.cloud.run("show", "--json")
        if in_flight is None or shown.returncode != 0:
            return  # judged at a later round, once etcd answers
        records = {i["uuid"]: i for i in json.loads(shown.stdout or "[]")}
        for uuid in [u for u in self.pending if u not in in_flight]:
            kind, source, destination, ticks, query, mark = self.pending.pop(uuid)
            record = records.get(uuid)
            if not record:
                self.note(f"{kind}_gone")
                continue
            moved = record["host"] == destination
            if kind == "resize":  # in place or not, it holds its new size once resized
                moved = moved and self.holds(uuid, destination, query)
            if not moved:
                self.note(f"{kind}_undone")
                continue
            self.note(f"{kind}_completed", uuid)
            if kind != "live":
                continue
            if ticks == 0:  # still booting when it left: its marker and its count come later
                self.note("live_unchecked", uuid)
                continue
            name = self.cloud.host_name(destination)
            log = self.cloud.console_log(name, uuid) if name else None
            data = log.read_bytes() if log and log.exists() else b""
            # Only what the destination's log gained since the move was asked: a log left there
            # by an earlier stay holds that stay's boot.
            if mark and mark[0] == self.log_mark(destination, uuid, inode_only=True):
                data = data[mark[1]:]
            text = data.decode(errors="replace")
            # A guest that was counting when it left counts on there; one booted afresh would
            # print its marker again.
            if "toyvm-guest: booted" in text:
                states = {n: virsh(self.cloud.uris[n], "domstate", "--reason", uuid).stdout.strip() or "none"
                          for n in self.cloud.agents}
                self.uptime.append(f"live move of {uuid} to {name}: the guest booted again (domains: {states}; "
                                   f"console: {text[-300:]!r}; {self.diagnose(uuid, name)})")
            elif not wait_ticks(log, ticks):
                states = {n: virsh(self.cloud.uris[n], "domstate", "--reason", uuid).stdout.strip() or "none"
                          for n in self.cloud.agents}
                self.uptime.append(f"live move of {uuid} to {name}: its count did not go on past {ticks} "
                                     f"(domains: {states}; console: {text[-300:]!r}; {self.diagnose(uuid, name)})")
            else:
                self.note("live_counted_on", uuid)

    def files_left(self):
        """Instance dirs on a host other than the one its record names (printed, not judged: an
        earlier stay's files, which a guest moved back there would find)."""
        where = {i["uuid"]: self.cloud.host_name(i["host"]) for i in self.instances()}
        left = []
        for name in self.cloud.agents:
            instances = self.cloud.dir / name / "instances"
            for entry in sorted(instances.iterdir()) if instances.exists() else []:
                uuid = entry.name.split(".")[0]
                if uuid in self.all and where.get(uuid) != name:
                    left.append(f"{entry} ({'destroyed' if uuid not in where else 'on ' + str(where[uuid])})")
        return left

    def log_mark(self, provider, uuid, inode_only=False):
        """The destination's console log as it is now: (inode, size), or None without one."""
        name = self.cloud.host_name(provider)
        try:
            st = self.cloud.console_log(name, uuid).stat() if name else None
        except OSError:
            st = None
        if inode_only:
            return st.st_ino if st else None
        return (st.st_ino, st.st_size) if st else None

    def diagnose(self, uuid, name):
        """Where the guest's console goes and whether its vCPUs run: the console file, the files
        its QEMU and the log daemons hold open in its dir, and QEMU's own status."""
        out = []
        log = self.cloud.console_log(name, uuid)
        try:
            st = log.stat()
            out.append(f"log inode {st.st_ino} size {st.st_size} mtime {time.time() - st.st_mtime:.0f} s ago")
        except OSError as e:
            out.append(f"log: {e}")
        for pid in subprocess.run(["pgrep", "-f", f"{uuid}|virtlogd"], capture_output=True, text=True).stdout.split():
            try:
                cmd = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
                held = []
                for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
                    try:
                        target = os.readlink(fd)
                    except OSError:
                        continue
                    if uuid in target or target.startswith("pipe:"):
                        held.append(f"{fd.name}->{target}")
                out.append(f"{cmd}[{pid}] {' '.join(held[:12])}")
            except OSError:
                continue
        status = virsh(self.cloud.uris[name], "qemu-monitor-command", "--hmp", uuid, "info status")
        out.append(f"qemu: {(status.stdout or status.stderr).strip()}")
        return "; ".join(out)

    def holds(self, uuid, provider, query):
        """Whether the instance holds what `query` asks on `provider` in Placement."""
        wanted = dict(pair.split(":") for pair in query.split("=", 1)[1].split(","))
        try:
            held = self.cloud.placement_get(f"/allocations/{uuid}")["allocations"].get(provider, {})
        except Exception:
            return False
        return {k: str(v) for k, v in held.get("resources", {}).items()} == wanted

    def pick(self, states):
        candidates = [i for i in self.instances() if i["state"] in states and i["uuid"] not in self.pending]
        return candidates[self.rng.randrange(1 << 30) % len(candidates)] if candidates else None

    def ticks(self, instance):
        """The guest's count now, 0 unless it counts in this boot: a guest started again (a stop
        and start, a resize, a cold move) prints nothing for seconds (its kernel is quiet), and
        its log ends with the boot before's count, written before its QEMU started."""
        name = self.cloud.host_name(instance["host"])
        if not name:
            return 0
        log = self.cloud.console_log(name, instance["uuid"])
        count = last_tick(log)
        started = qemu_started(instance["uuid"])
        try:
            if count and started and started > log.stat().st_mtime:
                return 0
        except OSError:
            return 0
        return count

    def ask_move(self, kind):
        instance = self.pick({"ACTIVE"} if kind == "live" else {"ACTIVE", "STOPPED"})
        if kind == "live":  # a guest counting already, when there is one: its uptime is checked
            counting = [i for i in self.instances()
                        if i["state"] == "ACTIVE" and i["uuid"] not in self.pending and self.ticks(i) > 0]
            if counting:
                instance = counting[self.rng.randrange(1 << 30) % len(counting)]
        if not instance:
            return
        uuid, source = instance["uuid"], instance["host"]
        ticks = self.ticks(instance)
        query = self.rng.choice(BIGGER) if kind == "resize" else ""
        if kind == "resize":
            args = ["resize", uuid, query, "--no-wait"]
        else:
            args = ["migrate", uuid, "--no-wait", *(["--cold"] if kind == "cold" else [])]
        result = self.cloud.run(*args, timeout=120)
        self.note(f"ask_{kind}", f"exit {result.returncode} {result.stdout.strip()} {result.stderr.strip()}")
        if result.returncode == 0:
            words = result.stdout.split()
            destination = words[words.index("ON" if kind == "resize" else "TO") + 1]
            if kind == "live" and "(cold)" in words:  # stopped meanwhile: a plain migrate moves it cold
                kind = "cold"
            self.pending[uuid] = (kind, source, destination, ticks, query, self.log_mark(destination, uuid))

    def operation(self):
        rng, cloud = self.rng, self.cloud
        kind = rng.choices(["live", "cold", "resize", "drain", "stop", "start", "schedule", "destroy",
                            "killed_command"], weights=[6, 2, 2, 1, 1, 1, 1, 1, 1])[0]
        if kind in ("live", "cold", "resize"):
            self.ask_move(kind)
        elif kind == "drain":
            name = rng.choice(cloud.agents)
            drained = cloud.run("host", "drain", name, "--parallel", "2", "--timeout", "120", timeout=600)
            lines = drained.stdout.splitlines()
            moved = sum(line.startswith("MOVED") for line in lines)
            # A guest the drain moved (or asked again, cold) is the drain's: a move of it asked
            # earlier ended before, and is not the one that took it there.
            for line in lines:
                if line.startswith(("MOVED INSTANCE", "UNDONE INSTANCE")):
                    uuid = line.split()[2].rstrip(":")
                    if self.pending.pop(uuid, None):
                        self.note("superseded_by_drain", uuid)
            self.counts["drain_moved"] = self.counts.get("drain_moved", 0) + moved
            self.note(kind, f"{name} exit {drained.returncode}, {moved} moved, "
                            f"{sum(line.startswith('STAYED') for line in lines)} stayed")
            cloud.run("host", "enable", name)
        elif kind in ("stop", "start"):
            instance = self.pick({"ACTIVE"} if kind == "stop" else {"STOPPED"})
            if instance:
                result = cloud.run(kind, instance["uuid"], "--no-wait")
                self.note(kind, f"exit {result.returncode}")
        elif kind == "schedule":
            if len([i for i in self.instances() if i["state"] != "ERROR"]) < self.wanted + 1:
                self.schedule(1)
        elif kind == "destroy":
            instance = self.pick({"ACTIVE", "STOPPED"})
            if instance and len(self.instances()) > max(2, self.wanted - 1):
                result = cloud.run("destroy", instance["uuid"], "--no-wait")
                self.note(kind, f"exit {result.returncode}")
        else:
            # A migrate command killed halfway: the agents finish or undo its move.
            instance = self.pick({"ACTIVE"})
            if instance:
                proc = subprocess.Popen([cloud.toyvm, "migrate", instance["uuid"]], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=cloud.env, start_new_session=True)
                time.sleep(rng.uniform(0, 4))  # the moment it dies: part of the campaign's mix
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.note(kind)

    def fault(self):
        rng, cloud = self.rng, self.cloud
        kind = rng.choices(["kill_agent", "term_agent", "kill_libvirtd", "restart_etcd", "restart_placement"],
                           weights=[4, 2, 3, 1, 1])[0]
        name = rng.choice(cloud.agents)
        try:
            if kind in ("kill_agent", "term_agent"):
                cloud.stop(name, signal.SIGKILL if kind == "kill_agent" else signal.SIGTERM)
                time.sleep(rng.uniform(0, 3))  # down for a moment, as a restart under systemd
                cloud.start_agent(name)
            elif kind == "kill_libvirtd":
                cloud.kill_libvirtd(name)
            elif kind == "restart_etcd":
                cloud.restart_etcd()
            else:
                cloud.restart_placement()
            self.note(kind, name)
        except (RuntimeError, subprocess.SubprocessError, OSError, ValueError) as e:
            self.note(kind, f"not done: {e}")

    def run(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.rng.random() < 0.25:
                self.fault()
            else:
                self.operation()
            self.follow_moves()
            time.sleep(self.rng.uniform(0, 2))

    def settle(self):
        cloud = self.cloud
        for name in cloud.agents:
            if cloud.procs[name].poll() is not None:
                cloud.start_agent(name)
        for name in cloud.agents:
            cloud.wait_agent(name, 120)
        deadline = time.monotonic() + 300
        while True:
            self.follow_moves()
            try:
                instances, unlisted = cloud.instances(), None
            except RuntimeError as e:  # unknown is not settled
                instances, unlisted = [], str(e)
            not_final = [i for i in instances if i["state"] not in FINAL]
            audit = cloud.run("audit")
            if (not unlisted and not not_final and self.moving() == set() and audit.returncode == 0) \
                    or time.monotonic() > deadline:
                break
            time.sleep(1)  # the polling interval
        problems = self.problems
        if unlisted:
            problems.append(f"the instances not listed: {unlisted}")
            return problems
        if audit.returncode != 0:
            problems.append(f"toyvm audit exit {audit.returncode}: {audit.stdout.strip()} {audit.stderr.strip()}")
        if not_final:
            problems.append("not settled: " + ", ".join(f"{i['uuid']} {i['state']}" for i in not_final))
        moving = self.moving()
        if moving is None:
            problems.append("etcd did not answer for the moves in flight")
        elif moving:
            problems.append(f"moves still in flight: {' '.join(sorted(moving))}")
        # Exactly one domain per instance, where its record says, in the state it says.
        domains = {name: cloud.domains(name) for name in cloud.agents}
        by_uuid = {i["uuid"]: i for i in instances}
        for uuid in sorted(self.all):
            where = [name for name in cloud.agents if uuid in domains[name]]
            record = by_uuid.get(uuid)
            if not record or record["state"] == "ERROR":
                if where:
                    problems.append(f"{uuid} ({record['state'] if record else 'destroyed'}) has a domain on {where}")
                continue
            host = cloud.host_name(record["host"])
            expected = "running" if record["state"] == "ACTIVE" else "shut off"
            if where != [host]:
                problems.append(f"{uuid} ({record['state']} on {host}) has domains on {where}")
            elif domains[host][uuid] != expected:
                problems.append(f"{uuid} is {record['state']} on {host}, its domain {domains[host][uuid]}")
        return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--guests", type=int, default=3)
    parser.add_argument("--junit", default="")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"moves: seed {seed} ({args.seconds:.0f} s, {args.guests} guests); replay with --seed {seed}", flush=True)
    started = time.monotonic()
    tiny = args.build / "tiny-guest"
    subprocess.run([str(ROOT / "contrib" / "tiny-guest.sh"), str(tiny)], check=True, stdout=subprocess.DEVNULL)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="toyvm-moves-"))
    workdir.chmod(0o755)  # QEMU runs as its own user and reaches the guests' disks in here
    cloud, campaign = None, None
    problems = []
    try:
        cloud = TwoDaemons(args.build, workdir, tiny)
        campaign = Campaign(cloud, seed, args.guests)
        if not campaign.schedule(args.guests):
            raise RuntimeError("the first guests did not become ACTIVE")
        campaign.run(args.seconds)
        problems = campaign.settle()
        for left in campaign.files_left():
            print(f"moves: files left: {left}")
        problems += campaign.uptime
    except Exception as e:  # a server or daemon that never came back is a finding too
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        if cloud:
            for uuid in campaign.all if campaign else ():
                try:
                    cloud.run("destroy", uuid, timeout=120)
                except subprocess.TimeoutExpired:
                    problems.append(f"destroy {uuid} did not end within 120 s")
            cloud.shutdown()
    counts = campaign.counts if campaign else {}
    print("moves: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    completed = {k: v for k, v in counts.items() if k.endswith("_completed") or k == "drain_moved"}
    print("moves: completed " + (", ".join(f"{k} {v}" for k, v in sorted(completed.items())) or "none"))
    for problem in problems:
        print(f"moves: FAILED: {problem}")
    if args.junit:
        write_junit(args.junit, f"moves seed {seed}", problems, time.monotonic() - started)
    if problems or args.keep:
        print(f"moves: logs in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
