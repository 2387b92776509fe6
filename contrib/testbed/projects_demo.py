#!/usr/bin/python3
"""The quick start's tour of projects (`contrib/quickstart.sh --projects`): a cloud of its own
in a fresh directory (etcd with TLS, client certificates and its auth on; Placement; one agent
on libvirt's test driver; `toyvm scheduler`), a project `demo` with a quota of 2 VCPU and its
member `alice`, who signs in by a certificate of her own. Alice schedules an instance, sees
it, asks for more than her quota and is refused with the numbers, and etcd itself refuses her
the cloud's keys. Everything it started is stopped at the end.

  usage: projects_demo.py --build DIR
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile

from cloud import Cloud, wait_until


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="toyvm-projects-demo-"))
    cloud = Cloud(pathlib.Path(args.build), workdir, etcd_secure=True)
    ok = False

    def show(who, *command):
        config = [] if who == "admin" else ["--config", str(workdir / f"{who}.toml")]
        print(f"\n{who}$ toyvm {' '.join(command)}", flush=True)
        done = cloud.run(*config, *command)
        sys.stdout.write(done.stdout + done.stderr)
        print(f"(exit {done.returncode})", flush=True)
        return done

    try:
        cloud.start_agent("demo-host", "VCPU:8,MEMORY_MB:8192,DISK_GB:100")
        cloud.wait_agent("demo-host")
        cloud.spawn("scheduler", [cloud.toyvm, "scheduler"], cloud.env)
        show("admin", "project", "create", "demo", "--limit", "VCPU=2")
        show("admin", "project", "add-member", "demo", "alice")
        cloud.member_config("alice")
        made = show("alice", "schedule", "resources=VCPU:1,DISK_GB:1,MEMORY_MB:256", "--wait")
        show("alice", "show")
        over = show("alice", "schedule", "resources=VCPU:2,DISK_GB:1,MEMORY_MB:256")
        show("admin", "project", "show", "demo")
        print("\nalice$ etcdctl get /toyvm/v1/work --prefix   (with her certificate)")
        pki = cloud.pki
        denied = subprocess.run(["etcdctl", f"--endpoints={cloud.etcd_urls[0]}", f"--cacert={pki}/ca.crt",
                                 f"--cert={pki}/alice.crt", f"--key={pki}/alice.key", "get", "/toyvm/v1/work",
                                 "--prefix"], capture_output=True, text=True, env=dict(cloud.env, ETCDCTL_API="3"))
        sys.stdout.write(denied.stdout + denied.stderr)
        ok = made.returncode == 0 and over.returncode == 7 and "permission denied" in denied.stderr
        print("\nprojects: " + ("as expected" if ok else "NOT as expected"))
    finally:
        cloud.finish(ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
