"""A private cloud on loopback for the benchmark, the fault campaign, the scale and the
evacuation runs: etcd (one member or a cluster), Placement under uWSGI (sqlite or a private
PostgreSQL) and toyvm compute agents (on libvirt's test driver unless told otherwise), each a
process of its own in one directory."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]


def prometheus_metrics(url):
    """The counters and gauges `url`/metrics serves, as name (with labels) -> value."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


_handed_out = set()


def free_port():
    """A free port on loopback, never one handed out before in this process: the kernel offers
    a port it has just freed again, and two servers given one port cannot both listen."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def wait_until(what, check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def postgres_bin():
    for version in ("15", "16", "14", "13"):
        path = pathlib.Path(f"/usr/lib/postgresql/{version}/bin")
        if (path / "initdb").exists():
            return path
    raise RuntimeError("PostgreSQL is not installed (contrib/install-deps.sh installs it)")


class Cloud:
    """`toyvm`: the binary to run, if not the one in `build`."""

    def __init__(self, build, dir, etcd_members=1, postgresql=False, placement_workers=2, toyvm=None):
        self.toyvm = str(toyvm or build / "toyvm" / "toyvm")
        self.dir = dir
        self.procs = {}
        self.etcd = [(free_port(), free_port()) for _ in range(etcd_members)]
        self.etcd_urls = [f"http://127.0.0.1:{client}" for client, _ in self.etcd]
        self.etcd_url = ",".join(self.etcd_urls)
        for index in range(etcd_members):
            self.start_etcd(index)
        wait_until("etcd", lambda: self.run("--etcd", self.etcd_url, "show").returncode == 0, 30)
        database = self.start_postgresql() if postgresql else ""
        port = self.placement_port = free_port()
        self.placement_url = f"http://127.0.0.1:{port}"
        self.placement_log = dir / "placement" / "uwsgi.log"  # its request log (placement-setup.sh)
        subprocess.run([str(ROOT / "contrib" / "placement-setup.sh"), str(dir / "placement"), str(port), "",
                        str(placement_workers), database], check=True, stdout=subprocess.DEVNULL)
        self.start_placement()
        self.env = dict(os.environ, TOYVM_ETCD=self.etcd_url, TOYVM_PLACEMENT=self.placement_url)

    def spawn(self, key, args, env=None):
        log = open(self.dir / f"{key}.log", "a")
        self.procs[key] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=env, start_new_session=True)
        return self.procs[key]

    def start_etcd(self, index=0):
        cluster = ",".join(f"e{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(self.etcd))
        client, peer = self.etcd[index]
        self.spawn(f"etcd{index}", [
            "etcd", "--name", f"e{index}", "--data-dir", str(self.dir / f"etcd{index}"), "--logger=zap",
            "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls",
            f"http://127.0.0.1:{client}", "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}", "--initial-cluster", cluster,
            "--initial-cluster-token", "toyvm-testbed"])

    def restart_etcd(self):
        for index in range(len(self.etcd)):
            self.stop(f"etcd{index}", signal.SIGKILL)
        for index in range(len(self.etcd)):
            self.start_etcd(index)
        wait_until("etcd", lambda: self.run("show").returncode == 0, 30)

    def compact_etcd(self):
        """etcd's history compacted up to its current revision, as its auto-compaction does
        over time: watches that start from before it are refused."""
        status = self.etcdctl("endpoint", "status", "-w", "json")
        status.check_returncode()
        revision = max(member["Status"]["header"]["revision"] for member in json.loads(status.stdout))
        compacted = self.etcdctl("compact", str(revision))
        # Nothing written since the last compaction: etcd says so, and there is nothing to do.
        if compacted.returncode != 0 and "has been compacted" not in compacted.stderr:
            raise RuntimeError(f"etcdctl compact {revision}: {compacted.stderr.strip()}")
        return revision

    def etcdctl(self, *args):
        return subprocess.run(["etcdctl", "--endpoints", self.etcd_url, *args], capture_output=True, text=True,
                              timeout=30)

    def start_postgresql(self):
        bin, data, port = postgres_bin(), self.dir / "pg", free_port()
        os.chmod(self.dir, 0o755)
        data.mkdir()
        shutil.chown(data, "postgres")
        subprocess.run(["runuser", "-u", "postgres", "--", str(bin / "initdb"), "-D", str(data), "-A", "trust",
                        "-U", "postgres"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.spawn("postgres", ["runuser", "-u", "postgres", "--", str(bin / "postgres"), "-D", str(data), "-p",
                                str(port), "-h", "127.0.0.1", "-k", str(data), "-c", "max_connections=300"])
        wait_until("PostgreSQL", lambda: subprocess.run([str(bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p",
                                                         str(port)]).returncode == 0, 30)
        subprocess.run(["runuser", "-u", "postgres", "--", "psql", "-q", "-h", "127.0.0.1", "-p", str(port), "-c",
                        "CREATE DATABASE placement"], check=True, stdout=subprocess.DEVNULL)
        return f"postgresql+psycopg2://postgres@127.0.0.1:{port}/placement"

    def start_placement(self):
        self.spawn("placement", ["uwsgi", "--ini", str(self.dir / "placement" / "uwsgi.ini")])
        wait_until("Placement", lambda: urllib.request.urlopen(self.placement_url + "/").status == 200, 30)

    def restart_placement(self):
        self.stop("placement", signal.SIGKILL)
        # Its workers are killed with it, but may hold the port a moment longer.
        wait_until("Placement's port to close", lambda: not self.port_open(self.placement_port), 30)
        self.start_placement()

    @staticmethod
    def port_open(port):
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def start_agent(self, name, inventory, config=None, extra=(), libvirt_uri="test:///default", verbose=False):
        """An agent with its state in `dir`/`name`; `extra`: more `compute` arguments; with
        `libvirt_uri` None, the URI is the config's."""
        options = [*(["-v"] if verbose else []), *(["--config", str(config)] if config else [])]
        uri = ["--libvirt-uri", libvirt_uri] if libvirt_uri else []
        return self.spawn(name, [self.toyvm, *options, "compute", "--state-dir", str(self.dir / name), *uri,
                                 "--inventory", inventory, "--name", name, *extra], self.env)

    def provider(self, name):
        path = self.dir / name / "provider_uuid"
        return path.read_text().strip() if path.exists() else ""

    def agent_alive(self, name):
        provider = self.provider(name)
        return provider and any(h["provider"] == provider and h["alive"] for h in self.hosts())

    def wait_agent(self, name, timeout=30):
        """Waits until the agent `name` is registered and alive; its provider."""
        wait_until(f"agent {name}", lambda: self.agent_alive(name), timeout)
        return self.provider(name)

    def stop(self, key, sig):
        proc = self.procs.get(key)
        if proc and proc.poll() is None:
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def run(self, *args, timeout=120):
        return subprocess.run([self.toyvm, *args], capture_output=True, text=True, env=getattr(self, "env", None),
                              timeout=timeout)

    def hosts(self):
        return json.loads(self.run("show", "--hosts", "--json").stdout or "[]")

    def instances(self):
        return json.loads(self.run("show", "--json").stdout or "[]")

    def placement_get(self, path):
        request = urllib.request.Request(self.placement_url + path, headers={
            "X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"})
        return json.load(urllib.request.urlopen(request, timeout=30))

    def overbooked_usages(self):
        """(provider, resource class, usage) wherever usage exceeds (total - reserved) x
        allocation_ratio."""
        bad = []
        for rp in self.placement_get("/resource_providers")["resource_providers"]:
            inventories = self.placement_get(f"/resource_providers/{rp['uuid']}/inventories")["inventories"]
            usages = self.placement_get(f"/resource_providers/{rp['uuid']}/usages")["usages"]
            for rc, used in usages.items():
                inv = inventories.get(rc)
                if inv and used > (inv["total"] - inv["reserved"]) * inv["allocation_ratio"]:
                    bad.append((rp["uuid"], rc, used))
        return bad

    def overbooked(self):
        """Each usage over capacity as "provider resource-class usage"."""
        return [f"{rp} {rc} {used}" for rp, rc, used in self.overbooked_usages()]

    def overbooked_providers(self):
        """The providers with any usage over capacity."""
        return {rp for rp, _, _ in self.overbooked_usages()}

    def etcd_metrics(self, member=0):
        """etcd's Prometheus counters and gauges, as name (with labels) -> value."""
        return prometheus_metrics(self.etcd_urls[member])

    def shutdown(self):
        """The agents, then the servers: each group asked to stop at once, then waited for."""
        servers = {"placement", "postgres"} | {f"etcd{i}" for i in range(len(self.etcd))}
        self.stop_all([p for k, p in self.procs.items() if k not in servers])
        self.stop_all([p for k, p in self.procs.items() if k in servers])

    @staticmethod
    def stop_all(procs):
        running = [p for p in procs if p.poll() is None]
        for proc in running:
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


