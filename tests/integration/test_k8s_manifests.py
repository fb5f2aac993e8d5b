"""deploy/k8s: every overlay renders with `kubectl kustomize` and every rendered object
validates against the Kubernetes API schema (kubernetes-validate, strict: unknown fields
fail) of the versions we state. Then the wiring the schema cannot see: Services select
pods and name their ports, references to Secrets and ConfigMaps resolve, every CacheRoute
container has gRPC probes and a scrape annotation on its metrics port, the HPA and PDBs
point at what exists, and every CACHEROUTE_* variable set is one a service reads.

kubectl is Debian's `kubernetes-client` (1.20, kustomize v2.0.3) or any newer kubectl; the
manifests use the syntax both accept. CACHEROUTE_KUBECTL names another binary."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from services.model import parse_replicas

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
# The oldest version we support (grpc probes are GA since 1.27, autoscaling/v2 since 1.23)
# and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.30.0", "1.37.0")
# Created by the operator in production (overlays/production/kustomization.yaml says how).
EXTERNAL_SECRETS = {"cacheroute-secrets"}
WORKLOADS = {"Deployment", "StatefulSet"}
# Custom resources kubernetes-validate has no schema for (their CRDs come with the Gateway API
# and its Inference Extension): checked field by field in test_gateway_api_overlay_wires_the_picker.
CUSTOM_KINDS = {("inference.networking.k8s.io/v1", "InferencePool"), ("gateway.networking.k8s.io/v1", "HTTPRoute")}


def _kubectl() -> str:
    exe = os.environ.get("CACHEROUTE_KUBECTL") or shutil.which("kubectl")
    assert exe, "kubectl not found: install Debian's kubernetes-client (.ci/run does)"
    return exe


_rendered: dict[str, list[dict]] = {}


def render(overlay: str) -> list[dict]:
    if overlay not in _rendered:
        out = subprocess.run([_kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"kubectl kustomize {overlay}: {out.stderr.strip()}"
        _rendered[overlay] = [d for d in yaml.safe_load_all(out.stdout) if d]
    return _rendered[overlay]


def _name(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _pods(objs: list[dict]) -> list[tuple[dict, dict]]:
    return [(o, o["spec"]["template"]) for o in objs if o["kind"] in WORKLOADS]


def _selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _known_env() -> set[str]:
    names: set[str] = set()
    for path in list((ROOT / "services").rglob("*.py")) + list((ROOT / "clients").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        names.update(re.findall(r"CACHEROUTE_[A-Z0-9_]+", text))
        # rpc.env("NAME") / env_number("NAME", ...) read CACHEROUTE_NAME
        names.update("CACHEROUTE_" + n for n in re.findall(r"\benv(?:_number)?\(\s*\"([A-Z0-9_]+)\"", text))
    return names


def test_overlays_exist():
    assert {"trial", "production", "vllm", "gateway-api"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates(overlay, version):
    objs = render(overlay)
    assert objs
    failures = []
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{_name(obj)}: {exc.message} at {'.'.join(map(str, exc.path))}")
    assert not failures, "\n".join(failures)


def test_a_bad_object_fails_validation():
    """The validator is not a no-op: a misspelt field and a wrong type are rejected."""
    obj = next(o for o in render("trial") if o["kind"] == "Service")
    bad = {**obj, "spec": {**obj["spec"], "ports": [{"port": "grpc", "targtPort": 1}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_wiring(overlay):
    objs = render(overlay)
    by_kind: dict[str, dict[str, dict]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    assert len(namespaces) == 1 and None not in namespaces, f"one namespace for everything: {namespaces}"
    pods = _pods(objs)
    secrets = set(by_kind.get("Secret", {})) | EXTERNAL_SECRETS
    configmaps = set(by_kind.get("ConfigMap", {}))
    known = _known_env()

    for svc in by_kind["Service"].values():
        chosen = [t for _, t in pods if _selects(svc["spec"]["selector"], t["metadata"]["labels"])]
        if not chosen:
            continue   # a Service for something outside the overlay (none today)
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            named = {p.get("name") for t in chosen for c in t["spec"]["containers"] for p in c.get("ports", [])}
            numbered = {p["containerPort"] for t in chosen for c in t["spec"]["containers"] for p in c.get("ports", [])}
            assert target in named or target in numbered, f"Service/{svc['metadata']['name']}: no port {target}"
    for svc_name, svc in by_kind["Service"].items():
        assert any(_selects(svc["spec"]["selector"], t["metadata"]["labels"]) for _, t in pods), \
            f"Service/{svc_name} selects no pod"

    for obj, tmpl in pods:
        assert _selects(obj["spec"]["selector"]["matchLabels"], tmpl["metadata"]["labels"]), _name(obj)
        if obj["kind"] == "StatefulSet":
            assert obj["spec"]["serviceName"] in by_kind["Service"], _name(obj)
        spec = tmpl["spec"]
        for vol in spec.get("volumes", []):
            if "secret" in vol:
                assert vol["secret"]["secretName"] in secrets, f"{_name(obj)}: {vol}"
        for c in spec["containers"]:
            for ref in c.get("envFrom", []):
                if "configMapRef" in ref:
                    assert ref["configMapRef"]["name"] in configmaps, _name(obj)
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets, f"{_name(obj)}: {e}"
                if e["name"].startswith("CACHEROUTE_"):
                    assert e["name"] in known, f"{_name(obj)}: no service reads {e['name']}"
            if not c["image"].startswith("redis"):
                ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                probe = c["readinessProbe"]["grpc"]
                assert probe["port"] == ports["grpc"] and probe["service"].startswith("cacheroute.v1."), _name(obj)
                assert c["livenessProbe"]["grpc"]["port"] == ports["grpc"], _name(obj)
                ann = tmpl["metadata"].get("annotations", {})
                assert ann.get("prometheus.io/scrape") == "true", _name(obj)
                assert int(ann["prometheus.io/port"]) == ports["metrics"], _name(obj)
                assert c["securityContext"]["readOnlyRootFilesystem"] is True, _name(obj)

    for cm in by_kind.get("ConfigMap", {}).values():
        for key, value in cm.get("data", {}).items():
            if key.startswith("CACHEROUTE_"):
                assert key in known, f"ConfigMap/{cm['metadata']['name']}: no service reads {key}"
        replicas = cm.get("data", {}).get("CACHEROUTE_REPLICAS")
        if replicas is not None:
            parse_replicas(replicas)   # the dispatchers' own parser

    deployments = by_kind["Deployment"]
    assert deployments["cacheroute-planner"]["spec"]["replicas"] == 2   # one leads by the Redis lease
    for hpa in by_kind["HorizontalPodAutoscaler"].values():
        ref = hpa["spec"]["scaleTargetRef"]
        target = by_kind[ref["kind"]][ref["name"]]
        assert any(m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"])
        assert all("cpu" in c["resources"]["requests"] for c in target["spec"]["template"]["spec"]["containers"])
    assert "cacheroute-dispatcher" in by_kind["HorizontalPodAutoscaler"]
    for pdb in by_kind["PodDisruptionBudget"].values():
        sel = pdb["spec"]["selector"]["matchLabels"]
        assert any(_selects(sel, t["metadata"]["labels"]) for _, t in pods), f"PDB/{pdb['metadata']['name']}"
    assert {"cacheroute-dispatcher", "cacheroute-planner"} <= set(by_kind["PodDisruptionBudget"])
    dispatcher_ports = {p["name"] for p in by_kind["Service"]["cacheroute-dispatcher"]["spec"]["ports"]}
    assert {"grpc", "http"} <= dispatcher_ports


def test_trial_runs_its_own_redis_and_engines():
    objs = render("trial")
    names = {_name(o) for o in objs}
    assert {"StatefulSet/redis", "StatefulSet/engine", "Service/redis", "Service/engine"} <= names
    secret = next(o for o in objs if o["kind"] == "Secret")
    import base64

    url = base64.b64decode(secret["data"]["redis-url"]).decode()
    assert url.startswith("redis://redis-0.redis:")
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    engines = parse_replicas(cm["data"]["CACHEROUTE_REPLICAS"])
    sts = next(o for o in objs if _name(o) == "StatefulSet/engine")
    assert [r.id for r in engines] == [f"engine-{i}" for i in range(sts["spec"]["replicas"])]


def test_production_keeps_no_secret_and_no_redis():
    for overlay in ("production", "vllm"):
        kinds = {o["kind"] for o in render(overlay)}
        assert "Secret" not in kinds and "StatefulSet" not in kinds, overlay


def test_vllm_overlay_fronts_the_vllm_service():
    cm = next(o for o in render("vllm") if o["kind"] == "ConfigMap")
    assert cm["data"]["CACHEROUTE_ENGINE_KIND"] == "vllm"
    assert parse_replicas(cm["data"]["CACHEROUTE_REPLICAS"])[0].address == "http://vllm:8000"


def test_gateway_api_overlay_wires_the_picker():
    objs = render("gateway-api")
    kinds = {(o["apiVersion"], o["kind"]) for o in objs}
    assert CUSTOM_KINDS <= kinds
    assert all((o["apiVersion"], o["kind"]) in CUSTOM_KINDS or o["apiVersion"].count("/") <= 1 for o in objs)
    by = {_name(o): o for o in objs}
    pool = by["InferencePool/cacheroute-pool"]
    assert set(pool["spec"]) == {"selector", "targetPorts", "endpointPickerRef"}
    assert set(pool["spec"]["selector"]) == {"matchLabels"} and pool["spec"]["targetPorts"][0]["number"] == 8000
    ref = pool["spec"]["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"} and ref["failureMode"] in ("FailOpen", "FailClose")
    svc = by[f"Service/{ref['name']}"]
    port = next(p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"])
    chosen = [t for _, t in _pods(objs) if _selects(svc["spec"]["selector"], t["metadata"]["labels"])]
    assert chosen and all(c["command"][-1] == "dispatcher" for t in chosen for c in t["spec"]["containers"])
    container_ports = {p.get("name"): p["containerPort"] for t in chosen for c in t["spec"]["containers"]
                       for p in c.get("ports", [])}
    cm = by["ConfigMap/cacheroute-config"]
    assert int(cm["data"]["CACHEROUTE_EXT_PROC_PORT"]) == container_ports[port["targetPort"]]
    engines = parse_replicas(cm["data"]["CACHEROUTE_REPLICAS"])
    assert all(r.address.endswith(f":{pool['spec']['targetPorts'][0]['number']}") for r in engines)
    route = by["HTTPRoute/cacheroute-inference"]
    backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert backends == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "cacheroute-pool"}]
