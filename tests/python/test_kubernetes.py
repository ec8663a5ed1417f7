"""Quarantine on a real Kubernetes API server (issue 23): examples/launch/kubernetes/rbac.yaml and
trainsup-job.yaml applied to a control plane built from Debian's source package
(tests/python/k8s_cluster.py, binaries from scripts/k8s-build.sh); a real trainsup job whose
host-b is stopped (examples/launch/recovery_scenario.py spare, host names = node names) has its
agents cordon and taint node host-b with the ServiceAccount's token; the Job's pod on host-b
fails as the kubelet would report the agent's exit 95, and the replacement pod is never placed
on host-b, cordoned or (uncordoned by hand) only tainted: it waits (nowhere else to go) and is
bound to host-d once that node joins. RBAC is on:
the same token is refused every verb the Role does not grant. An operator's `trainsup quarantine
remove` lifts it all.

Run by scripts/k8s-check.sh, which builds the servers (minutes, once: not in CI) and sets
TRAINSUP_K8S_BIN; without it this test skips (ctest python.kubernetes)."""
import json
import os
import subprocess
import sys

import pytest

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import utils  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from k8s_cluster import KubeCluster, binaries_dir  # noqa: E402
from trainsup import kube  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(REPO, "examples", "launch", "kubernetes")
SCENARIO = os.path.join(REPO, "examples", "launch", "recovery_scenario.py")

pytestmark = pytest.mark.skipif(binaries_dir() is None,
                                reason="TRAINSUP_K8S_BIN names no built kube-apiserver: run scripts/k8s-check.sh")


def _pods(api):
    return api.list_namespaced_pod("default", label_selector="job-name=trainsup-train").items


def _bound(api):
    """{pod name: node} of the Job's pods that are bound and not failed."""
    return {p.metadata.name: p.spec.node_name for p in _pods(api)
            if p.spec.node_name and p.status.phase != "Failed"}


def _fail_pod_as_the_kubelet_would(api, pod, exit_code):
    api.patch_namespaced_pod_status(pod.metadata.name, "default", {"status": {
        "phase": "Failed",
        "containerStatuses": [{"name": "trainer", "image": pod.spec.containers[0].image, "imageID": "",
                               "ready": False, "restartCount": 0,
                               "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}}]}})


def _unschedulable_message(api, name):
    p = api.read_namespaced_pod(name, "default")
    for c in p.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return c.message
    return None


def test_a_quarantined_host_is_cordoned_and_tainted_and_the_replacement_pod_goes_elsewhere(tmp_path):
    with KubeCluster(tmp_path / "k8s", binaries_dir()) as k:
        api = k.core()
        for node in ("host-a", "host-b", "host-c"):
            k.add_node(node)
        # The administrator's part: the shared volume the Job mounts, then the examples as users apply them.
        api.create_persistent_volume({"apiVersion": "v1", "kind": "PersistentVolume",
                                      "metadata": {"name": "shared"},
                                      "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                                               "storageClassName": "", "hostPath": {"path": str(tmp_path / "pv")}}})
        api.create_namespaced_persistent_volume_claim("default", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "trainsup-shared"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "shared",
                     "resources": {"requests": {"storage": "1Gi"}}}})
        admin = k.api_client()
        utils.create_from_yaml(admin, os.path.join(K8S, "rbac.yaml"))
        utils.create_from_yaml(admin, os.path.join(K8S, "trainsup-job.yaml"))
        placed = k.wait_for(lambda: (lambda b: b if len(b) == 3 else None)(_bound(api)), 90,
                            "the Job's 3 pods bound to nodes")
        assert sorted(placed.values()) == ["host-a", "host-b", "host-c"], placed  # one per node

        # RBAC: the agents' ServiceAccount may get and patch nodes, nothing else.
        agent_cfg = k.service_account_kubeconfig("default", "trainsup-agent", tmp_path / "agent.kubeconfig")
        agent = k.core(agent_cfg)
        assert agent.read_node("host-b").metadata.name == "host-b"
        for refused in (lambda: agent.delete_node("host-c"), lambda: agent.list_node(),
                        lambda: agent.list_namespaced_pod("default"),
                        lambda: agent.patch_node_status("host-c", {"status": {"conditions": []}})):
            with pytest.raises(ApiException) as e:
                refused()
            assert e.value.status == 403, e.value

        # The job: host-b's worker is stopped; its agents name host-b and quarantine it, acting
        # on Kubernetes with the ServiceAccount's token.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   TRAINSUP_KUBERNETES_QUARANTINE="1", TRAINSUP_KUBECONFIG=agent_cfg)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        out = subprocess.run([sys.executable, SCENARIO, "spare", str(tmp_path / "job"), "--steps", "400"],
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert summary["quarantine"] == ["host-b"] and summary["agent_exit_codes"]["host-b"] == 95, summary
        events = [json.loads(line) for p in (tmp_path / "job" / "run").glob("agent-*.events.jsonl")
                  for line in open(p)]
        cordons = [e for e in events if e["event"] == "quarantine_kubernetes"]
        assert cordons and all(e["ok"] for e in cordons), cordons
        verdict = next(e for e in events if e["event"] == "quarantine")["verdict"]

        node = api.read_node("host-b")
        assert node.spec.unschedulable is True
        assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [(kube.TAINT_KEY, verdict, "NoSchedule")]
        assert node.metadata.labels[kube.LABEL_KEY] == verdict
        record = json.loads((tmp_path / "job" / "run" / "quarantine" / "host-b.json").read_text())
        assert node.metadata.annotations[kube.REASON_ANNOTATION] == record["reason"]
        print(f"[k8s] host-b: unschedulable, taint {kube.TAINT_KEY}={verdict}:NoSchedule, "
              f"reason {record['reason'][:100]!r}")

        # The agent on host-b exited 95: its pod fails; the Job controller replaces it, and the
        # scheduler has nowhere to put the replacement but host-b, which it refuses.
        (victim,) = [p for p in _pods(api) if p.spec.node_name == "host-b"]
        _fail_pod_as_the_kubelet_would(api, victim, 95)
        pending = k.wait_for(lambda: [p.metadata.name for p in _pods(api)
                                      if not p.spec.node_name and _unschedulable_message(api, p.metadata.name)],
                             60, "a replacement pod that the scheduler could not place")
        message = _unschedulable_message(api, pending[0])
        print(f"[k8s] replacement {pending[0]}: {message}")
        assert "1 node(s) were unschedulable" in message, message  # host-b: cordoned
        # The taint holds on its own: an operator who uncordons host-b (kubectl uncordon) does
        # not release it to the job's pods.
        api.patch_node("host-b", {"spec": {"unschedulable": False}})
        message = k.wait_for(lambda: (lambda m: m if m and "had taint" in m else None)(
            _unschedulable_message(api, pending[0])), 60, "the scheduler's answer for an uncordoned, tainted host-b")
        print(f"[k8s] replacement {pending[0]} with host-b uncordoned: {message}")
        assert f"{{{kube.TAINT_KEY}: {verdict}}}" in message, message
        assert not api.read_namespaced_pod(pending[0], "default").spec.node_name
        # A new machine joins the pool: the replacement goes there.
        k.add_node("host-d")
        placed = k.wait_for(lambda: (lambda b: b if len(b) == 3 else None)(_bound(api)), 60,
                            "the replacement pod bound")
        assert sorted(placed.values()) == ["host-a", "host-c", "host-d"], placed

        # The operator releases host-b: taint, label and annotations go, the cordon is lifted.
        rel = subprocess.run([sys.executable, "-m", "trainsup", "quarantine", "remove", "host-b",
                              "--dir", str(tmp_path / "job" / "run" / "quarantine")],
                             env=dict(env, TRAINSUP_KUBECONFIG=agent_cfg), capture_output=True, text=True,
                             timeout=60)
        assert rel.returncode == 0, rel.stderr
        node = api.read_node("host-b")
        assert not node.spec.unschedulable and not node.spec.taints
        assert kube.LABEL_KEY not in (node.metadata.labels or {})
        assert kube.REASON_ANNOTATION not in (node.metadata.annotations or {})
