"""The Slurm and Kubernetes launch examples, checked for syntax and for what trainsup needs
(no cluster here): bash parses the sbatch script, its #SBATCH lines are well formed, srun runs
one trainsup-run per node with per-host log files; the manifests parse as YAML and run
trainsup-run with the rendezvous at pod 0 and the settings the launcher reads."""
import os
import re
import subprocess

import pytest
import yaml

LAUNCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                      "launch")


def test_slurm_sbatch_script():
    """Syntax and shape only; tests/python/test_slurm.py runs this very script on a Slurm cluster."""
    path = os.path.join(LAUNCH, "slurm", "train.sbatch")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    text = open(path).read()
    directives = re.findall(r"^#SBATCH\s+(\S+)", text, re.MULTILINE)
    assert directives and all(re.fullmatch(r"--[a-z-]+(=\S+)?", d) for d in directives), directives
    assert "--ntasks-per-node=1" in directives and "--requeue" in directives
    assert re.search(r'srun --output="%x-%j-%N.out"', text)
    assert "--kill-on-bad-exit=0" in text and '--nnodes="$min:$active"' in text
    assert "trainsup quarantine exclude-arg" in text and "TRAINSUP_QUARANTINE_DIR" in text
    # Both rendezvous choices expand to torchrun flags (etcd-v2 when an etcd endpoint is given).
    for env, want in (({}, "--rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400"),
                      ({"TRAINSUP_ETCD_ENDPOINT": "etcd1:2379"}, "--rdzv_backend=etcd-v2 --rdzv_endpoint=etcd1:2379")):
        block = text[text.index("if [[ -n \"${TRAINSUP_ETCD_ENDPOINT"):text.index("fi\n", text.index("rdzv=(")) + 3]
        out = subprocess.run(["bash", "-c", 'head_node=n1; head_addr=10.0.0.1; port=29400; ' + block +
                              'echo "${rdzv[@]}"'],
                             env=dict({k: v for k, v in os.environ.items() if k != "TRAINSUP_ETCD_ENDPOINT"}, **env),
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == want, (env, out.stdout, out.stderr)


def test_local_three_hosts_script_parses():
    assert subprocess.run(["bash", "-n", os.path.join(LAUNCH, "local_3hosts.sh")]).returncode == 0


def test_kubernetes_manifests():
    with open(os.path.join(LAUNCH, "kubernetes", "trainsup-job.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Service", "Job"}
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"]
    svc, job = kinds["Service"], kinds["Job"]
    assert svc["spec"]["clusterIP"] == "None"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 3
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"]
    c = pod["containers"][0]
    assert c["command"] == ["trainsup-run"]
    assert f"--rdzv_endpoint={job['metadata']['name']}-0.{svc['metadata']['name']}:29400" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["TRAINSUP_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert {"TRAINSUP_RUN_DIR", "TRAINSUP_QUARANTINE_DIR"} <= set(env)
    assert env["TRAINSUP_KUBERNETES_QUARANTINE"]["value"] == "1"
    # The agents' ServiceAccount is the one rbac.yaml binds (tested against an API server by
    # tests/python/test_kubernetes.py, run by scripts/k8s-check.sh).
    with open(os.path.join(LAUNCH, "kubernetes", "rbac.yaml")) as f:
        rbac = {d["kind"]: d for d in yaml.safe_load_all(f) if d}
    assert pod["serviceAccountName"] == rbac["ServiceAccount"]["metadata"]["name"]
    assert rbac["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]


def test_the_monitoring_examples_pass_promtool():
    """examples/monitoring: the scrape config and the alert rules docs/metrics.md gives, checked
    by Prometheus's own tool (Debian's prometheus package)."""
    import shutil
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (scripts/install-deps.sh installs Debian's prometheus)")
    mon = os.path.join(os.path.dirname(LAUNCH), "monitoring")
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "trainsup-alerts.yml"]):
        out = subprocess.run([promtool, *args], cwd=mon, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(mon, "trainsup-alerts.yml")) as f:
        alerts = {r["alert"]: r["expr"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
    # The three: a host quarantined, ETTR below a threshold, no spare left.
    assert {"TrainsupHostQuarantined", "TrainsupEttrLow", "TrainsupNoSpareLeft"} <= set(alerts)
