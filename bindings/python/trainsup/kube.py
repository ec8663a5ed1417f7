"""Quarantine on Kubernetes: cordon and taint the node of a quarantined host, through the API.

Contract. `KubeNodes.quarantine(record)` takes a quarantine record (trainsup/quarantine.py:
{"host", "verdict", "reason", "gpu", "time", ...}; `host` is the Kubernetes node name, which is
what trainsup calls a host when TRAINSUP_NODE_NAME is the pod's spec.nodeName) and, in one patch
of the Node object:
- cordons it (spec.unschedulable = true), unless it already was, remembering that in the
  annotation `trainsup.io/cordoned` so that a release uncordons only what trainsup cordoned;
- adds the taint `trainsup.io/quarantined=<verdict>:<effect>` (NoSchedule by default; NoExecute
  also evicts the pods already there), replacing an older taint of that key and keeping all others;
- labels it `trainsup.io/quarantined=<verdict>` (label-safe) and writes the whole reason in the
  annotation `trainsup.io/quarantine-reason` (labels cannot hold it), with `-gpu` and `-time`.
`release(host)` undoes exactly that. Both read the node first and send its resourceVersion with
the patch, so a concurrent change (another controller's taint) makes the API server refuse it
(409) and the call reads again and retries, instead of overwriting the other change.

The verbs used are `get` and `patch` on `nodes` (cluster-scoped): the ClusterRole in
examples/launch/kubernetes/rbac.yaml grants exactly these. Errors (403 without those rights, 404
for a node name that is not a node, no API server) raise KubeError with the node, the verb and the
API server's message; the caller (the agent's quarantine) records it as an event and goes on: the
quarantine record stands either way.

Credentials: in a pod (KUBERNETES_SERVICE_HOST set) the pod's service account (in-cluster config);
otherwise the kubeconfig named by TRAINSUP_KUBECONFIG, KUBECONFIG or ~/.kube/config. Enabled in
the launcher by TRAINSUP_KUBERNETES_QUARANTINE=1 (docs/configuration.md). Uses the official
`kubernetes` client from PyPI (`pip install trainsup[kubernetes]`), imported only when used.
"""
import os
import re
import time
from typing import Any, Dict, List, Optional

__all__ = ["KubeNodes", "KubeError", "enabled", "TAINT_KEY", "LABEL_KEY", "REASON_ANNOTATION"]

TAINT_KEY = "trainsup.io/quarantined"
LABEL_KEY = "trainsup.io/quarantined"
REASON_ANNOTATION = "trainsup.io/quarantine-reason"
GPU_ANNOTATION = "trainsup.io/quarantine-gpu"
TIME_ANNOTATION = "trainsup.io/quarantine-time"
CORDONED_ANNOTATION = "trainsup.io/cordoned"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_CONFLICT_RETRIES = 5
REQUEST_TIMEOUT_S = 10  # each API call: a quarantine must not wait on an unreachable API server


class KubeError(RuntimeError):
    """A Kubernetes API call that failed: names the node, the verb and the server's answer."""

    def __init__(self, node: str, verb: str, status: Optional[int], message: str) -> None:
        self.node, self.verb, self.status = node, verb, status
        super().__init__(f"kubernetes: {verb} node {node!r} failed"
                         f"{' (HTTP %d)' % status if status else ''}: {message}")


def enabled(env: Optional[Dict[str, str]] = None) -> bool:
    """Whether TRAINSUP_KUBERNETES_QUARANTINE asks for cordon and taint ("1", "true", "yes", "on")."""
    value = (env if env is not None else os.environ).get("TRAINSUP_KUBERNETES_QUARANTINE", "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def label_value(text: str) -> str:
    """`text` as a valid label (and taint) value: at most 63 characters of [A-Za-z0-9_.-],
    beginning and ending with an alphanumeric character ("" stays "")."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return value.strip("_.-")


def _message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if body:
        try:
            import json
            return str(json.loads(body).get("message", body))
        except (ValueError, AttributeError):
            return str(body)
    return str(getattr(exc, "reason", None) or exc)


class KubeNodes:
    """Cordon, taint and annotate nodes (see the module's contract)."""

    def __init__(self, api: Any = None, effect: Optional[str] = None, kubeconfig: Optional[str] = None) -> None:
        effect = effect or os.environ.get("TRAINSUP_KUBERNETES_TAINT_EFFECT", "NoSchedule")
        if effect not in EFFECTS:
            raise ValueError(f"TRAINSUP_KUBERNETES_TAINT_EFFECT: {effect!r} is not one of {', '.join(EFFECTS)}")
        self.effect = effect
        self.api = api if api is not None else self._connect(kubeconfig)

    @staticmethod
    def _connect(kubeconfig: Optional[str]) -> Any:
        try:
            from kubernetes import client, config
        except ImportError as e:
            raise KubeError("*", "connect", None,
                            "the `kubernetes` Python package is missing (pip install 'trainsup[kubernetes]')") from e
        path = kubeconfig or os.environ.get("TRAINSUP_KUBECONFIG")
        if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        else:
            try:
                config.load_kube_config(config_file=path)
            except Exception as e:  # the client raises ConfigException, or OSError for a bad path
                raise KubeError("*", "connect", None, f"no kubeconfig usable ({path or 'KUBECONFIG or ~/.kube/config'}): {e}") from e
        return client.CoreV1Api()

    def _get(self, node: str) -> Any:
        try:
            return self.api.read_node(node, _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as e:
            raise KubeError(node, "get", getattr(e, "status", None), _message(e)) from e

    def _patch(self, node: str, body: Dict[str, Any]) -> bool:
        """Sends `body`; False on a conflict (the node changed since it was read)."""
        try:
            self.api.patch_node(node, body, _request_timeout=REQUEST_TIMEOUT_S)
            return True
        except Exception as e:
            status = getattr(e, "status", None)
            if status == 409:
                return False
            raise KubeError(node, "patch", status, _message(e)) from e

    @staticmethod
    def _taints(obj: Any) -> List[Dict[str, Any]]:
        out = []
        for t in (obj.spec.taints or []):
            d = {"key": t.key, "effect": t.effect}
            if t.value is not None:
                d["value"] = t.value
            if getattr(t, "time_added", None) is not None:
                d["timeAdded"] = t.time_added.isoformat() if hasattr(t.time_added, "isoformat") else t.time_added
            out.append(d)
        return out

    def _update(self, node: str, build) -> Dict[str, Any]:
        for _ in range(_CONFLICT_RETRIES):
            obj = self._get(node)
            body = build(obj)
            body.setdefault("metadata", {})["resourceVersion"] = obj.metadata.resource_version
            if self._patch(node, body):
                return body
            time.sleep(0.05)
        raise KubeError(node, "patch", 409, f"the node kept changing ({_CONFLICT_RETRIES} conflicts in a row)")

    def quarantine(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """Cordons and taints the node `record["host"]` (see the module's contract); returns the
        patch that was applied."""
        node = record["host"]
        verdict = label_value(str(record.get("verdict") or "quarantined")) or "quarantined"

        def build(obj: Any) -> Dict[str, Any]:
            taints = [t for t in self._taints(obj) if t["key"] != TAINT_KEY]
            taints.append({"key": TAINT_KEY, "value": verdict, "effect": self.effect})
            annotations = {
                REASON_ANNOTATION: str(record.get("reason", "")),
                GPU_ANNOTATION: str(record.get("gpu", "")),
                TIME_ANNOTATION: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(record.get("time", time.time())))),
            }
            already = bool(obj.spec.unschedulable)
            ours = (obj.metadata.annotations or {}).get(CORDONED_ANNOTATION) == "true"
            annotations[CORDONED_ANNOTATION] = "true" if (ours or not already) else "false"
            return {"metadata": {"labels": {LABEL_KEY: verdict}, "annotations": annotations},
                    "spec": {"unschedulable": True, "taints": taints}}

        return self._update(node, build)

    def release(self, node: str) -> Dict[str, Any]:
        """Removes trainsup's taint, label and annotations from `node`, and uncordons it if
        trainsup cordoned it; returns the patch that was applied."""

        def build(obj: Any) -> Dict[str, Any]:
            annotations = obj.metadata.annotations or {}
            spec: Dict[str, Any] = {"taints": [t for t in self._taints(obj) if t["key"] != TAINT_KEY]}
            if annotations.get(CORDONED_ANNOTATION) == "true":
                spec["unschedulable"] = False
            gone = {k: None for k in (REASON_ANNOTATION, GPU_ANNOTATION, TIME_ANNOTATION, CORDONED_ANNOTATION)}
            return {"metadata": {"labels": {LABEL_KEY: None}, "annotations": gone}, "spec": spec}

        return self._update(node, build)
