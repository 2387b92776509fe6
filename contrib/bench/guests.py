"""The benchmark's real guests (contrib/tiny-guest.sh) through qemu:///system: schedule ->
ACTIVE with an IP, step by step, and what a start costs without toyvm."""

import datetime
import os
import re
import statistics
import subprocess
import threading
import time

from cloud import ROOT, wait_until

LEASES = "/var/lib/libvirt/dnsmasq/virbr0.status"  # the default network's leases


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
