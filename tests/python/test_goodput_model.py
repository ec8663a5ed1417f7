"""bench/goodput_model.py (issue 22): its formulas on cases with known answers, and its inputs and
output. Pure Python: no build, no torch. The script is loaded by path (bench/ is no package)."""
import importlib.util
import json
import math
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("goodput_model", os.path.join(REPO, "bench", "goodput_model.py"))
gm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gm)


def one_tier(interval, stall=0.0, lag=0.0, detect=0.0, restart=0.0):
    return gm.Design("d", detect, restart, [gm.Tier("disk", interval, stall, lag, 1.0)])


def run(capsys, *argv):
    assert gm.main(list(argv)) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return lines, json.loads(lines[-1])


def test_no_loss_gives_ettr_one():
    # No stall, no failure cost, (almost) no failures: both estimates are 1.
    d = one_tier(interval=1e-6)
    assert gm.ettr_first_order(d, 6480) == pytest.approx(1.0, abs=1e-9)
    assert gm.ettr_daly(one_tier(interval=600), 1e15) == pytest.approx(1.0, abs=1e-9)
    # Without failures only the stall is lost: tau / (tau + C).
    assert gm.ettr_daly(one_tier(interval=600, stall=6), 1e15) == pytest.approx(600 / 606, rel=1e-9)


def test_young_interval_is_sqrt_2cm_and_maximises_the_first_order_ettr():
    assert gm.young_interval(2, 6480) == pytest.approx(math.sqrt(2 * 2 * 6480))
    assert gm.young_interval(2, 6480) == pytest.approx(161.0, abs=0.1)  # docs/notes/issue22-research.md, section 6
    tau = gm.young_interval(0.134, 6480)
    best = gm.ettr_first_order(one_tier(tau, stall=0.134), 6480)
    for other in (tau * 0.9, tau * 1.1):
        assert gm.ettr_first_order(one_tier(other, stall=0.134), 6480) < best


def test_first_order_matches_the_research_notes_hand_figure():
    # M = 1.8 h, C = 2 s, tau = Young's 161 s, R = 300 s: ETTR ~ 92.9% (issue22-research.md, section 6).
    tau = gm.young_interval(2, 6480)
    assert gm.ettr_first_order(one_tier(tau, stall=2, restart=300), 6480) == pytest.approx(0.929, abs=5e-4)


@pytest.mark.parametrize("mttf_min,expected_min", [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_interval_reproduces_dalys_figures(mttf_min, expected_min):
    # Daly 2006 (FGCS 22(3)), Figs. 3-5: dump time 5 min, restart 10 min.
    assert gm.daly_interval(5, mttf_min) == pytest.approx(expected_min, abs=0.35)


def test_daly_interval_is_the_optimum_of_dalys_cost_function_and_capped_at_m():
    tau = gm.daly_interval(5, 360)
    best = gm.ettr_daly(one_tier(tau, stall=5, restart=10), 360)
    for other in (tau * 0.97, tau * 1.03):
        assert gm.ettr_daly(one_tier(other, stall=5, restart=10), 360) < best
    assert gm.daly_interval(10, 4) == 4  # C >= 2M: tau = M


def test_ettr_falls_as_mttf_falls():
    for design in (one_tier(600, stall=0.134, lag=0.6, detect=5, restart=3.8),
                   gm.Design("new", 5, 2, [gm.Tier("memory", 30, 0.134, 1, 0.9), gm.Tier("disk", 600, 0.134, 0.6, 0.1)])):
        for estimate in (gm.ettr_first_order, gm.ettr_daly):
            values = [estimate(design, h * 3600) for h in (28.8, 7.9, 3.09, 1.8, 0.5)]
            assert values == sorted(values, reverse=True) and values[0] > values[-1]


def test_higher_order_agrees_with_first_order_when_costs_are_small():
    d = one_tier(41.7, stall=0.134, lag=0.6, detect=5, restart=3.8)
    assert gm.ettr_daly(d, 6480) == pytest.approx(gm.ettr_first_order(d, 6480), abs=1e-3)


def test_mttf_scales_as_one_over_n():
    assert gm.mttf_at(16384, 16384, 1.8) == pytest.approx(1.8 * 3600)
    assert gm.mttf_at(1024, 16384, 1.8) == pytest.approx(28.8 * 3600)
    # Kokolis et al.'s 1.8 h is RSC-1's rate at 2,048 nodes: 1 / (2048 * 6.5e-3) days.
    assert 24 / (2048 * gm.KOKOLIS_RF_PER_NODE_DAY) == pytest.approx(1.8, abs=0.01)
    assert gm.LLAMA3_MTTI_H == pytest.approx(3.09, abs=0.01)


def test_json_line_parses_and_marks_targets(capsys):
    lines, out = run(capsys)
    assert out["bench"] == "goodput_model" and isinstance(out["goal_met"], bool)
    assert len(out["rows"]) == 5 * 4  # 3 sizes on the 1/N anchor + 2 published cases, 4 designs each
    assert {r["design"] for r in out["rows"]} == {"old", "new", "young_daly_disk", "young_daly_mem"}
    assert all(r["inputs"] == "targets" for r in out["rows"] if r["design"] in ("new", "young_daly_mem"))
    assert out["goal"]["inputs"] == "targets" and out["goal"]["gpus"] == 16384 and out["goal"]["mttf_h"] == 1.8
    assert any("TARGETS, NOT MEASUREMENTS" in line for line in lines)
    assert any("scale costs NOT included" in line for line in lines)
    old16k = next(r for r in out["rows"] if r["design"] == "old" and r["gpus"] == 16384 and r["mttf_h"] == 1.8)
    # README's figures: 5.0 + 3.8 + 600 / 2 + (1.1 - 1.0 / 2) = 309.4 s per failure.
    assert old16k["loss_per_failure_s"] == pytest.approx(309.4)


def test_measured_inputs_from_bench_lines(tmp_path, capsys):
    rec = tmp_path / "recovery.log"
    rec.write_text("recovery benchmark: ...\n  round: detect 4.96 s\n" + json.dumps(
        {"bench": "recovery", "detect_s": 4.0, "restart_s": 3.0, "lost_work_s": 1.5, "checkpoint_every_steps": 50,
         "step_s": 0.02, "restart_phases": {"stop_s": 0.3, "rendezvous_s": 1.2, "start_s": 1.5}}) + "\n")
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"bench": "recovery", "detect_s": 4.0, "restart_s": 1.0, "lost_work_s": 0.7,
                               "snapshot_every_steps": 10, "step_s": 0.02}) + "\n")
    lines, out = run(capsys, "--recovery-json", str(rec), "--new-json", str(new), "--gpus", "16384")
    assert out["old_inputs"]["lag_s"] == pytest.approx(1.0)   # 1.5 - (50 * 0.02) / 2
    assert out["new_inputs"]["lag_s"] == pytest.approx(0.6)   # 0.7 - (10 * 0.02) / 2
    assert out["goal"]["inputs"] == "measured" and all(r["inputs"] == "measured" for r in out["rows"])
    assert any("restart phases: stop 0.30 s, rendezvous 1.20 s" in line for line in lines)
    row = next(r for r in out["rows"] if r["design"] == "new" and r["mttf_h"] == 1.8)
    assert row["loss_per_failure_s"] == pytest.approx(4.0 + 1.0 + 30 / 2 + 0.6)


def test_scale_fits_and_extrapolation(tmp_path, capsys):
    hosts = [2, 4, 8, 16]
    lin = gm.fit(hosts, [1 + 0.5 * h for h in hosts], "linear")
    assert lin[:2] == pytest.approx((1, 0.5)) and lin[2] == pytest.approx(0, abs=1e-12)
    log = gm.fit(hosts, [2 + 3 * math.log(h) for h in hosts], "log")
    assert log[:2] == pytest.approx((2, 3)) and log[2] == pytest.approx(0, abs=1e-12)
    doc = {"measured_hosts": 2, "points": [{"hosts": h, "rendezvous_s": 1 + 0.01 * h, "coordinator_cpu_s_per_s": 0.001 * h}
                                           for h in hosts]}
    model = gm.scale_model(doc)
    value, kind = gm.extrapolate(model, "rendezvous_s", 2048)
    assert kind == "linear" and value == pytest.approx(1 + 0.01 * 2048)
    costs = gm.scale_costs(model, 2048, None)
    assert costs["restart_add_s"] == pytest.approx(0.01 * (2048 - 2))
    # A cost that grows with the square of the hosts (every node repeating O(hosts) work) is
    # extrapolated as one; a flattening (log) cost never below its linear fit.
    quad = {"points": [{"hosts": h, "rendezvous_s": 0.2 + 0.002 * h * h} for h in hosts]}
    value, kind = gm.extrapolate(gm.scale_model(quad), "rendezvous_s", 2048)
    assert kind == "quadratic" and value == pytest.approx(0.2 + 0.002 * 2048 ** 2)
    flat = gm.scale_model({"points": [{"hosts": h, "rendezvous_s": 1 + math.log(h)} for h in hosts]})
    value, kind = gm.extrapolate(flat, "rendezvous_s", 2048)
    assert kind == "linear" and value == pytest.approx(gm.predict(flat["fits"]["rendezvous_s"]["linear"], 2048, "linear"))
    # Within the points (a model's figures up to 2,048 hosts) no fit is needed: interpolated;
    # below them, the first point (the smallest job measured), not a fit's negative value.
    steep = gm.scale_model({"points": [{"hosts": 8, "rendezvous_s": 0.4}, {"hosts": 512, "rendezvous_s": 16.0},
                                       {"hosts": 2048, "rendezvous_s": 3000.0}]})
    assert gm.extrapolate(steep, "rendezvous_s", 2048) == (3000.0, "interpolated")
    assert gm.extrapolate(steep, "rendezvous_s", 1280)[0] == pytest.approx((16.0 + 3000.0) / 2)
    assert gm.extrapolate(steep, "rendezvous_s", 2) == (0.4, "first point")
    assert gm.scale_costs(steep, 2048, None)["restart_add_s"] == pytest.approx(3000.0 - 0.4)
    assert costs["coordinator_saturated"] is True
    path = tmp_path / "scale.json"
    path.write_text(json.dumps(doc))
    lines, out = run(capsys, "--scale-json", str(path))
    assert out["scale_included"] is True
    plain = gm.ettr_first_order(gm.build_designs(gm.parse_args([]), {"detect_s": 5, "restart_s": 3.8, "lag_s": 0.6},
                                                 {"detect_s": 5, "restart_s": 2, "lag_s": 1}, 6480, 0.0, "first")["new"], 6480)
    assert out["goal"]["ettr_first_order"] < round(plain, 4)
    assert any("COORDINATOR SATURATED" in line for line in lines)


def test_memory_miss_budget_is_where_the_goal_breaks(capsys):
    _, out = run(capsys)
    budget = out["goal"]["memory_miss_budget"]
    assert budget is not None and 0 < budget < 1
    _, below = run(capsys, "--memory-miss-fraction", str(budget * 0.9))
    _, above = run(capsys, "--memory-miss-fraction", str(min(1.0, budget * 1.1)))
    assert below["goal"]["ettr_first_order"] >= 0.99 > above["goal"]["ettr_first_order"]
