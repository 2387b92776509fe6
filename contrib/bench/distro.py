#!/usr/bin/python3
"""From `toyvm schedule` to an ssh login on a Debian 12 guest (contrib/debian-image.sh) under
TCG, split into toyvm's part, QEMU and the kernel, and cloud-init; once with the metadata
service and once with a config drive (and no metadata service), ROUNDS times each, alternating.

The parts, on the host's clock from the start of `schedule`:
  toyvm       schedule -> ACTIVE (the claim, the hand-over, the build: the domain is started)
  qemu+kernel ACTIVE -> the guest's userspace starts (its uptime and systemd-analyze)
  systemd     userspace -> cloud-init's first stage starts
  cloud-init  its first stage -> the first ssh login that works (the key is in place, sshd up)
and, apart, cloud-init's whole run (its first stage to the end of its last).

  usage: distro.py --build DIR [--rounds 2]      (as root: libvirtd, qemu:///system)
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testbed"))
from cloud import Cloud, ROOT, wait_until  # noqa: E402

IMAGES = pathlib.Path("/var/cache/toyvm")
FLAVOR = "resources=VCPU:1,MEMORY_MB:512,DISK_GB:3"


def ssh(key, ip, command, timeout=30):
    return subprocess.run(["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
                           f"debian@{ip}", command], capture_output=True, text=True, timeout=timeout)


def systemd_times(text):
    """{'kernel': s, 'initrd': s, 'userspace': s} from systemd-analyze's first line."""
    line = text.splitlines()[0]
    parts = {}
    for chunk in line.split("in", 1)[1].split("=")[0].split("+"):
        value, _, name = chunk.strip().partition(" (")
        seconds = 0.0
        for piece in value.split():
            if piece.endswith("ms"):
                seconds += float(piece[:-2]) / 1000
            elif piece.endswith("min"):
                seconds += float(piece[:-3]) * 60
            elif piece.endswith("s"):
                seconds += float(piece[:-1])
        parts[name.rstrip(")")] = seconds
    return parts


def one_boot(cloud, key, config_drive):
    args = [cloud.toyvm, "schedule", FLAVOR, "--image", "debian-12", "--name", "bench", "--key-file",
            f"{key}.pub", "--wait", "--timeout", "900"]
    if config_drive:
        args.append("--config-drive")
    start = time.monotonic()
    marks = {}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=cloud.env)
    uuid = ""
    for line in proc.stdout:
        now = time.monotonic() - start
        if line.startswith("NOTIFIED TARGET"):
            uuid = line.split()[-1]
            marks["notified"] = now
        elif "ACTIVE" in line and "active" not in marks:
            marks["active"] = now
    if proc.wait() != 0 or not uuid:
        raise RuntimeError(f"schedule failed ({proc.returncode})")
    ip = json.loads(cloud.run("show", uuid, "--json").stdout)["ip"]
    wait_until("ssh", lambda: ssh(key, ip, "true").returncode == 0, 900)
    marks["ssh"] = time.monotonic() - start
    # The guest's uptime at a known host time places its boot on the host's clock.
    facts = ssh(key, ip, "cloud-init status --wait >/dev/null; cat /proc/uptime; date +%s.%N; "
                "cat /run/cloud-init/status.json; systemd-analyze", timeout=900)
    answered = time.monotonic() - start
    lines = facts.stdout.splitlines()
    uptime, guest_now = float(lines[0].split()[0]), float(lines[1])
    end = next(i for i, l in enumerate(lines) if l.startswith("Startup finished"))
    status = json.loads("\n".join(lines[2:end]))["v1"]
    boot = systemd_times(lines[end])
    # uptime was read at the end of the command, after the status wait: place it at `answered`.
    kernel_start = answered - uptime
    userspace = kernel_start + boot.get("kernel", 0) + boot.get("initrd", 0)
    first_stage = min(status[s]["start"] for s in ("init-local", "init", "modules-config", "modules-final")
                      if status.get(s, {}).get("start"))
    last_stage = max(status[s]["finished"] for s in ("init-local", "init", "modules-config", "modules-final")
                     if status.get(s, {}).get("finished"))
    cloud_init_start = answered - (guest_now - first_stage)
    cloud.run("destroy", uuid, "--timeout", "120", timeout=150)
    return {
        "toyvm": marks["active"],
        "qemu+kernel": userspace - marks["active"],
        "systemd": cloud_init_start - userspace,
        "cloud-init": marks["ssh"] - cloud_init_start,
        "total": marks["ssh"],
        "cloud-init run": last_stage - first_stage,
        "datasource": status.get("datasource", ""),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    subprocess.run([str(ROOT / "contrib" / "start-libvirtd.sh")], check=True)
    subprocess.run([str(ROOT / "contrib" / "debian-image.sh"), str(IMAGES / "debian-12")], check=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="toyvm-distro-bench-"))
    work.chmod(0o755)  # QEMU runs as its own user on qemu:///system and opens the overlays here
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cloud = Cloud(pathlib.Path(args.build), work)
    config = work / "agent.toml"
    config.write_text("[compute]\nlibvirt_uri = 'qemu:///system'\ndomain_type = 'qemu'\n"
                      f"image_dir = '{IMAGES}'\nnetwork = 'default'\naddress_timeout = 900\n"
                      "metadata_interface = 'virbr0'\n[mdserver]\nlisten = ['169.254.169.254:80']\n")
    cloud.start_agent("c1", "VCPU:4,MEMORY_MB:4096,DISK_GB:40", config, libvirt_uri=None)  # the config's URI
    results = {False: [], True: []}
    try:
        wait_until("the agent", lambda: cloud.agent_alive("c1"), 60)
        for _ in range(args.rounds):
            for drive in (False, True):
                results[drive].append(one_boot(cloud, key, drive))
                print(("config drive " if drive else "metadata     ") + json.dumps(results[drive][-1]), flush=True)
    finally:
        cloud.shutdown()
    print()
    print(f"schedule -> ssh login of Debian 12 under TCG, median of {args.rounds} (seconds)")
    names = ["toyvm", "qemu+kernel", "systemd", "cloud-init", "total", "cloud-init run"]
    print(f"| {'':16} | " + " | ".join(f"{n:>14}" for n in names) + " |")
    for drive in (False, True):
        row = [statistics.median(r[n] for r in results[drive]) for n in names]
        label = "config drive" if drive else "metadata service"
        print(f"| {label:16} | " + " | ".join(f"{v:14.2f}" for v in row) + " |")


if __name__ == "__main__":
    main()
