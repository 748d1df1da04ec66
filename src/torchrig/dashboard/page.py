"""The page, rendered on the server from :func:`torchrig.dashboard.state.collect`'s dictionary (pure).

Every value goes through :func:`html.escape`; the page has no external resource (no CDN: it works offline)
and a few lines of JavaScript that fetch ``/fragment`` every ``interval`` seconds and swap it in.
"""

from __future__ import annotations

import datetime as dt
from html import escape
from typing import Any

STYLE = """
body{font:14px system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.3em} h2{font-size:1.05em;margin-top:1.4em}
table{border-collapse:collapse;width:100%} th,td{border-bottom:1px solid #ddd;padding:.3em .5em;text-align:left;
vertical-align:top} th{background:#f4f4f4}
td{overflow-wrap:anywhere} td code,.forward code{white-space:pre-wrap;word-break:break-all}
.free{color:#1a7f37} .held{color:#9a6700} .err{color:#cf222e} .muted{color:#666} code{font-size:.95em}
"""


def _v(value: Any, unit: str = "") -> str:
    return "?" if value is None else escape(f"{value}{unit}")


def _ago(at_s: float | None, now_s: float) -> str:
    if not at_s:
        return "?"
    mins = int(max(0.0, now_s - at_s) // 60)
    when = dt.datetime.fromtimestamp(at_s, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{when} ({mins // 60} h {mins % 60} min)" if mins >= 60 else f"{when} ({mins} min)"


def _gpus(s: dict[str, Any]) -> str:
    rows = []
    for g in s["gpus"]:
        holders = g["holders"]
        held = (
            "<br>".join(
                f'<span class="held">{escape(h["user"])}/{escape(h["environment"])}</span>'
                f"{' (shared)' if h['shared'] else ''} since {escape(_ago(h['since_s'], s['at_s']))}"
                for h in holders
            )
            if holders
            else '<span class="free">free</span>'
        )
        procs = "<br>".join(
            escape(f"pid {p.get('pid')} {p.get('user') or '?'} {p.get('memory_mib') or '?'} MiB")
            for p in g["processes"]
        )
        mem = f"{_v(g['memory_used_mib'])}/{_v(g['memory_total_mib'])} MiB"
        rows.append(
            f'<tr data-gpu="{g["index"]}"><td>{g["index"]}</td><td>{escape(g["name"])}</td><td>{mem}</td>'
            f"<td>{_v(g['utilization_gpu_pct'], ' %')}</td><td>{_v(g['temperature_c'], ' °C')}</td>"
            f"<td>{_v(g['power_w'], ' W')}</td><td>{held}</td><td>{procs or '-'}</td></tr>"
        )
    head = "<tr><th>GPU</th><th>name</th><th>memory</th><th>util</th><th>temp</th><th>power</th><th>lease</th><th>processes</th></tr>"
    return f'<table id="gpus">{head}{"".join(rows)}</table>' if rows else "<p>no GPU on this host</p>"


def forward_command(dashboard_port: int, ports: list[int], user: str, host: str) -> str:
    """The one ``ssh -L`` that makes every link of the page work from a laptop: the dashboard's port and
    each of the viewer's environments' Jupyter and SSH ports, each to the same port on the laptop (the
    links name 127.0.0.1:PORT; torchrig keeps an environment's ports across down/up)."""
    import shlex

    argv = ["ssh", "-N"]
    for p in sorted({dashboard_port, *ports}):
        argv += ["-L", f"{p}:127.0.0.1:{p}"]
    return shlex.join([*argv, f"{user}@{host}"])


def _forward(s: dict[str, Any], target: tuple[int, str] | None) -> str:
    if target is None:
        return ""
    ports = [p for e in s["environments"] for p in e.get("ports", [])]
    line = forward_command(target[0], ports, s["viewer"], target[1])
    return (
        '<p class="forward">From your laptop, this one command makes every link on this page work: '
        f'<code id="forward">{escape(line)}</code></p>'
    )


def _envs(s: dict[str, Any]) -> str:
    rows = []
    for e in s["environments"]:
        access = e["access"]
        how = "<br>".join(
            [f'<a href="{escape(access["jupyter"])}">Jupyter</a>'] if "jupyter" in access else []
        ) + (f"<br><code>{escape(access['ssh'])}</code>" if "ssh" in access else "")
        rows.append(
            f'<tr data-env="{escape(e["name"])}"><td>{escape(e["name"])}</td><td>{escape(e["owner"])}</td>'
            f"<td>{escape(e['status'] or e['state'])}</td><td>{escape(','.join(e['gpus']) or '-')}</td>"
            f"<td>{escape(e['image'])}</td><td>{how or ('-' if e['mine'] else '<span class=muted>not yours</span>')}</td></tr>"
        )
    head = "<tr><th>environment</th><th>owner</th><th>state</th><th>GPUs</th><th>image</th><th>how to get in</th></tr>"
    return f'<table id="envs">{head}{"".join(rows)}</table>' if rows else "<p>no torchrig environments</p>"


def _bench(s: dict[str, Any]) -> str:
    b = s["bench"]
    if b is None:
        return '<p class="muted">no bench report (start the dashboard with --bench DIR, where torchrig bench --out DIR wrote)</p>'
    failed = ", ".join(b.get("failed", []))
    plot = (
        '<p><img src="bench.png" alt="bench plots" style="max-width:100%"></p>' if b.get("has_plot") else ""
    )
    return (
        f'<p id="bench-verdict">{escape(b["verdict"])} <span class="muted">{escape(b.get("date_utc", ""))}</span></p>'
        + (f'<p class="err">failed: {escape(failed)}</p>' if failed else "")
        + (f"<p class=muted><code>{escape(b['command'])}</code></p>" if b.get("command") else "")
        + plot
    )


def _doctor(s: dict[str, Any]) -> str:
    d = s["doctor"]
    if d is None:
        return '<p class="muted">doctor is running…</p>'
    items = "".join(
        f"<li><b>{escape(f['severity'])}</b> {escape(f['summary'])} <span class=muted>[{escape(f['id'])}]</span></li>"
        for f in d["findings"]
    )
    return f'<p id="doctor-verdict">{escape(d["verdict"])}</p><ul>{items}</ul>'


def fragment(s: dict[str, Any], forward: tuple[int, str] | None = None) -> str:
    """The live part of the page (what the refresh swaps in); ``forward``: (the dashboard's port, this
    host's name) for the ``ssh -L`` line."""
    when = dt.datetime.fromtimestamp(s["at_s"], dt.timezone.utc).strftime("%H:%M:%S UTC")
    notes = "".join(f'<p class="err">{escape(n)}</p>' for n in s["notes"])
    return (
        f'<p class="muted">driver {_v(s["driver"])} (CUDA {_v(s["cuda"])}), inventory {escape(str(s["inventory"]))}; '
        f'updated <span id="updated">{when}</span>; you are <b id="viewer">{escape(s["viewer"])}</b></p>{notes}'
        f"<h2>GPUs</h2>{_gpus(s)}<h2>Environments</h2>{_forward(s, forward)}{_envs(s)}"
        f"<h2>Doctor</h2>{_doctor(s)}<h2>Latest bench</h2>{_bench(s)}"
    )


def page(s: dict[str, Any], interval_s: float, forward: tuple[int, str] | None = None) -> str:
    """The whole page: the fragment, and a refresh every ``interval_s`` seconds."""
    ms = int(interval_s * 1000)
    script = (
        "<script>setInterval(async()=>{try{const r=await fetch('fragment',{credentials:'same-origin'});"
        "if(r.ok){document.getElementById('live').innerHTML=await r.text();}}catch(e){}},"
        + str(ms)
        + ");</script>"
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>torchrig: GPU server</title>'
        f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head><body>'
        f'<h1>torchrig: this GPU server</h1><div id="live">{fragment(s, forward)}</div>{script}</body></html>'
    )
