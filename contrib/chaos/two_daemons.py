"""Two libvirt daemons on this machine as two hosts (the first on qemu:///system, the second
contrib/second-libvirtd.sh's), an agent on each, and readers of what their guests leave: the
tiny guest's count on its serial console, when its QEMU started, the daemons' domains."""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testbed"))
from cloud import ROOT, Cloud, wait_until  # noqa: E402

INVENTORY = "VCPU:8,MEMORY_MB:2048,DISK_GB:40"
SECOND_DIR = pathlib.Path("/var/lib/toyvm-test/libvirtd-b")  # contrib/second-libvirtd.sh's default
TICK = re.compile(r"toyvm-guest: tick (\d+)")


def last_tick(path):
    """The guest's count in this boot: 0 until a guest that booted again (a resize, a cold move,
    a stop and start) counts, though its log still holds the boot before. A boot begins with
    the kernel's first line, before the guest's own marker."""
    try:
        text = pathlib.Path(path).read_text(errors="replace")
    except OSError:
        return 0
    boot = max(text.rfind("toyvm-guest: booted"), text.rfind("] Linux version "), 0)
    ticks = TICK.findall(text[boot:])
    return int(ticks[-1]) if ticks else 0


def qemu_started(uuid):
    """When the newest QEMU running the guest started (seconds since the epoch), or None."""
    booted = time.time() - float(pathlib.Path("/proc/uptime").read_text().split()[0])
    newest = None
    found = subprocess.run(["pgrep", "-f", f"guest=toyvm-{uuid}"], capture_output=True, text=True).stdout.split()
    for pid in found:
        try:  # starttime, the 22nd field, in clock ticks since boot; the name may hold spaces
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            started = booted + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            continue
        newest = started if newest is None else max(newest, started)
    return newest


def virsh(uri, *args):
    return subprocess.run(["virsh", "-q", "-c", uri, *args], capture_output=True, text=True, timeout=60)


class TwoDaemons(Cloud):
    """etcd, Placement and two agents: c1 on the first libvirtd, c2 on the second."""

    def __init__(self, build, dir, tiny):
        subprocess.run([str(ROOT / "contrib" / "start-libvirtd.sh")], check=True)
        started = subprocess.run([str(ROOT / "contrib" / "second-libvirtd.sh"), "start"], check=True,
                                 capture_output=True, text=True)
        self.second_uri, first_from_second = started.stdout.split()[:2]
        self.uris = {"c1": "qemu:///system", "c2": self.second_uri}
        super().__init__(build, dir)
        images = dir / "images" / "tiny"
        images.mkdir(parents=True)
        for name in ("kernel", "initrd", "cmdline", "disk.raw"):
            shutil.copy(tiny / name, images / name)
        common = ("[compute]\ndomain_type = 'qemu'\nnetwork = 'default'\nstop_timeout = 10\nlease_ttl = 4\n"
                  f"resync_interval = 5\nmove_prepare_timeout = 60\nimage_dir = '{dir / 'images'}'\n"
                  "move_address = '127.0.0.1'\n")
        self.configs = {
            # c1 serves its guests' metadata on their bridge: they start counting at once.
            "c1": common + f"move_libvirt_uri = '{first_from_second}'\nmetadata_interface = 'virbr0'\n"
                           "[mdserver]\nlisten = ['169.254.169.254:80']\n",
            # Two daemons in one network namespace break each other's ebtables chains when both
            # change them at once: filters on one side only (as the guests suite does).
            "c2": common + f"move_libvirt_uri = '{self.second_uri}'\nguest_filter = ''\n",
        }
        self.agents = ["c1", "c2"]
        for name in self.agents:
            (dir / f"{name}.toml").write_text(self.configs[name])
            self.start_agent(name)
        for name in self.agents:
            self.wait_agent(name, 120)

    def start_agent(self, name, inventory=INVENTORY, config=None):
        return super().start_agent(name, inventory, config or self.dir / f"{name}.toml", libvirt_uri=self.uris[name])

    def console_log(self, name, uuid):
        return self.dir / name / "instances" / uuid / "console.log"

    def host_name(self, provider):
        return next((name for name in self.agents if self.provider(name) == provider), None)

    def domains(self, name):
        """The toyvm domains the daemon of `name` has: uuid -> 'running' / 'shut off' / ..."""
        listed = virsh(self.uris[name], "list", "--all", "--uuid")
        out = {}
        for uuid in listed.stdout.split():
            state = virsh(self.uris[name], "domstate", uuid).stdout.strip()
            out[uuid] = state
        return out

    def kill_libvirtd(self, name):
        """The daemon of `name` killed -9, as a host's daemon dies, and started again (its guests'
        QEMU processes live on, and it finds them again)."""
        pidfile = SECOND_DIR / "libvirtd.pid" if name == "c2" else pathlib.Path("/run/libvirtd.pid")
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGKILL)
        wait_until("libvirtd gone", lambda: not pathlib.Path(f"/proc/{pid}").exists(), 30)
        script = "second-libvirtd.sh" if name == "c2" else "start-libvirtd.sh"
        subprocess.run([str(ROOT / "contrib" / script), *(["start"] if name == "c2" else [])], check=True,
                       capture_output=True, timeout=120)


def wait_ticks(log, ticks, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log and last_tick(log) > ticks:
            return True
        time.sleep(0.5)  # the console is written as the guest counts
    return False

