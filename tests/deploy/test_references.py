"""The manifests agree with each other and with the code they run, overlay by overlay.

Each overlay is assembled (``manifests.assemble``: resources, namespace, images, patches) and
checked as one set: Services select pods and reach their ports, the InferencePool names the
picker's Service and port and selects the vLLM pods the picker watches, the HTTPRoute and
Gateway point at each other, the picker's Roles allow every call ``epp/_kube.py`` makes (and,
where it elects a leader, every Lease call of ``epp/_leader.py`` and the client's lock), and
the gateway's TOML loads with the gateway's own loader and lists the vLLM pods by name.
"""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path
from typing import Any

import pytest

from prefixroute.epp import V1_GROUP
from prefixroute.epp._protocol import HEALTH_SERVICES
from prefixroute.gateway import GatewayConfig, build_app, build_config, load_toml

from .manifests import OVERLAYS, ROOT, assemble, by_kind

Docs = list[dict[str, Any]]
KUBE_SOURCE = ROOT / "src" / "prefixroute" / "epp" / "_kube.py"
LEADER_SOURCE = ROOT / "src" / "prefixroute" / "epp" / "_leader.py"
POOL_SOURCE = ROOT / "src" / "prefixroute" / "epp" / "_pool.py"
WORKLOADS = ("Deployment", "StatefulSet")


def pod_templates(docs: Docs) -> list[dict[str, Any]]:
    return [d["spec"]["template"] for d in docs if d["kind"] in WORKLOADS]


def _selects(selector: dict[str, str], template: dict[str, Any]) -> bool:
    return selector.items() <= template["metadata"]["labels"].items()


def service_problems(docs: Docs) -> list[str]:
    """Services that select no pod, or a port no selected container has."""
    problems = []
    for name, svc in by_kind(docs, "Service").items():
        selector = svc["spec"]["selector"]
        pods = [t for t in pod_templates(docs) if _selects(selector, t)]
        if not pods:
            problems.append(f"Service {name} selects no pod")
        ports = [p for t in pods for c in t["spec"]["containers"] for p in c.get("ports", [])]
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if not any(target in (p["containerPort"], p.get("name")) for p in ports):
                problems.append(f"Service {name} port {port['name']}: no container port {target}")
    return problems


def workload_problems(docs: Docs) -> list[str]:
    """Workloads whose selector does not match their own pods."""
    return [
        f"{d['kind']} {d['metadata']['name']}"
        for d in docs
        if d["kind"] in WORKLOADS
        and not d["spec"]["selector"]["matchLabels"].items()
        <= d["spec"]["template"]["metadata"]["labels"].items()
    ]


def args_of(docs: Docs, deployment: str) -> dict[str, str]:
    container = by_kind(docs, "Deployment")[deployment]["spec"]["template"]["spec"]["containers"][0]
    return dict(a[2:].partition("=")[::2] for a in container["args"][1:])


def pool_problems(docs: Docs) -> list[str]:
    """The InferencePool against the picker's Service and flags and the pods it selects."""
    problems = []
    for name, pool in by_kind(docs, "InferencePool").items():
        ref, spec = pool["spec"]["endpointPickerRef"], pool["spec"]
        svc = by_kind(docs, "Service").get(ref["name"])
        if ref.get("kind", "Service") != "Service" or svc is None:
            problems.append(f"pool {name}: no picker Service {ref['name']}")
            continue
        port = next((p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"]), None)
        args = args_of(docs, ref["name"])
        if port is None or str(port["targetPort"]) != args.get("grpc-port"):
            problems.append(f"pool {name}: port {ref['port']['number']} is not the picker's gRPC")
        labels = ",".join(f"{k}={v}" for k, v in spec["selector"]["matchLabels"].items())
        if args.get("k8s-selector") != labels:
            problems.append(f"pool {name}: the picker watches {args.get('k8s-selector')}")
        number = spec["targetPorts"][0]["number"]
        if args.get("k8s-target-port") != str(number):
            problems.append(f"pool {name}: the picker addresses port {args.get('k8s-target-port')}")
        selected = [t for t in pod_templates(docs) if _selects(spec["selector"]["matchLabels"], t)]
        ports = {p["containerPort"] for t in selected for c in t["spec"]["containers"]
                 for p in c.get("ports", [])}  # fmt: skip
        if not selected or number not in ports:
            problems.append(f"pool {name}: selects no pod serving port {number}")
    return problems


def route_problems(docs: Docs) -> list[str]:
    problems = []
    for name, route in by_kind(docs, "HTTPRoute").items():
        for parent in route["spec"]["parentRefs"]:
            if parent.get("kind", "Gateway") != "Gateway" or parent["name"] not in by_kind(
                docs, "Gateway"
            ):
                problems.append(f"route {name}: no Gateway {parent['name']}")
        for rule in route["spec"]["rules"]:
            for backend in rule["backendRefs"]:
                pool = (backend.get("group"), backend.get("kind"))
                if pool != ("inference.networking.k8s.io", "InferencePool") or backend[
                    "name"
                ] not in by_kind(docs, "InferencePool"):
                    problems.append(f"route {name}: backend {backend['name']} is no InferencePool")
    return problems


def kube_calls(source: str) -> set[tuple[str, str]]:
    """(verb, resource) for every API call in ``epp/_kube.py``: ``self.api.list_namespaced_pod``
    is a list of pods, and the same method handed to ``Watch.stream`` a watch of them."""
    calls = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "api"
            and "_namespaced_" in node.attr
        ):
            verb, _, resource = node.attr.partition("_namespaced_")
            calls.add(({"read": "get"}.get(verb, verb), resource + "s"))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "stream":
            method = node.args[0]
            if isinstance(method, ast.Attribute):
                calls.add(("watch", method.attr.partition("_namespaced_")[2] + "s"))
    return calls


LEASE_CALL = re.compile(r"\b(read|create|replace|patch|delete|list)_namespaced_lease\b")


def lease_calls(*sources: str) -> set[tuple[str, str]]:
    """(verb, "leases") for every Lease call in ``sources`` (the election's module and the
    client's ``LeaseLock`` it runs), as RBAC names the verbs."""
    verbs = {"read": "get", "replace": "update"}
    return {(verbs.get(v, v), "leases") for src in sources for v in LEASE_CALL.findall(src)}


def rbac_problems(docs: Docs, calls: set[tuple[str, str]], group: str = "") -> list[str]:
    """The ``calls`` (verb, resource) in API ``group`` that a picker's service account is not
    granted by the Roles bound to it."""
    roles, bindings = by_kind(docs, "Role"), by_kind(docs, "RoleBinding").values()
    problems = []
    for name, dep in by_kind(docs, "Deployment").items():
        pod = dep["spec"]["template"]["spec"]
        if pod["containers"][0].get("args", [""])[0] != "epp":
            continue
        account = pod.get("serviceAccountName")
        bound = {b["roleRef"]["name"] for b in bindings
                 if any(s["kind"] == "ServiceAccount" and s["name"] == account
                        for s in b["subjects"])}  # fmt: skip
        allowed = {
            (verb, resource)
            for role in bound & roles.keys()
            for rule in roles[role]["rules"]
            if group in rule["apiGroups"]
            for verb in rule["verbs"]
            for resource in rule["resources"]
        }
        where = f"{group}/" if group else ""
        problems += [f"picker {name} may not {v} {where}{r}" for v, r in sorted(calls - allowed)]
    return problems


def elects(docs: Docs) -> bool:
    """Some picker runs with ``--ha-enable-leader-election`` (not ``=false``)."""
    return any(
        a in ("--ha-enable-leader-election", "--ha-enable-leader-election=true")
        for d in by_kind(docs, "Deployment").values()
        for a in d["spec"]["template"]["spec"]["containers"][0].get("args", [])
    )


@pytest.fixture(params=OVERLAYS, ids=lambda p: p.name)
def overlay(request: pytest.FixtureRequest) -> Docs:
    return assemble(request.param)


def test_services_and_workloads_hold_together(overlay: Docs) -> None:
    assert service_problems(overlay) == []
    assert workload_problems(overlay) == []


def test_the_pool_route_and_gateway_agree(overlay: Docs) -> None:
    assert pool_problems(overlay) == []
    assert route_problems(overlay) == []


def test_the_role_covers_what_the_pod_watcher_calls(overlay: Docs) -> None:
    calls = kube_calls(KUBE_SOURCE.read_text())
    assert calls == {("list", "pods"), ("watch", "pods")}  # the scan sees the watcher's calls
    assert rbac_problems(overlay, calls) == []


def test_the_picker_may_read_its_pool(overlay: Docs) -> None:
    source = POOL_SOURCE.read_text()
    assert "get_namespaced_custom_object" in source and '"inferencepools"' in source
    assert rbac_problems(overlay, {("get", "inferencepools")}, V1_GROUP) == []


def test_an_electing_picker_may_read_create_and_update_its_lease(overlay: Docs) -> None:
    from kubernetes.leaderelection.resourcelock import leaselock

    calls = lease_calls(LEADER_SOURCE.read_text(), Path(leaselock.__file__).read_text())
    assert calls == {("get", "leases"), ("create", "leases"), ("update", "leases")}
    if elects(overlay):
        assert rbac_problems(overlay, calls, "coordination.k8s.io") == []


def test_the_pickers_probes_name_its_health_services(overlay: Docs) -> None:
    for name, dep in by_kind(overlay, "Deployment").items():
        container = dep["spec"]["template"]["spec"]["containers"][0]
        if container.get("args", [""])[0] == "epp":
            for probe in ("readinessProbe", "livenessProbe"):
                assert container[probe]["grpc"]["service"] in HEALTH_SERVICES, name
                assert container[probe]["grpc"]["port"] == int(args_of(overlay, name)["grpc-port"])


def test_the_checks_catch_broken_references() -> None:
    docs = assemble(next(p for p in OVERLAYS if p.name == "epp"))
    broken = copy.deepcopy(docs)
    by_kind(broken, "Service")["prefixroute-epp"]["spec"]["selector"] = {"app": "epp"}
    assert service_problems(broken) == ["Service prefixroute-epp selects no pod"] + [
        f"Service prefixroute-epp port {p}: no container port {n}"
        for p, n in (("grpc", 9002), ("metrics", 9090))
    ]
    broken = copy.deepcopy(docs)
    by_kind(broken, "InferencePool")["vllm-pool"]["spec"]["endpointPickerRef"]["port"] = {
        "number": 9090
    }
    assert pool_problems(broken) == ["pool vllm-pool: port 9090 is not the picker's gRPC"]
    broken = copy.deepcopy(docs)
    by_kind(broken, "InferencePool")["vllm-pool"]["spec"]["targetPorts"] = [{"number": 8080}]
    assert len(pool_problems(broken)) == 2  # the picker's flag and the pods both disagree
    broken = copy.deepcopy(docs)
    by_kind(broken, "HTTPRoute")["llm-route"]["spec"]["rules"][0]["backendRefs"][0]["group"] = (
        "inference.networking.x-k8s.io"  # the v1alpha2 group
    )
    assert route_problems(broken) == ["route llm-route: backend vllm-pool is no InferencePool"]
    broken = copy.deepcopy(docs)
    by_kind(broken, "Role")["prefixroute-epp"]["rules"][0]["verbs"] = ["get", "list"]
    calls = kube_calls(KUBE_SOURCE.read_text())
    assert rbac_problems(broken, calls) == ["picker prefixroute-epp may not watch pods"]
    elect = assemble(next(p for p in OVERLAYS if p.name == "epp-leader"))
    assert elects(elect) and not elects(docs)
    by_kind(elect, "RoleBinding")["prefixroute-epp-leader-election"]["subjects"][0]["name"] = "x"
    assert rbac_problems(elect, {("update", "leases")}, "coordination.k8s.io") == [
        "picker prefixroute-epp may not update coordination.k8s.io/leases"
    ]


# --- prefixroute serve ------------------------------------------------------------------


def gateway_config(docs: Docs, tmp_path: Path) -> GatewayConfig:
    """The ConfigMap's TOML, loaded as ``serve --config`` loads it."""
    path = tmp_path / "gateway.toml"
    path.write_text(by_kind(docs, "ConfigMap")["prefixroute-gateway"]["data"]["gateway.toml"])
    return build_config(load_toml(path))


def serve_problems(docs: Docs, config: GatewayConfig) -> list[str]:
    problems = []
    dep = by_kind(docs, "Deployment")["prefixroute-gateway"]["spec"]["template"]["spec"]
    container = dep["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")["mountPath"]
    if container["args"] != ["serve", f"--config={mount}/gateway.toml"]:
        problems.append(f"the gateway runs {container['args']}")
    if config.host != "0.0.0.0" or config.port != container["ports"][0]["containerPort"]:
        problems.append(f"the gateway listens on {config.host}:{config.port}")
    vllm = by_kind(docs, "StatefulSet")["vllm"]
    headless = by_kind(docs, "Service")[vllm["spec"]["serviceName"]]["spec"]
    port = headless["ports"][0]["port"]
    names = [f"http://vllm-{i}.{vllm['spec']['serviceName']}:{port}"
             for i in range(vllm["spec"]["replicas"])]  # fmt: skip
    if headless.get("clusterIP") != "None" or list(config.replicas) != names:
        problems.append(f"replicas {list(config.replicas)}, pods {names}")
    routes = {r.resource.canonical for r in build_app(config).router.routes() if r.resource}
    for probe in ("readinessProbe", "livenessProbe"):
        if container[probe]["httpGet"]["path"] not in routes:
            problems.append(f"{probe} asks for {container[probe]['httpGet']['path']}")
    return problems


def test_the_gateway_config_is_real_and_lists_the_vllm_pods(tmp_path: Path) -> None:
    docs = assemble(next(p for p in OVERLAYS if p.name == "serve"))
    config = gateway_config(docs, tmp_path)
    assert config.policy == "predicted_ttft"
    assert (
        config.shutdown_timeout_s
        < (
            by_kind(docs, "Deployment")["prefixroute-gateway"]["spec"]["template"]["spec"][
                "terminationGracePeriodSeconds"
            ]
        )
    )
    assert serve_problems(docs, config) == []
    by_kind(docs, "StatefulSet")["vllm"]["spec"]["replicas"] = 3  # the list no longer matches
    container = by_kind(docs, "Deployment")["prefixroute-gateway"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    container["readinessProbe"]["httpGet"]["path"] = "/healthz"
    assert len(serve_problems(docs, config)) == 2


def test_an_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    docs = assemble(next(p for p in OVERLAYS if p.name == "serve"))
    data = by_kind(docs, "ConfigMap")["prefixroute-gateway"]["data"]
    data["gateway.toml"] = data["gateway.toml"].replace("block_chars", "block_size")
    with pytest.raises(Exception, match="unknown setting 'block_size'"):
        gateway_config(docs, tmp_path)
