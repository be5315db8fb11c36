"""The benchmark report: a Markdown table for people, a PNG plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench import latency
from bench.costs import INDEX_COSTS, SHIPPED


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _paired(a: dict[str, Any], b: dict[str, Any], key: str = "runs") -> str:
    """The ratio of two contenders taken within each round: its median [min-max]."""
    ratios = [x / y for x, y in zip(a[key], b[key], strict=True) if y]
    if not ratios:
        return "-"
    median = f"{statistics.median(ratios):.2f}x"
    return median if len(ratios) == 1 else f"{median} [{min(ratios):.2f}-{max(ratios):.2f}]"


SEED_NAMES = ("1,000 aggregates", "one aggregate per row")


def _cpu(row: dict[str, Any]) -> str:
    cpu = row.get("cpu_us_per_message")
    return f"{cpu['median']:.1f}" if cpu else "-"


def render_throughput(report: dict[str, Any]) -> list[str]:
    """The no-op throughput section: every contender, the ratios, what one message costs the
    database, and what the gap between the worker and the SQL ceiling is made of."""
    t = report["throughput"]
    lines = [
        "## Throughput, no-op publisher (messages/s)",
        "",
        "Two seeds, each row its own ~200-byte message: spread over 1,000 aggregates, and one "
        "aggregate per row. The worker runs with every setting at its default but `--batch "
        "500`; the plain loop is a synchronous psycopg loop of the project's own claim and "
        "batched fenced finalize on one connection (bench/peers/plain_loop.py). CPU is the "
        "contender's own processes over the drain, per message (not the database's).",
        "",
        "| contender | seed | processes | messages/s | CPU µs/message | detail |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in t.items():
        lines.append(
            f"| {name} | {row.get('seed', SEED_NAMES[0])} | {row['processes']} | "
            f"{row['median']:,.0f} [{row['min']:,.0f}-{row['max']:,.0f}] | {_cpu(row)} | "
            f"{row['detail']} |"
        )

    def of(peer: str, seed: str) -> dict[int, dict[str, Any]]:
        return {
            row["processes"]: row
            for row in t.values()
            if row["peer"] == peer and row.get("seed", SEED_NAMES[0]) == seed
        }

    seeds = [seed for seed in SEED_NAMES if of("ours", seed)]
    lines += [
        "",
        "Ratios are taken within each round (both sides ran back to back): the median of the "
        "rounds' ratios [min-max].",
        "",
        "| ratio | " + " | ".join(seeds) + " |",
        "|---|" + "---|" * len(seeds),
    ]

    def ratio_row(label: str, value: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(value(seed) for seed in seeds) + " |")

    for n in (1, 2):
        ratio_row(
            f"outbox-dispatcher / plain loop, {n} process{'es' if n > 1 else ''}",
            lambda seed, n=n: _paired(of("ours", seed)[n], of("plain-loop", seed)[n]),
        )
    for n in (1, 2):
        ratio_row(
            f"outbox-dispatcher {n} process{'es' if n > 1 else ''} / SQL ceiling {n} client(s)",
            lambda seed, n=n: _paired(of("ours", seed)[n], of("ceiling", seed)[n]),
        )
    for n in (1, 2):
        ratio_row(
            f"SQL ceiling as shipped / on an ordered table, {n} client(s)",
            lambda seed, n=n: (
                _paired(of("ceiling", seed)[n], of("ceiling-ordered", seed)[n])
                if of("ceiling-ordered", seed)
                else "-"
            ),
        )
    ratio_row(
        "CPU per message, outbox-dispatcher / plain loop (1 process)",
        lambda seed: _paired(
            of("ours", seed)[1]["cpu_us_per_message"],
            of("plain-loop", seed)[1]["cpu_us_per_message"],
        ),
    )
    first = SEED_NAMES[0]
    ours = {n: row["median"] for n, row in of("ours", first).items()}
    best_ours = max(ours.values())
    ceiling = max(row["median"] for row in of("ceiling", first).values())
    if "pgqueuer best" in t:
        pgq_best = t["pgqueuer best"]["median"]
        pgq_default = t["pgqueuer defaults"]["median"]
        article = {n: row["median"] for n, row in of("article", first).items()}
        lines += [
            "",
            f"Beside the other designs ({first}):",
            "",
            "| ratio | value |",
            "|---|---|",
            f"| best outbox-dispatcher / pgqueuer best | {_ratio(best_ours, pgq_best)} |",
            f"| outbox-dispatcher 1 process / pgqueuer best | {_ratio(ours[1], pgq_best)} |",
            f"| best outbox-dispatcher / pgqueuer defaults | {_ratio(best_ours, pgq_default)} |",
            f"| outbox-dispatcher 1 process / article design 1 process | "
            f"{_ratio(ours[1], article[1])} |",
            f"| best outbox-dispatcher / article design 4 processes | "
            f"{_ratio(best_ours, article[4])} |",
            f"| best outbox-dispatcher / SQL ceiling | {_ratio(best_ours, ceiling)} |",
            f"| SQL ceiling / pgqueuer best | {_ratio(ceiling, pgq_best)} |",
        ]
    costs = report.get("costs")
    if costs:
        lines += [
            "",
            "### What one message costs the database",
            "",
            "Each claim and each finalize of a drain run under EXPLAIN (ANALYZE, BUFFERS, WAL), "
            "per message, after a checkpoint (so full-page images are counted): as shipped (a "
            "table migrated for unordered workers), with ordered mode's index (`outbox migrate "
            "--ordering aggregate`), and without `outbox_waiting`, the other index an unordered "
            "drain writes but never reads, to show what each costs. Every claim and finalize is "
            "a non-HOT update (status is in the partial indexes' predicates): a claimed row "
            "version gets an entry in the primary key, `leased` and `waiting` (and `aggregate` "
            "on an ordered table); a done one in the primary key only.",
            "",
            "| seed | indexes | claim µs | claim buffers | claim WAL bytes | finalize µs | "
            "finalize buffers | finalize WAL bytes | WAL bytes/message | aggregate index pages |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in costs:
            lines.append(
                f"| {c['seed']} | {c['variant']} | {c['claim_us']:.1f} | "
                f"{c['claim_buffers']:.1f} | {c['claim_wal_bytes']:,.0f} | "
                f"{c['finalize_us']:.1f} | {c['finalize_buffers']:.1f} | "
                f"{c['finalize_wal_bytes']:,.0f} | {c['wal_bytes_total']:,.0f} | "
                f"{c['index_pages'].get('outbox_aggregate', '-')} |"
            )
        lines += ["", *_gap(report, of, seeds)]
    return lines


def _gap(report: dict[str, Any], of: Any, seeds: list[str]) -> list[str]:
    """What separates the worker from the ceiling and the plain loop, in figures."""
    costs = {(c["seed"], c["variant"]): c for c in report["costs"]}
    cores = report["environment"]["cores"]
    lines = ["### What the gap is made of", ""]
    for seed in seeds:
        shipped = costs.get((seed, SHIPPED))
        if shipped is None:
            continue
        server = shipped["claim_us"] + shipped["finalize_us"]
        worker = of("ours", seed)[1]["cpu_us_per_message"]["median"]
        plain = of("plain-loop", seed)[1]["cpu_us_per_message"]["median"]
        needed = (server + plain) / 1.1 - server  # the worker's CPU for 1.1x, cores saturated
        below_plain = ", under the plain loop's own" if needed < plain else ""
        lines.append(
            f"- {seed}: the database spends {server:.1f} µs executing one message's share of a "
            f"claim and a finalize (planning, commit and protocol work come on top); the worker "
            f"process {worker:.1f} µs of CPU, the plain loop {plain:.1f} µs. With {cores} cores "
            f"and everything CPU-bound, that caps the worker at about "
            f"{cores * 1e6 / (server + worker):,.0f} messages/s and the plain loop at "
            f"{cores * 1e6 / (server + plain):,.0f}, whatever the number of processes. Were "
            f"both cores saturated, the worker would reach about "
            f"{(server + plain) / (server + worker):.2f}x of the plain loop (a measured ratio "
            f"above that means they were not), and 1.1x would need its CPU per message below "
            f"{needed:.1f} µs{below_plain}."
        )
    for seed in seeds:
        for index, with_it, without_it in INDEX_COSTS:
            on, off = costs.get((seed, with_it)), costs.get((seed, without_it))
            if on is None or off is None:
                continue
            wal = on["wal_bytes_total"] - off["wal_bytes_total"]
            lines.append(
                f"- {seed}: `{index}` costs each message {wal:,.0f} WAL bytes "
                f"({wal / on['wal_bytes_total']:.0%}), "
                f"{on['claim_buffers'] - off['claim_buffers']:.1f} buffers and "
                f"{on['claim_us'] - off['claim_us']:.1f} µs in the claim."
            )
    return lines


def render_section(report: dict[str, Any], section: list[str]) -> str:
    """One section's lines under the run's environment, for `python -m bench --only`."""
    env = report["environment"]
    smoke = " (smoke run)" if report["smoke"] else ""
    return "\n".join([
        f"# outbox-dispatcher benchmark report, one section{smoke}",
        "",
        f"PostgreSQL {env['postgresql']}, {env['cores']} cores, Python {env['python']}, "
        f"{env.get('event_loop', 'asyncio')} event loop, commit {env['commit']}, {env['started']}.",
        *([f"{report['messages']:,} messages of ~200 bytes per run, median of "
           f"{report['repeat']} round(s) (min-max in brackets), every contender once per round.",
           ] if "throughput" in report else []),
        "",
        *section,
    ]) + "\n"  # fmt: skip


def _http_section(http: dict[str, Any]) -> list[str]:
    layouts = {"free": http} | ({"pinned": http["pinned"]} if "pinned" in http else {})
    where = {
        "free": "every process on every core",
        "pinned": "PostgreSQL on a core of its own, the rest on the other",
    }

    def row(label: str, name: str, fmt: str) -> str:
        cells = [f"{layouts[k][name]['median']:{fmt}}" for k in layouts]
        return f"| {label} | " + " | ".join(cells) + " |"

    return [
        "## HTTP publisher against a local HTTP server",
        "",
        f"{http['messages']:,} messages of ~200 bytes, concurrency {http['concurrency']}: the "
        "plain load generator (an aiohttp client posting the same body), the worker "
        "(`--publisher http --batch 500`) and the load generator again (its two runs "
        "averaged), against one server, in each round; median of "
        f"{len(http['outbox_dispatcher']['runs'])} round(s), ratios taken within a round"
        + (f" (commit {http['commit']}, {http['started']})." if "commit" in http else "."),
        "",
        "| | " + " | ".join(where[k] for k in layouts) + " |",
        "|---|" + "---|" * len(layouts),
        row("plain load generator, requests/s", "server_capacity", ",.0f"),
        row("outbox-dispatcher, messages/s", "outbox_dispatcher", ",.0f"),
        row("**throughput, ours / load generator**", "throughput_ratio", ".2f"),
        row("load generator CPU µs per request", "loadgen_cpu_us", ".0f"),
        row("worker CPU µs per delivered message", "worker_cpu_us", ".0f"),
        row("**CPU, worker / load generator**", "cpu_ratio", ".2f"),
        row("server CPU µs per request, load generator's", "server_cpu_us_loadgen", ".0f"),
        row("server CPU µs per request, worker's", "server_cpu_us_worker", ".0f"),
        row("PostgreSQL CPU µs per message", "database_cpu_us", ".0f"),
        row("no-op publisher: worker CPU µs per message", "null_worker_cpu_us", ".0f"),
        row("no-op publisher: PostgreSQL CPU µs per message", "null_database_cpu_us", ".0f"),
        "",
        "CPU is user plus system time from /proc, over the same window as the rate: for the "
        "load generator, from just before its first request to just after its last (it "
        "reads its own); for the worker, server and PostgreSQL, from the last poll at which "
        "no message was done yet to the first at which all were (20 ms polls). Start-up and "
        "imports are left out of both alike. The benchmark's own progress polls run on a "
        "backend left out of PostgreSQL's figure.",
        "",
        *_http_findings(http),
        *(_http_profile(http["profile"]) if "profile" in http else []),
    ]


def _medians(block: dict[str, Any]) -> dict[str, float]:
    return {k: v["median"] for k, v in block.items() if isinstance(v, dict) and "median" in v}


def _http_findings(http: dict[str, Any]) -> list[str]:
    m = {
        name: row["median"]
        for name, row in http.items()
        if isinstance(row, dict) and "median" in row
    }
    lines = [
        f"The database's share: PostgreSQL spends {m['database_cpu_us']:.0f} µs per message "
        f"on the HTTP path against {m['null_database_cpu_us']:.0f} µs with the no-op "
        "publisher. With a publisher that waits, outcomes reach the finalizer one by one; "
        "while publishes run it lets them gather for 10 ms (FINALIZE_LINGER) before writing, "
        "yet its statements stay smaller than the no-op path's full batches, and each costs "
        "a round trip on both sides whatever its size.",
    ]
    if "pinned" in http:
        p = {
            name: row["median"]
            for name, row in http["pinned"].items()
            if isinstance(row, dict) and "median" in row
        }
        ours = p["worker_cpu_us"] + p["server_cpu_us_worker"]
        plain = p["loadgen_cpu_us"] + p["server_cpu_us_loadgen"]
        lines += [
            "",
            f"Pinned, the worker and the server share one core: {ours:.0f} µs of CPU per "
            f"message against the load generator's and the server's {plain:.0f} µs per "
            f"request. Were that core the only limit, the ratio would be "
            f"{_ratio(plain, ours)}; measured, it is {p['throughput_ratio']:.2f}x.",
        ]
    return [*lines, ""]


def _http_profile(profile: dict[str, Any]) -> list[str]:
    if "skipped" in profile:
        return [f"(No profile: {profile['skipped']}.)", ""]
    parts = profile["parts_us"]
    worker, loadgen = profile["worker_cpu_us"], profile["loadgen_cpu_us"]
    lines = [
        f"### Where the worker's CPU goes beside the load generator's (py-spy, "
        f"{profile['messages']:,} messages, asyncio's own loop)",
        "",
        "Each client's samples by part of the path, times its CPU per request or message in "
        f"that run: worker {worker:.0f} µs, load generator {loadgen:.0f} µs "
        f"({_ratio(worker, loadgen)}; asyncio's loop costs more than uvloop, whose frames "
        "py-spy cannot see).",
        "",
        "| part | worker µs/message | load generator µs/request |",
        "|---|---|---|",
    ]
    for name, us in parts.items():
        lines.append(f"| {name} | {us['worker']:.0f} | {us['loadgen']:.0f} |")

    def worker_us(*prefixes: str) -> float:
        return sum(us["worker"] for name, us in parts.items() if name.startswith(prefixes))

    def both_us(prefix: str) -> float:
        return sum(us["worker"] - us["loadgen"] for n, us in parts.items() if n.startswith(prefix))

    lines += [
        "",
        f"The worker's {worker - loadgen:.0f} µs beyond the load generator's: the dispatch "
        f"loop's work around each publish {worker_us('dispatch loop'):.0f} µs (of it the "
        f"publish timeout {worker_us('dispatch loop: publish timeout'):.0f}), the database "
        f"client (claim and finalize) {worker_us('claim', 'finalize'):.0f} µs, the "
        f"publisher's own work (envelope, headers) "
        f"{worker_us('envelope', 'HttpPublisher'):.0f} µs; aiohttp and the event loop "
        f"differ by {both_us('aiohttp') + both_us('event loop'):+.0f} µs per request, worker "
        "minus load generator (py-spy's shares at 250 samples/s: a few µs either way).",
    ]
    return [*lines, ""]


def render_latency(report: dict[str, Any]) -> list[str]:
    """Commit to the receiver's first byte: the worker beside the floor and pgqueuer
    (bench/latency.py)."""
    return latency.render(report["latency"])


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# outbox-dispatcher benchmark report" + (" (smoke run)" if report["smoke"] else ""),
        "",
        f"PostgreSQL {env['postgresql']} (embedded, stock settings: "
        f"{', '.join(f'{k}={v}' for k, v in sorted(env['postgresql_settings'].items()))}), "
        f"{env['cores']} cores, Python {env['python']}, commit {env['commit']}, {env['started']}.",
        f"Every asyncio contender (our worker, pgqueuer, the HTTP load generator) ran on the "
        f"{env.get('event_loop', 'asyncio')} event loop.",
        f"{report['messages']:,} messages of ~200 bytes per throughput run, median of "
        f"{report['repeat']} run(s) (min-max in brackets). All contenders ran in this one run.",
        "",
        *render_throughput(report),
        "",
        *_http_section(report["http"]),
        *render_latency(report),
    ]
    lines += ["", "## Scale: claim + finalize with done rows kept", "",
              "| done rows | µs per message |", "|---|---|"]  # fmt: skip
    for row in report["scale_done_rows"]:
        lines.append(f"| {row['done_rows']:,} | {row['us_per_message']:.1f} |")
    lines += ["", "## Ordered mode", "", "| aggregates | messages/s (1 connection) |", "|---|---|"]
    for row in report["ordered"]:
        lines.append(f"| {row['aggregates']:,} | {row['messages_per_second']:,.0f} |")
    memory = report["memory"]
    lines += [
        "",
        f"## Memory over a {memory['messages']:,}-message drain",
        "",
        f"RSS early {memory['rss_mib_early']:.1f} MiB, late {memory['rss_mib_late']:.1f} MiB, "
        f"peak {memory['rss_mib_peak']:.1f} MiB.",
        "",
        "## Publisher-bound (50 ms per publish), one worker",
        "",
        "| concurrency | messages/s | ideal |",
        "|---|---|---|",
    ]
    for row in report["publisher_bound"]:
        lines.append(
            f"| {row['concurrency']} | {row['messages_per_second']:,.0f} | {row['ideal']:,.0f} |"
        )
    profile = report.get("profile")
    if profile and "top_frames" in profile:
        lines += [
            "",
            "## Where one worker's time goes (py-spy)",
            "",
            "Sampled on asyncio's own event loop, whose waits py-spy can see (uvloop's are C).",
            "",
            f"{profile['waiting_share']:.0%} of samples wait on sockets (the database); the "
            "busiest Python frames:",
            "",
        ]
        lines += [f"- {f['share']:.1%} {f['frame']}" for f in profile["top_frames"]]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return  # the plot needs the bench extra; the table and JSON are written regardless
    t = report["throughput"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    names = list(t)
    colours = {
        "ours": "tab:green", "plain-loop": "tab:olive", "article": "tab:gray",
        "ceiling": "tab:blue", "ceiling-ordered": "tab:cyan",
    }  # fmt: skip
    left.barh(
        names,
        [t[n]["median"] for n in names],
        xerr=[
            [t[n]["median"] - t[n]["min"] for n in names],
            [t[n]["max"] - t[n]["median"] for n in names],
        ],
        color=[colours.get(t[n]["peer"], "tab:orange") for n in names],
    )
    left.invert_yaxis()
    left.set_xlabel("messages/s (no-op publisher)")
    left.set_title("Throughput, same PostgreSQL, same run")
    scale = report["scale_done_rows"]
    right.plot([r["done_rows"] for r in scale], [r["us_per_message"] for r in scale], marker="o")
    right.set_xscale("log")
    right.set_ylim(bottom=0)
    right.set_xlabel("done rows kept in the table")
    right.set_ylabel("µs of claim + finalize per message")
    right.set_title("Claim and finalize stay flat as history grows")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
