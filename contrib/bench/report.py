"""The benchmark's report (Markdown tables) and plots (gnuplot) from its results."""

import shutil
import subprocess
import sys

from stats import percentile


def report(results, single_block):
    """`single_block`: how many schedules one at a time each side ran in a row."""
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
    return "\n".join(lines + report_scheduling(results, single_block))


def report_scheduling(results, single_block):
    f, s = results["floor_ms"], results["schedule_ms"]

    def by_round(rounds):
        return ([f"| the same, round by round ({len(rounds)} rounds of {single_block} each): middle half | "
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
