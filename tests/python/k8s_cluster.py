"""A Kubernetes control plane on this machine for the suite (issue 23): Debian's etcd, and
kube-apiserver, kube-scheduler and kube-controller-manager built from Debian's `kubernetes`
source package (1.20) by scripts/k8s-build.sh, started and stopped by the test itself,
everything under one work directory.

What it is and is not:
- The API server runs with RBAC on (`--authorization-mode=RBAC`) and static-token authentication
  for the administrator (group system:masters); service-account tokens are real (TokenRequest,
  signed with a key of this cluster), so a test can act as a ServiceAccount and be refused what
  its Role does not grant.
- No kubelet: nodes are registered through the API and made Ready by patching their status
  (with CPU, memory, pods and nvidia.com/gpu capacity). The scheduler binds pods to them, the
  Job controller makes and replaces a Job's pods, nothing ever runs in them; a test plays the
  kubelet by setting a pod's status (e.g. Failed with exit code 95).
- Facts found on this machine (issue 23): `--disable-admission-plugins=ServiceAccount` (no
  token controller here); the controller-manager runs `--controllers=*,-nodeipam,-nodelifecycle,
  -serviceaccount-token` (no pod CIDRs to hand out; no kubelet to keep nodes Ready).

    with KubeCluster(workdir, bin_dir) as k:
        k.add_node("host-a")
        api = k.core()              # kubernetes.client.CoreV1Api as the administrator
"""
import json
import os
import pathlib
import shutil
import ssl
import subprocess
import time
import urllib.request

from daemons import Daemons
from trainsup.ports import free_port

BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")


def binaries_dir():
    """The directory with the three servers, TRAINSUP_K8S_BIN (scripts/k8s-check.sh sets it to
    scripts/k8s-build.sh's cache), or None when it is not set or lacks one of them."""
    d = os.environ.get("TRAINSUP_K8S_BIN")
    if d and all((pathlib.Path(d) / b).is_file() for b in BINARIES):
        return pathlib.Path(d)
    return None


class KubeCluster(Daemons):
    def __init__(self, workdir, bin_dir):
        self.dir = pathlib.Path(workdir).resolve()
        self.bin = pathlib.Path(bin_dir)
        self.procs = {}
        self.log_dir = self.dir / "log"
        self.admin_token = os.urandom(16).hex()
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self._clients = {}

    # --- setup ---
    def _write_files(self):
        d = self.dir
        for sub in ("etcd", "certs", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")],
                       check=True, capture_output=True)
        (d / "tokens.csv").write_text(f'{self.admin_token},admin,admin,"system:masters"\n')
        self.admin_kubeconfig = self.write_kubeconfig(d / "admin.kubeconfig", "admin", self.admin_token)

    def write_kubeconfig(self, path, user, token):
        """A kubeconfig for `user` with a bearer token, trusting this cluster's serving certificate."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": self.server,
                                                   "certificate-authority": str(self.dir / "certs" / "apiserver.crt")}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": user}}],
        }
        pathlib.Path(path).write_text(json.dumps(cfg))  # JSON is YAML
        return str(path)

    def _start(self, name, cmd):
        out = open(self.dir / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    def _ready(self):
        ctx = ssl.create_default_context(cafile=str(self.dir / "certs" / "apiserver.crt")) \
            if (self.dir / "certs" / "apiserver.crt").exists() else None
        if ctx is None:
            return False
        ctx.check_hostname = False
        req = urllib.request.Request(f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def start(self):
        self._write_files()
        d = self.dir
        etcd_port, peer_port = free_port(), free_port()
        self._start("etcd", [shutil.which("etcd") or "/usr/bin/etcd", "--data-dir", str(d / "etcd"),
                             "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                             "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                             "--initial-cluster", f"default=http://127.0.0.1:{peer_port}"])
        self._start("kube-apiserver", [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
            "--insecure-port=0", f"--cert-dir={d / 'certs'}",
            f"--token-auth-file={d / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            f"--service-account-key-file={d / 'sa.pub'}", f"--service-account-signing-key-file={d / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/24",
        ])
        self._until(self._ready, 90, "kube-apiserver ready (/readyz)")
        self._start("kube-scheduler", [str(self.bin / "kube-scheduler"), f"--kubeconfig={self.admin_kubeconfig}",
                                       "--leader-elect=false", "--port=0", "--secure-port=0"])
        self._start("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), f"--kubeconfig={self.admin_kubeconfig}",
            "--leader-elect=false", "--port=0", "--secure-port=0", "--use-service-account-credentials=false",
            "--controllers=*,-nodeipam,-nodelifecycle,-serviceaccount-token"])
        return self

    def stop(self):
        for name in ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(5)

    # --- the API ---
    def api_client(self, kubeconfig=None):
        """A kubernetes.client.ApiClient for `kubeconfig` (default: the administrator's)."""
        from kubernetes import config
        path = kubeconfig or self.admin_kubeconfig
        if path not in self._clients:
            self._clients[path] = config.new_client_from_config(config_file=path)
        return self._clients[path]

    def core(self, kubeconfig=None):
        from kubernetes import client
        return client.CoreV1Api(self.api_client(kubeconfig))

    def add_node(self, name, gpus=8):
        """Registers node `name` (label kubernetes.io/hostname=name) and makes it Ready and
        untainted, with 16 CPUs, 64 GiB, 110 pods and `gpus` nvidia.com/gpu."""
        api = self.core()
        api.create_node({"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        api.patch_node_status(name, {"status": {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "registered by the test (no kubelet)",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
        # The API server's TaintNodesByCondition admission gives a new node the taint
        # node.kubernetes.io/not-ready:NoSchedule; the node lifecycle controller (not run here:
        # no kubelet keeps a lease) would lift it once the node is Ready.
        api.patch_node(name, {"spec": {"taints": []}})

    def service_account_kubeconfig(self, namespace, name, path):
        """A kubeconfig that acts as ServiceAccount namespace/name, with a token from the
        TokenRequest API (what a pod's projected token is)."""
        api = self.core()
        req = api.create_namespaced_service_account_token(name, namespace, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"], "expirationSeconds": 3600}})
        return self.write_kubeconfig(path, f"system:serviceaccount:{namespace}:{name}", req.status.token)

