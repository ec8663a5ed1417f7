"""trainsup/kube.py against a stand-in for the API server's Node endpoint (read_node, patch_node
with a strategic merge of metadata and a resourceVersion precondition, as the API server does):
the patch a quarantine sends, what it keeps of other taints, that a release undoes only
trainsup's own cordon, that a concurrent change is retried rather than overwritten, and the
errors. tests/python/test_kubernetes.py runs the same code against a real API server
(scripts/k8s-check.sh)."""
import copy

import pytest

kubernetes = pytest.importorskip("kubernetes")
from kubernetes.client import V1Node, V1NodeSpec, V1ObjectMeta, V1Taint  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from trainsup import kube  # noqa: E402
from trainsup.launch.quarantine_policy import AgentQuarantine  # noqa: E402
from trainsup.quarantine import Quarantine  # noqa: E402


class FakeNodes:
    """Nodes as dicts; patch_node merges maps (None deletes a key), replaces lists (taints
    have no merge key), and refuses a stale resourceVersion with 409."""

    def __init__(self):
        self.nodes = {}
        self.patches = []
        self.before_patch = None  # called once before the next patch (a concurrent writer)

    def add(self, name, unschedulable=False, taints=(), annotations=None):
        self.nodes[name] = {"metadata": {"name": name, "labels": {}, "annotations": dict(annotations or {}),
                                         "resourceVersion": "1"},
                            "spec": {"unschedulable": unschedulable, "taints": list(taints)}}

    def read_node(self, name, _request_timeout=None):
        if name not in self.nodes:
            raise ApiException(status=404, reason=f'nodes "{name}" not found')
        n = self.nodes[name]
        return V1Node(metadata=V1ObjectMeta(name=name, labels=dict(n["metadata"]["labels"]),
                                            annotations=dict(n["metadata"]["annotations"]),
                                            resource_version=n["metadata"]["resourceVersion"]),
                      spec=V1NodeSpec(unschedulable=n["spec"]["unschedulable"],
                                      taints=[V1Taint(**t) for t in n["spec"]["taints"]] or None))

    def patch_node(self, name, body, _request_timeout=None):
        if self.before_patch is not None:
            hook, self.before_patch = self.before_patch, None
            hook()
        n = self.nodes[name]
        if body["metadata"].get("resourceVersion") != n["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.patches.append(copy.deepcopy(body))
        for field in ("labels", "annotations"):
            for k, v in body["metadata"].get(field, {}).items():
                if v is None:
                    n["metadata"][field].pop(k, None)
                else:
                    n["metadata"][field][k] = v
        for k, v in body.get("spec", {}).items():
            n["spec"][k] = [{"key": t["key"], "value": t.get("value"), "effect": t["effect"]} for t in v] \
                if k == "taints" else v
        n["metadata"]["resourceVersion"] = str(int(n["metadata"]["resourceVersion"]) + 1)


RECORD = {"host": "gpu-node-17", "verdict": "gpu_hardware", "gpu": "GPU-abc",
          "reason": "RuntimeError: CUDA error: unspecified launch failure (NVML: 1 uncorrectable ECC errors)",
          "time": 1_800_000_000.0}


def test_a_quarantine_cordons_taints_labels_and_keeps_other_taints():
    api = FakeNodes()
    api.add("gpu-node-17", taints=[{"key": "dedicated", "value": "llm", "effect": "NoSchedule"},
                                   {"key": kube.TAINT_KEY, "value": "old", "effect": "NoSchedule"}])
    kube.KubeNodes(api=api).quarantine(RECORD)
    n = api.nodes["gpu-node-17"]
    assert n["spec"]["unschedulable"] is True
    assert n["spec"]["taints"] == [{"key": "dedicated", "value": "llm", "effect": "NoSchedule"},
                                   {"key": kube.TAINT_KEY, "value": "gpu_hardware", "effect": "NoSchedule"}]
    assert n["metadata"]["labels"] == {kube.LABEL_KEY: "gpu_hardware"}
    a = n["metadata"]["annotations"]
    assert a[kube.REASON_ANNOTATION] == RECORD["reason"] and a[kube.GPU_ANNOTATION] == "GPU-abc"
    assert a[kube.TIME_ANNOTATION] == "2027-01-15T08:00:00Z" and a[kube.CORDONED_ANNOTATION] == "true"
    # Quarantined again (a second verdict): still one trainsup taint.
    kube.KubeNodes(api=api, effect="NoExecute").quarantine(dict(RECORD, verdict="hung_rank"))
    assert [t for t in n["spec"]["taints"] if t["key"] == kube.TAINT_KEY] == \
        [{"key": kube.TAINT_KEY, "value": "hung_rank", "effect": "NoExecute"}]


def test_a_release_uncordons_only_a_node_trainsup_cordoned():
    api = FakeNodes()
    api.add("mine")
    api.add("operators", unschedulable=True)  # cordoned by an operator before trainsup came
    nodes = kube.KubeNodes(api=api)
    for name in ("mine", "operators"):
        nodes.quarantine(dict(RECORD, host=name))
        nodes.release(name)
        n = api.nodes[name]
        assert n["spec"]["taints"] == [] and n["metadata"]["labels"] == {} and n["metadata"]["annotations"] == {}
    assert api.nodes["mine"]["spec"]["unschedulable"] is False
    assert api.nodes["operators"]["spec"]["unschedulable"] is True


def test_a_concurrent_change_is_read_again_not_overwritten():
    api = FakeNodes()
    api.add("gpu-node-17")

    def another_controller():  # e.g. the node lifecycle controller adding its own taint
        n = api.nodes["gpu-node-17"]
        n["spec"]["taints"].append({"key": "node.kubernetes.io/unreachable", "value": None, "effect": "NoExecute"})
        n["metadata"]["resourceVersion"] = "7"

    api.before_patch = another_controller
    kube.KubeNodes(api=api).quarantine(RECORD)
    assert [t["key"] for t in api.nodes["gpu-node-17"]["spec"]["taints"]] == ["node.kubernetes.io/unreachable",
                                                                            kube.TAINT_KEY]
    assert len(api.patches) == 1 and api.patches[0]["metadata"]["resourceVersion"] == "7"


def test_errors_name_the_node_the_verb_and_the_servers_answer():
    api = FakeNodes()
    with pytest.raises(kube.KubeError, match=r"get node 'nope' failed \(HTTP 404\)") as e:
        kube.KubeNodes(api=api).quarantine(dict(RECORD, host="nope"))
    assert e.value.status == 404 and e.value.node == "nope"
    with pytest.raises(ValueError, match="TRAINSUP_KUBERNETES_TAINT_EFFECT: 'NoWay'"):
        kube.KubeNodes(api=api, effect="NoWay")
    assert kube.label_value("hung rank: #157 (allreduce)!") == "hung-rank-157-allreduce"
    assert kube.enabled({"TRAINSUP_KUBERNETES_QUARANTINE": "1"}) and not kube.enabled({})


def test_the_agents_quarantine_stands_when_the_api_refuses(tmp_path):
    class Refusing(FakeNodes):
        def patch_node(self, name, body, _request_timeout=None):
            raise ApiException(status=403, reason="Forbidden")

    class Events:
        def __init__(self):
            self.written = []

        def write(self, event, **kw):
            self.written.append(dict(kw, event=event))

    api = Refusing()
    api.add("host-b")
    events = Events()
    q = AgentQuarantine(Quarantine(str(tmp_path)), "host-a", events, ttl_s=60, commands="", kubernetes=True)
    q._kube = kube.KubeNodes(api=api)
    q.impose("host-b", "hung", "hung_rank")
    assert q.get("host-b")["verdict"] == "hung_rank"  # the record is written either way
    (k,) = [e for e in events.written if e["event"] == "quarantine_kubernetes"]
    assert k["ok"] is False and "patch node 'host-b' failed (HTTP 403)" in k["error"]
