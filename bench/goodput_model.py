#!/usr/bin/env python3
"""Goodput model (issue 22): the effective training time ratio (ETTR = productive time / wall time)
of a job at 1,024, 4,096 and 16,384 GPUs, from the measured cost of one incident (detection,
restart, replay) and of one checkpoint (stall), and published failure rates. No measurement runs
here: pure Python, standard library only, instant. docs/goodput.md explains the model.

Designs (rows):
  old              disk checkpoints every --disk-interval-s (600 s), nothing else
  new              in-memory snapshots every --snapshot-interval-s, replicated to a peer host,
                   plus disk every --disk-interval-s for durability
  young_daly_disk  the old design with the disk interval chosen by Young (first-order column) and
                   Daly 2006 (higher-order column)
  young_daly_mem   the new design with the memory interval chosen the same way

Model. Failures are a Poisson process of mean time to failure M at N GPUs, M = M0 * N0 / N (the
anchor --mttf-h at --mttf-gpus, scaled as 1/N). Every failure costs detection D + restart S +
replay, where replay = half the interval of the tier restored from plus that tier's commit lag P
(the time from a snapshot to its commit: a failure in it rolls back one snapshot further).
Every checkpoint stalls training for C. A tier serves a share of the failures: the memory tier
all but --memory-miss-fraction q of them, the disk tier the rest.
  first order   ETTR = 1 - sum(C_t / tau_t) - (D + S + sum(share_t * (tau_t / 2 + P_t))) / M
                Young (CACM 17(9), 1974): tau_opt = sqrt(2 C M)
  higher order  per tier (Daly, FGCS 22(3), 2006, the complete cost function), with the tier's
                failure rate share_t / M, so M_t = M / share_t, and R_t = D + S + P_t:
                  ETTR_t = tau_t / (M_t * exp(R_t / M_t) * (exp((tau_t + C_t) / M_t) - 1))
                  (a tier that serves no failure: tau_t / (tau_t + C_t)); ETTR = product over tiers
                Daly's optimum: tau_opt = sqrt(2 C M) [1 + (1/3) sqrt(C/2M) + (1/9) (C/2M)] - C
                for C < 2M, else tau_opt = M

Inputs (all optional; every default says where it comes from):
  --recovery-json PATH  the old design's incident: the JSON line of bench/recovery_bench.py
                        (detect_s, restart_s, lost_work_s, restart_phases, checkpoint_every_steps,
                        step_s). Default: README.md's launcher row (median of 5 runs of
                        `recovery_bench.py 5`: detection 5.0 s, restart 3.8 s, 1.1 s replayed,
                        checkpoints every 50 steps of 20 ms). The disk tier's commit lag is
                        lost_work_s - (checkpoint_every_steps * step_s) / 2.
  --new-json PATH       the new design's incident, same format (snapshot_every_steps is read
                        before checkpoint_every_steps). Without it the new design's row uses
                        TARGETS, not measurements: restart --target-restart-s (2 s: recovery =
                        detection + 2 s), snapshot commit lag --target-snapshot-lag-s (1 s),
                        detection as measured for the old design.
  --scale-json PATH     per-host-count measurements of the costs that grow with the hosts (shape
                        below), fitted linear, logarithmic and quadratic in hosts, extrapolated to
                        N / 8 hosts; within the points' range they are interpolated, beyond it the
                        best-fitting of the three (least rms) is used, never below the linear one.
                        Without it the scale costs are not included (restart and detection as
                        measured on 2-3 simulated hosts).
    {"measured_hosts": 2,            # hosts of the incident measurement (recovery_bench: 2 after
                                     # the fault; default 2)
     "points": [{"hosts": 2, "rendezvous_s": 1.2, "store_ops_per_round": 150,
                 "coordinator_cpu_s_per_s": 0.01}, ...]}
     Each field but "hosts" is optional. rendezvous_s grows the restart; store_ops_per_round
     grows it by ops / --store-ops-per-s when that is given; coordinator_cpu_s_per_s (cores) is
     checked against one core.

Output: a table, then ONE JSON line {"bench": "goodput_model", "rows": [...], "goal_met": ...}
(goal: the new design's ETTR >= --goal-ettr at 16,384 GPUs and M = 1.8 h, both estimates).

  python3 bench/goodput_model.py [--recovery-json F] [--new-json F] [--scale-json F] [...]
"""
import argparse
import dataclasses
import json
import math
import sys

# --- Published failure rates (docs/goodput.md, "Sources") -------------------------------------
# Llama 3 (arXiv 2407.21783, section 3.3.4 and Table 5, checked against the paper's text): 419
# unexpected interruptions (466 in all, 47 planned) in a 54-day snapshot of Llama 3 405B
# pre-training on 16K H100s (16,384 GPUs in Table 4).
LLAMA3_GPUS = 16384
LLAMA3_MTTI_H = 54 * 24 / 419  # 3.09 h
# Kokolis et al. (arXiv 2410.21680, HPCA 2025): 1,024-GPU jobs measured at 7.9 h MTTF (Fig. 7),
# 16,384 GPUs projected at 1.8 h from RSC-1's 6.50 failures per 1,000 node-days (8 GPUs a node:
# 1 / (2048 * 0.0065) days = 1.80 h). NOT checked against the paper's own text in this work: the
# figures agree in three independent readings of it and in the arithmetic (docs/goodput.md).
KOKOLIS_1K_MEASURED_H = 7.9
KOKOLIS_RF_PER_NODE_DAY = 6.5e-3
KOKOLIS_CONFIRMED = "secondary"  # "primary" once read in the paper itself

# --- Measured defaults ----------------------------------------------------------------------
# README.md, launcher row (recovery_bench.py 5, torch 2.13 CPU, 3 simulated hosts, median of 5).
README_RECOVERY = {"bench": "recovery", "scenario": "spare", "detect_s": 5.0, "restart_s": 3.8,
                   "lost_work_s": 1.1, "recovery_s": 8.7, "checkpoint_every_steps": 50, "step_s": 0.02}
# docs/comparison.md (run of 2026-12-06, 384 MiB model + AdamW state on the CPU; README's
# checkpoint row): trainsup's blocking snapshot stalled 0.134 / 0.083 / 0.077 s (medians of three
# runs): the largest is the default; the overlapped snapshot stalled 0.002 s in two runs.
STALL_BLOCKING_S = 0.134
STALL_OVERLAPPED_S = 0.002


@dataclasses.dataclass
class Tier:
    name: str
    interval_s: float   # compute time between two checkpoints of this tier
    stall_s: float      # training stalled per checkpoint
    commit_lag_s: float  # snapshot -> committed (replicated / durable)
    share: float        # fraction of the failures restored from this tier


@dataclasses.dataclass
class Design:
    name: str
    detect_s: float
    restart_s: float
    tiers: list


# --- Formulas -------------------------------------------------------------------------------
def young_interval(stall_s, mttf_s):
    """Young 1974: the first-order optimum interval sqrt(2 C M)."""
    return math.sqrt(2 * stall_s * mttf_s)


def daly_interval(stall_s, mttf_s):
    """Daly 2006: the higher-order optimum interval (perturbation solution)."""
    if stall_s >= 2 * mttf_s:
        return mttf_s
    x = stall_s / (2 * mttf_s)
    return math.sqrt(2 * stall_s * mttf_s) * (1 + math.sqrt(x) / 3 + x / 9) - stall_s


def loss_per_failure(design):
    """Seconds lost per failure: detection + restart + replay (the restored tier's half interval
    plus its commit lag, weighted by the share of failures it serves)."""
    replay = sum(t.share * (t.interval_s / 2 + t.commit_lag_s) for t in design.tiers)
    return design.detect_s + design.restart_s + replay, replay


def stall_fraction(design):
    return sum(t.stall_s / t.interval_s for t in design.tiers)


def ettr_first_order(design, mttf_s):
    loss, _ = loss_per_failure(design)
    return max(0.0, 1 - stall_fraction(design) - loss / mttf_s)


def ettr_daly(design, mttf_s):
    ettr = 1.0
    for t in design.tiers:
        segment = t.interval_s + t.stall_s
        if t.share <= 0:
            ettr *= t.interval_s / segment
            continue
        m = mttf_s / t.share
        restart = design.detect_s + design.restart_s + t.commit_lag_s
        ettr *= t.interval_s / (m * math.exp(restart / m) * math.expm1(segment / m))
    return ettr


def mttf_at(gpus, anchor_gpus, anchor_h):
    """Mean time to failure in seconds at `gpus`, scaled as 1/N from an anchor."""
    return anchor_h * 3600 * anchor_gpus / gpus


# --- Fits for the costs that grow with the hosts ------------------------------------------------
def fit(xs, ys, kind):
    """Least squares y = a + b * f(x), f = identity ("linear"), ln ("log") or the square
    ("quadratic": a protocol whose every node repeats work that grows with the nodes, as torch's
    compare-and-set rendezvous does, bench/rendezvous_bench.py). Returns (a, b, rms)."""
    f = FIT_FUNCS[kind]
    us = [f(x) for x in xs]
    n = len(us)
    mu, my = sum(us) / n, sum(ys) / n
    suu = sum((u - mu) ** 2 for u in us)
    b = sum((u - mu) * (y - my) for u, y in zip(us, ys)) / suu if suu > 0 else 0.0
    a = my - b * mu
    rms = math.sqrt(sum((a + b * u - y) ** 2 for u, y in zip(us, ys)) / n)
    return a, b, rms


FIT_FUNCS = {"linear": lambda x: x, "log": math.log, "quadratic": lambda x: x * x}


def predict(model, x, kind):
    a, b, _ = model
    return a + b * FIT_FUNCS[kind](x)


SCALE_METRICS = ("rendezvous_s", "store_ops_per_round", "coordinator_cpu_s_per_s")


def scale_model(doc):
    points = doc["points"] if isinstance(doc, dict) else doc
    fits = {}
    for metric in SCALE_METRICS:
        pts = sorted((float(p["hosts"]), float(p[metric])) for p in points if metric in p)
        if len({h for h, _ in pts}) < 2:
            continue
        xs, ys = [h for h, _ in pts], [y for _, y in pts]
        fits[metric] = {"hosts": xs, "values": ys, **{kind: fit(xs, ys, kind) for kind in FIT_FUNCS}}
    measured = float(doc.get("measured_hosts", 2)) if isinstance(doc, dict) else 2.0
    source = doc.get("source", "") if isinstance(doc, dict) else ""
    return {"fits": fits, "measured_hosts": measured, "source": source,
            "estimated_points": sum(1 for p in points if p.get("estimated"))}


def extrapolate(model, metric, hosts):
    """The value at `hosts` and how it was had. Within the points' range: interpolated linearly
    between the two neighbouring points ("interpolated"). Below it: the first point's value (a
    cost is not assumed to fall below the smallest job measured). Beyond it: the fit that
    describes the points best (least rms of linear, log and quadratic), but never below the
    linear fit's value nor the last point's (a cost seen growing is not assumed to flatten or
    fall beyond the points). The largest of the three fits would be meaningless: a quadratic
    through points that lie on a line still bends up far beyond them."""
    f = model["fits"][metric]
    xs, ys = f["hosts"], f["values"]
    if hosts <= xs[0]:
        return ys[0], "first point"
    if hosts <= xs[-1]:
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if x0 <= hosts <= x1:
                return (y0 + (y1 - y0) * (hosts - x0) / (x1 - x0) if x1 > x0 else y1), "interpolated"
    best = min(FIT_FUNCS, key=lambda kind: f[kind][2])
    lin, at_best = predict(f["linear"], hosts, "linear"), predict(f[best], hosts, best)
    value, kind = (at_best, best) if at_best > lin else (lin, "linear")
    return (value, kind) if value >= ys[-1] else (ys[-1], "last point")


FIT_KEYS = (("rendezvous_s", "rendezvous_fit"), ("store_ops_per_round", "store_ops_fit"),
            ("coordinator_cores", "coordinator_fit"))


def scale_costs(model, hosts, store_ops_per_s):
    """Seconds added to each restart at `hosts`, beyond the measurement's own host count, plus the
    coordinator's load there."""
    if model is None:
        return {"restart_add_s": 0.0}
    out, add = {"hosts": hosts}, 0.0
    base = model["measured_hosts"]
    if "rendezvous_s" in model["fits"]:
        at, kind = extrapolate(model, "rendezvous_s", hosts)
        at_base, _ = extrapolate(model, "rendezvous_s", base)
        out["rendezvous_s"], out["rendezvous_fit"] = round(at, 3), kind
        add += max(0.0, at - at_base)
    if "store_ops_per_round" in model["fits"]:
        at, kind = extrapolate(model, "store_ops_per_round", hosts)
        at_base, _ = extrapolate(model, "store_ops_per_round", base)
        out["store_ops_per_round"], out["store_ops_fit"] = round(at, 1), kind
        if store_ops_per_s:
            add += max(0.0, (at - at_base) / store_ops_per_s)
    if "coordinator_cpu_s_per_s" in model["fits"]:
        at, kind = extrapolate(model, "coordinator_cpu_s_per_s", hosts)
        out["coordinator_cores"], out["coordinator_fit"] = round(at, 3), kind
        out["coordinator_saturated"] = at >= 1.0
    out["restart_add_s"] = add
    return out


# --- Inputs ---------------------------------------------------------------------------------
def read_bench_line(path):
    """The last line of `path` that is a JSON object (a bench's output may precede it)."""
    found = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(obj, dict):
                    found = obj
    if found is None or "detect_s" not in found or "restart_s" not in found:
        sys.exit(f"goodput_model.py: {path}: no JSON line with detect_s and restart_s")
    return found


def commit_lag(figures):
    """The commit lag a recovery measurement implies: its replayed work minus half its interval.
    Without the interval, the whole replay (an upper bound)."""
    every = figures.get("snapshot_every_steps", figures.get("checkpoint_every_steps"))
    step = figures.get("step_s")
    lost = float(figures.get("lost_work_s", 0.0))
    if every and step:
        return max(0.0, lost - float(every) * float(step) / 2), float(every) * float(step)
    return lost, None


def build_designs(a, old, new, mttf_s, scale_add_s, rows_for):
    """The four designs at one MTTF. `rows_for` picks the interval rule: "first" (Young) or
    "daly"."""
    rule = young_interval if rows_for == "first" else daly_interval
    q = a.memory_miss_fraction
    disk = lambda interval, share: Tier("disk", interval, a.disk_stall_s, old["lag_s"], share)  # noqa: E731
    mem = lambda interval: Tier("memory", interval, a.snapshot_stall_s, new["lag_s"], 1 - q)  # noqa: E731
    old_restart = old["restart_s"] + a.restart_extra_s + scale_add_s
    new_restart = new["restart_s"] + a.restart_extra_s + scale_add_s
    mem_mttf = mttf_s / (1 - q) if q < 1 else float("inf")
    return {
        "old": Design("old", old["detect_s"], old_restart, [disk(a.disk_interval_s, 1.0)]),
        "new": Design("new", new["detect_s"], new_restart, [mem(a.snapshot_interval_s), disk(a.disk_interval_s, q)]),
        "young_daly_disk": Design("young_daly_disk", old["detect_s"], old_restart,
                                  [disk(rule(a.disk_stall_s, mttf_s), 1.0)]),
        "young_daly_mem": Design("young_daly_mem", new["detect_s"], new_restart,
                                 [mem(rule(a.snapshot_stall_s, mem_mttf)), disk(a.disk_interval_s, q)]),
    }


LABELS = {"old": "old: disk every 600 s", "new": "new: memory + disk 600 s",
          "young_daly_disk": "Young/Daly: disk tier", "young_daly_mem": "Young/Daly: memory tier"}


def budget_text(loss, loss_budget, miss_budget, stall, goal_ettr):
    """The goal's budgets in words (first order)."""
    if loss_budget <= 0:
        return f"the stalls alone take {stall:.2%} of the time, more than the goal leaves ({1 - goal_ettr:.2%})"
    text = f"loss per failure {loss:.1f} s of a {loss_budget:.1f} s budget"
    if miss_budget is None:
        return text
    if miss_budget < 0:
        return text + "; not met even when the memory tier serves every failure"
    return text + f"; holds while the memory tier misses <= {miss_budget:.1%} of failures"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recovery-json", help="old design's incident: a recovery_bench.py JSON line")
    p.add_argument("--new-json", help="new design's incident, same format (else targets are used)")
    p.add_argument("--scale-json", help="per-host-count measurements of the costs that grow with the hosts")
    p.add_argument("--gpus", default="1024,4096,16384", help="job sizes (default 1024,4096,16384)")
    p.add_argument("--gpus-per-host", type=int, default=8)
    p.add_argument("--mttf-h", type=float, default=1.8,
                   help="MTTF anchor in hours (default 1.8, at 16,384 GPUs: Kokolis et al.'s projection)")
    p.add_argument("--mttf-gpus", type=int, default=16384, help="GPUs of the MTTF anchor")
    p.add_argument("--disk-interval-s", type=float, default=600.0, help="disk checkpoint interval (600: the default)")
    p.add_argument("--disk-stall-s", type=float, default=STALL_BLOCKING_S,
                   help="stall per disk checkpoint (0.134: blocking snapshot, docs/comparison.md)")
    p.add_argument("--disk-commit-lag-s", type=float, default=None,
                   help="disk snapshot -> commit (default: from the recovery JSON's replay)")
    p.add_argument("--snapshot-interval-s", type=float, default=30.0,
                   help="memory snapshot interval (30: about 5 steps of ~6 s; an assumption)")
    p.add_argument("--snapshot-stall-s", type=float, default=STALL_BLOCKING_S,
                   help="stall per memory snapshot (0.134, the same copy as the disk's; 0.002 overlapped)")
    p.add_argument("--target-restart-s", type=float, default=2.0, help="new design's restart TARGET without --new-json")
    p.add_argument("--target-snapshot-lag-s", type=float, default=1.0,
                   help="new design's snapshot -> replicated TARGET without --new-json")
    p.add_argument("--memory-miss-fraction", type=float, default=0.0,
                   help="share of failures the memory tier cannot serve (source and peer lost together): "
                        "restored from disk (default 0, an assumption; the output gives the break-even)")
    p.add_argument("--restart-extra-s", type=float, default=0.0,
                   help="seconds added to every restart (a large state's restore, NCCL setup), for sensitivity")
    p.add_argument("--store-ops-per-s", type=float, default=None,
                   help="the store's capacity, to turn extrapolated store ops per round into seconds")
    p.add_argument("--goal-ettr", type=float, default=0.99)
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 <= a.memory_miss_fraction <= 1:
        sys.exit("goodput_model.py: --memory-miss-fraction must be within [0, 1]")
    notes = []

    # The old design's incident: measured.
    rec = read_bench_line(a.recovery_json) if a.recovery_json else dict(README_RECOVERY)
    rec_source = a.recovery_json or "README.md launcher row (recovery_bench.py 5, median of 5)"
    lag, bench_interval = commit_lag(rec)
    if a.disk_commit_lag_s is not None:
        lag = a.disk_commit_lag_s
    old = {"detect_s": float(rec["detect_s"]), "restart_s": float(rec["restart_s"]), "lag_s": round(lag, 4),
           "source": "measured: " + rec_source, "restart_phases": rec.get("restart_phases")}

    # The new design's incident: measured, or targets.
    if a.new_json:
        nj = read_bench_line(a.new_json)
        new_lag, _ = commit_lag(nj)
        new = {"detect_s": float(nj["detect_s"]), "restart_s": float(nj["restart_s"]), "lag_s": round(new_lag, 4),
               "source": "measured: " + a.new_json, "restart_phases": nj.get("restart_phases"), "targets": False}
    else:
        new = {"detect_s": old["detect_s"], "restart_s": a.target_restart_s, "lag_s": a.target_snapshot_lag_s,
               "source": "TARGETS, not measurements", "restart_phases": None, "targets": True}

    scale = None
    if a.scale_json:
        with open(a.scale_json) as f:
            scale = scale_model(json.load(f))

    gpus_list = [int(g) for g in a.gpus.split(",") if g.strip()]
    cases = [(g, mttf_at(g, a.mttf_gpus, a.mttf_h), f"{a.mttf_h:g} h at {a.mttf_gpus} GPUs, 1/N") for g in gpus_list]
    cases.append((1024, KOKOLIS_1K_MEASURED_H * 3600, "Kokolis measured, 1,024-GPU jobs"))
    cases.append((LLAMA3_GPUS, LLAMA3_MTTI_H * 3600, "Llama 3, 419 in 54 days"))

    rows = []
    for gpus, mttf_s, mttf_source in cases:
        hosts = gpus / a.gpus_per_host
        sc = scale_costs(scale, hosts, a.store_ops_per_s)
        first = build_designs(a, old, new, mttf_s, sc["restart_add_s"], "first")
        daly = build_designs(a, old, new, mttf_s, sc["restart_add_s"], "daly")
        for key in ("old", "new", "young_daly_disk", "young_daly_mem"):
            d1, d2 = first[key], daly[key]
            loss1, replay1 = loss_per_failure(d1)
            loss2, replay2 = loss_per_failure(d2)
            row = {
                "design": key, "gpus": gpus, "hosts": hosts, "mttf_h": round(mttf_s / 3600, 3), "mttf_source": mttf_source,
                "detect_s": d1.detect_s, "restart_s": round(d1.restart_s, 3),
                "intervals_s": {t.name: round(t.interval_s, 1) for t in d1.tiers},
                "intervals_daly_s": {t.name: round(t.interval_s, 1) for t in d2.tiers},
                "replay_s": round(replay1, 2), "replay_daly_s": round(replay2, 2),
                "loss_per_failure_s": round(loss1, 2), "loss_per_failure_daly_s": round(loss2, 2),
                "stall_fraction": round(stall_fraction(d1), 6),
                "ettr_first_order": round(ettr_first_order(d1, mttf_s), 4),
                "ettr_daly": round(ettr_daly(d2, mttf_s), 4),
                "inputs": "targets" if key in ("new", "young_daly_mem") and new["targets"] else "measured",
            }
            if scale is not None:
                row["scale"] = sc
            rows.append(row)

    # The goal: the new design at 16,384 GPUs and 1.8 h.
    goal_m = 1.8 * 3600
    goal_sc = scale_costs(scale, 16384 / a.gpus_per_host, a.store_ops_per_s)
    g1 = build_designs(a, old, new, goal_m, goal_sc["restart_add_s"], "first")["new"]
    g2 = build_designs(a, old, new, goal_m, goal_sc["restart_add_s"], "daly")["new"]
    goal_e1, goal_e2 = ettr_first_order(g1, goal_m), ettr_daly(g2, goal_m)
    goal_met = min(goal_e1, goal_e2) >= a.goal_ettr
    # Budgets (first order): the per-failure loss, and the memory miss fraction, that keep the goal.
    loss_now, _ = loss_per_failure(g1)
    loss_budget = (1 - stall_fraction(g1) - a.goal_ettr) * goal_m
    mem_tier, disk_tier = g1.tiers
    extra_per_miss = (disk_tier.interval_s / 2 + disk_tier.commit_lag_s) - (mem_tier.interval_s / 2 + mem_tier.commit_lag_s)
    loss_no_miss = loss_now - a.memory_miss_fraction * extra_per_miss
    miss_budget = (loss_budget - loss_no_miss) / extra_per_miss if extra_per_miss > 0 else None
    goal = {"gpus": 16384, "mttf_h": 1.8, "ettr_min": a.goal_ettr, "design": "new",
            "ettr_first_order": round(goal_e1, 4), "ettr_daly": round(goal_e2, 4), "goal_met": goal_met,
            "inputs": "targets" if new["targets"] else "measured",
            "loss_per_failure_s": round(loss_now, 2), "loss_budget_s": round(loss_budget, 2),
            "memory_miss_fraction": a.memory_miss_fraction,
            "memory_miss_budget": round(miss_budget, 4) if miss_budget is not None else None}

    # --- Print ---
    print("goodput model (issue 22): ETTR = productive time / wall time, Poisson failures")
    print(f"  old design: {old['source']}: detection {old['detect_s']:.2f} s, restart {old['restart_s']:.2f} s, "
          f"disk commit lag {old['lag_s']:.2f} s" + (f" (replay {rec.get('lost_work_s')} s at a {bench_interval:g} s "
                                                     f"interval, minus half of it)" if bench_interval else ""))
    if old["restart_phases"]:
        print("    restart phases: " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in old["restart_phases"].items()))
    if new["targets"]:
        print(f"  new design: TARGETS, NOT MEASUREMENTS (no --new-json): restart {new['restart_s']:.2f} s "
              f"(recovery = detection + {new['restart_s']:g} s), snapshot commit lag {new['lag_s']:.2f} s "
              f"(replay = interval / 2 + lag), detection {new['detect_s']:.2f} s as measured for the old design")
    else:
        print(f"  new design: {new['source']}: detection {new['detect_s']:.2f} s, restart {new['restart_s']:.2f} s, "
              f"snapshot commit lag {new['lag_s']:.2f} s")
        if new["restart_phases"]:
            print("    restart phases: " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in new["restart_phases"].items()))
    print(f"  stalls: disk {a.disk_stall_s:g} s per checkpoint, memory {a.snapshot_stall_s:g} s per snapshot "
          f"(defaults: trainsup's blocking snapshot of 384 MiB, docs/comparison.md; overlapped: {STALL_OVERLAPPED_S:g} s); "
          f"intervals: disk {a.disk_interval_s:g} s, memory {a.snapshot_interval_s:g} s; "
          f"memory tier misses {a.memory_miss_fraction:.1%} of failures (assumed)")
    print(f"  MTTF: {a.mttf_h:g} h at {a.mttf_gpus} GPUs scaled as 1/N (Kokolis et al., arXiv 2410.21680: projection "
          f"from RSC-1's {KOKOLIS_RF_PER_NODE_DAY * 1000:.2f} failures per 1,000 node-days; figure "
          f"{'confirmed in the paper' if KOKOLIS_CONFIRMED == 'primary' else 'NOT read in the paper itself: three secondary readings and the arithmetic agree'});")
    print(f"        plus Kokolis' measured {KOKOLIS_1K_MEASURED_H} h at 1,024 GPUs (same status; 3.6x shorter than 1/N "
          f"predicts) and Llama 3's {LLAMA3_MTTI_H:.2f} h at 16,384 (arXiv 2407.21783 section 3.3.4, Table 5: confirmed)")
    if scale is None:
        print("  scale costs NOT included (no --scale-json): restart and detection are taken as measured on 2-3 "
              "simulated hosts of one machine, assumed independent of the job's size")
    else:
        if scale["estimated_points"]:
            print(f"  scale: {scale['estimated_points']} of the points are a model's estimates, not measurements"
                  + (f" ({scale['source']})" if scale["source"] else ""))
        for metric, f in scale["fits"].items():
            lin, log, quad = f["linear"], f["log"], f["quadratic"]
            print(f"  scale: {metric} at hosts {[int(h) for h in f['hosts']]}: linear {lin[0]:.4g} + {lin[1]:.4g} * hosts "
                  f"(rms {lin[2]:.3g}), log {log[0]:.4g} + {log[1]:.4g} * ln(hosts) (rms {log[2]:.3g}), "
                  f"quadratic {quad[0]:.4g} + {quad[1]:.4g} * hosts^2 (rms {quad[2]:.3g}); within the points "
                  f"interpolated, beyond them the best (least rms), never below the linear")
        print(f"    extrapolated from <= {int(max(max(f['hosts']) for f in scale['fits'].values()))} hosts to "
              f"{', '.join(str(int(g / a.gpus_per_host)) for g in gpus_list)} hosts ({a.gpus_per_host} GPUs each); "
              f"the restart grows by the extrapolated rendezvous beyond {scale['measured_hosts']:g} hosts"
              + ("" if a.store_ops_per_s else "; store ops are reported, not converted (no --store-ops-per-s)"))
        for g in gpus_list:
            sc = scale_costs(scale, g / a.gpus_per_host, a.store_ops_per_s)
            shown = [f"{k} {sc[k]:g} ({sc[fit_key]}{' fit' if sc[fit_key] in FIT_FUNCS else ''})"
                     for k, fit_key in FIT_KEYS if k in sc]
            print(f"    {int(g / a.gpus_per_host)} hosts: " + ", ".join(shown) + f"; restart + {sc['restart_add_s']:.2f} s"
                  + (" ; COORDINATOR SATURATED" if sc.get("coordinator_saturated") else ""))
    print()
    head = f"{'design':<26} {'GPUs':>6} {'MTTF h':>7} {'interval s (1st/Daly)':>22} {'loss/fail s':>11} " \
           f"{'stall %':>7} {'ETTR 1st':>8} {'ETTR Daly':>9}  MTTF source"
    print(head)
    print("-" * len(head))
    for i, r in enumerate(rows):
        if i and i % 4 == 0:
            print()
        tiers = [t for t in r["intervals_s"]]
        show = tiers[:1]  # the tier the row is about: memory for the new designs, disk otherwise
        iv = "/".join(f"{r['intervals_s'][t]:g}" + ("" if r["intervals_daly_s"][t] == r["intervals_s"][t]
                                                     else f"/{r['intervals_daly_s'][t]:g}") for t in show)
        label = LABELS[r["design"]] + (" *" if r["inputs"] == "targets" else "")
        print(f"{label:<26} {r['gpus']:>6} {r['mttf_h']:>7.2f} {iv:>22} {r['loss_per_failure_s']:>11.1f} "
              f"{r['stall_fraction'] * 100:>7.3f} {r['ettr_first_order']:>8.4f} {r['ettr_daly']:>9.4f}  {r['mttf_source']}")
    print()
    if new["targets"]:
        print("  * the new design's incident costs are TARGETS, not measurements")
    if scale is not None and any(r.get("scale", {}).get("coordinator_saturated") for r in rows):
        print("  ! the coordinator's extrapolated load reaches one core: detection figures do not hold there")
    print(f"  goal (new design, 16,384 GPUs, MTTF 1.8 h, ETTR >= {a.goal_ettr}): first order {goal_e1:.4f}, "
          f"Daly {goal_e2:.4f}: {'MET' if goal_met else 'NOT MET'}"
          f"{' (on targets)' if new['targets'] else ''}; " + budget_text(loss_now, loss_budget, miss_budget, stall_fraction(g1), a.goal_ettr))
    print(json.dumps({
        "bench": "goodput_model", "goal_met": goal_met, "goal": goal,
        "old_inputs": {k: v for k, v in old.items()}, "new_inputs": {k: v for k, v in new.items()},
        "params": {"disk_interval_s": a.disk_interval_s, "disk_stall_s": a.disk_stall_s,
                   "snapshot_interval_s": a.snapshot_interval_s, "snapshot_stall_s": a.snapshot_stall_s,
                   "memory_miss_fraction": a.memory_miss_fraction, "restart_extra_s": a.restart_extra_s,
                   "mttf_anchor_h": a.mttf_h, "mttf_anchor_gpus": a.mttf_gpus, "gpus_per_host": a.gpus_per_host},
        "sources": {"kokolis_2410.21680": {"mttf_16k_h": 1.8, "mttf_1k_measured_h": KOKOLIS_1K_MEASURED_H,
                                           "rf_per_node_day": KOKOLIS_RF_PER_NODE_DAY, "checked": KOKOLIS_CONFIRMED},
                    "llama3_2407.21783": {"gpus": LLAMA3_GPUS, "unexpected": 419, "days": 54,
                                          "mtti_h": round(LLAMA3_MTTI_H, 3), "checked": "primary"}},
        "scale_included": scale is not None, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
