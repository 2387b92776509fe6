"""A private cloud on loopback for the benchmark, the fault campaign, the scale and the
evacuation runs: etcd (one member or a cluster) and Placement under uWSGI (sqlite or a private
PostgreSQL), started by the tests' own testbed (toyvm-testbed, tests/integration/testbed.cpp),
and toyvm compute agents (on libvirt's test driver unless told otherwise), each a process of
its own in one directory."""

import concurrent.futures
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import tomllib
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


def wait_until(what, check, timeout=30.0, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except Exception:
            pass
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


class Cloud:
    """`toyvm`: the binary to run, if not the one in `build`."""

    def __init__(self, build, dir, etcd_members=1, postgresql=False, placement_workers=2, toyvm=None,
                 etcd_secure=False, etcd_args=()):
        self.toyvm = str(toyvm or build / "toyvm" / "toyvm")
        self.dir = dir
        self.procs = {}
        args = [str(build / "tests" / "integration" / "toyvm-testbed"), "--dir", str(dir), "--etcd-members",
                str(etcd_members), "--placement-workers", str(placement_workers),
                *(f"--etcd-arg={arg}" for arg in etcd_args)]
        log = open(dir / "testbed.log", "a")
        if etcd_secure:  # TLS with client certificates, and etcd's auth: root for toyvm's own processes
            args += ["--etcd-tls", "--etcd-auth"]
        self.testbed = subprocess.Popen([*args, *(["--postgresql"] if postgresql else [])], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        servers = self.ask(None)
        self.etcd_urls = servers["etcd"]
        self.etcd_url = ",".join(self.etcd_urls)
        self.placement_url = servers["placement"]
        self.placement_port = int(self.placement_url.rsplit(":", 1)[1])
        self.placement_log = dir / "placement" / "uwsgi.log"  # its request log (placement-setup.sh)
        self.env = dict(os.environ, TOYVM_ETCD=self.etcd_url, TOYVM_PLACEMENT=self.placement_url)
        self.pki = pathlib.Path(servers.get("pki", ""))
        self.etcdctl_auth = []  # etcdctl as root, where etcd asks who it is
        if etcd_secure:
            self.env["TOYVM_CONFIG"] = servers["config"]
            etcd = tomllib.loads(pathlib.Path(servers["config"]).read_text())["etcd"]
            self.etcdctl_auth = [f"--{flag}={etcd[key]}" for flag, key in
                                 (("cacert", "ca_file"), ("cert", "cert_file"), ("key", "key_file")) if key in etcd]
            if etcd.get("password"):
                self.etcdctl_auth.append(f"--user={etcd['user']}:{etcd['password']}")

    def member_config(self, user):
        """A configuration file for etcd user `user`, signed in by a client certificate of its own."""
        self.ask(f"client-cert {user}")
        path = self.dir / f"{user}.toml"
        path.write_text(f"[etcd]\nca_file = '{self.pki}/ca.crt'\ncert_file = '{self.pki}/{user}.crt'\n"
                        f"key_file = '{self.pki}/{user}.key'\nuser = '{user}'\n")
        return path

    def ask(self, command):
        """One command to the testbed (none: its first line), and its answer."""
        if command:
            self.testbed.stdin.write(command + "\n")
            self.testbed.stdin.flush()
        line = self.testbed.stdout.readline()
        if not line:
            raise RuntimeError(f"the testbed ended: {(self.dir / 'testbed.log').read_text()[-2000:]}")
        answer = json.loads(line)
        if not answer.get("ok", True):
            raise RuntimeError(f"testbed: {command}: {answer.get('error')}")
        return answer

    def spawn(self, key, args, env=None):
        log = open(self.dir / f"{key}.log", "a")
        self.procs[key] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=env, start_new_session=True)
        return self.procs[key]

    def restart_etcd(self):
        """Every member killed (-9) and started again on its data."""
        self.ask("restart-etcd")

    def compact_etcd(self):
        """etcd's history compacted up to its current revision, as its auto-compaction does
        over time: watches that start from before it are refused."""
        return self.ask("compact-etcd")["revision"]

    def etcdctl(self, *args):
        return subprocess.run(["etcdctl", "--endpoints", self.etcd_url, *self.etcdctl_auth, *args],
                              capture_output=True, text=True,
                              timeout=30)

    def restart_placement(self):
        """uWSGI killed (-9) and started again on the same database."""
        self.ask("restart-placement")

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

    def listing(self, *args):
        """`toyvm show ARGS --json`, parsed; raises RuntimeError when it fails (etcd restarting or
        busy): a listing that failed is no empty cloud."""
        listed = self.run("show", *args, "--json")
        if listed.returncode != 0:
            raise RuntimeError(f"toyvm show {' '.join(args)}: exit {listed.returncode}: {listed.stderr.strip()[-200:]}")
        return json.loads(listed.stdout)

    def answered_listing(self, *args, timeout=60):
        """`listing`, asked again until it answers or `timeout` s have passed."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.listing(*args)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(1)  # the polling interval

    def hosts(self):
        return self.listing("--hosts")

    def instances(self):
        return self.listing()

    def placement_get(self, path):
        request = urllib.request.Request(self.placement_url + path, headers={
            "X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"})
        return json.load(urllib.request.urlopen(request, timeout=30))

    def overbooked_usages(self):
        """(provider, resource class, usage) wherever usage exceeds (total - reserved) x
        allocation_ratio."""
        def over(rp):
            inventories = self.placement_get(f"/resource_providers/{rp['uuid']}/inventories")["inventories"]
            usages = self.placement_get(f"/resource_providers/{rp['uuid']}/usages")["usages"]
            return [(rp["uuid"], rc, used) for rc, used in usages.items()
                    if (inv := inventories.get(rc)) and used > (inv["total"] - inv["reserved"]) * inv["allocation_ratio"]]
        # Two requests a provider: at 10,000 providers, asked eight at a time.
        providers = self.placement_get("/resource_providers")["resource_providers"]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return [bad for found in pool.map(over, providers) for bad in found]

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
        """The agents (asked to stop at once, then waited for), then the servers: the testbed
        stops them at the end of its input."""
        self.stop_all(list(self.procs.values()))
        if self.testbed.poll() is None:
            self.testbed.stdin.close()
            try:
                self.testbed.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.testbed.pid, signal.SIGKILL)
                self.testbed.wait()

    def finish(self, ok):
        """Everything stopped; the working directory removed when all went as expected, else
        kept, and said where."""
        self.shutdown()
        if ok:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"logs in {self.dir}")

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


