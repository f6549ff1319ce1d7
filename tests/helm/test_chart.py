"""The chart (issue 7): what the rendered manifests promise an SRE, for the default values and for
every file under deploy/helm/ci/, and which values it refuses (readably)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dataplane_service_kit.health import READYZ_BOUND_S
from dataplane_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm"
VALUES = Path(__file__).resolve().parent / "values"
CASES: dict[str, list[Path]] = {"default": [], **{p.stem: [p] for p in sorted((CHART / "ci").glob("*.yaml"))}}

SERVICES = {"query-gateway": 8000, "signaling": 8001, "filter-resolver": 8002, "audit-relay": 8003}
CONSUMERS = {
    "filter-resolver": ("dataplane.plan.requests", "dataplane-filter-resolver"),
    "audit-relay": ("dataplane.audit.disclosures", "dataplane-audit-relay"),
}
# Variables carrying a secret: only ever from a secretKeyRef, never a literal value.
SECRET_ENV = {
    "KAFKA_BOOTSTRAP_SERVERS",
    "REDIS_URL",
    "DATASETS_DATABASE_URL",
    "DATABASE_URL",
    "DPS_FLOWS_DATABASE_URL",
    "ROW_FILTERS_CACHE_KEY_SECRET",
    "CELINE_OIDC_CLIENT_SECRET",
    "DPS_TOKEN_SIGNING_KEY",
}
HOOK = "pre-install,pre-upgrade"

Obj = dict[str, Any]


# render.py is a script beside the chart, not a package
chart = load_script("deploy/helm/render.py", "dataplane_chart_render")


def values_of(*files: Path) -> dict[str, Any]:
    result: dict[str, Any] = chart.load_values(CHART / "values.yaml", *files)
    return result


def render(*files: Path, **extra: Any) -> list[Obj]:
    values: dict[str, Any] = chart.load_values(*files)
    chart._deep_merge(values, extra)
    objs: list[Obj] = chart.render_objects(values)
    return objs


def of_kind(objs: list[Obj], kind: str) -> dict[str, Obj]:
    """Objects of one kind, by the service (or component) label."""
    return {o["metadata"]["labels"]["app.kubernetes.io/name"]: o for o in objs if o["kind"] == kind}


def refusal(*files: Path) -> str:
    with pytest.raises(chart.ChartError) as err:
        render(*files)
    return str(err.value)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {case: render(*files) for case, files in CASES.items()}


def test_ci_values_cover_everything_enabled_and_minimal() -> None:
    assert {"everything-enabled", "minimal"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_four_deployments_with_probes_resources_and_restricted_security(
    rendered: dict[str, list[Obj]], case: str
) -> None:
    deployments = of_kind(rendered[case], "Deployment")
    assert set(deployments) == set(SERVICES)
    for name, dep in deployments.items():
        pod = dep["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        port = {p["name"]: p["containerPort"] for p in container["ports"]}[
            container["readinessProbe"]["httpGet"]["port"]
        ]
        assert port == SERVICES[name]
        env = {e["name"]: e for e in container["env"]}
        assert env["HTTP_PORT"]["value"] == str(SERVICES[name])
        assert container["resources"]["requests"] and container["resources"]["limits"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]
        assert pod["serviceAccountName"] == dep["metadata"]["name"]
    assert set(of_kind(rendered[case], "ServiceAccount")) >= set(SERVICES)


@pytest.mark.parametrize("case", CASES)
def test_service_per_component_on_its_port(rendered: dict[str, list[Obj]], case: str) -> None:
    services = of_kind(rendered[case], "Service")
    assert {name: svc["spec"]["ports"][0]["port"] for name, svc in services.items()} == SERVICES
    assert services["filter-resolver"]["spec"]["ports"][0]["name"] == "metrics"
    assert services["query-gateway"]["spec"]["ports"][0]["name"] == "http"


@pytest.mark.parametrize("case", ["default", "everything-enabled"])
def test_a_pdb_for_each_service(rendered: dict[str, list[Obj]], case: str) -> None:
    pdbs = of_kind(rendered[case], "PodDisruptionBudget")
    deployments = of_kind(rendered[case], "Deployment")
    assert set(pdbs) == set(SERVICES)
    for name, pdb in pdbs.items():
        assert pdb["apiVersion"] == "policy/v1"
        assert pdb["spec"]["selector"]["matchLabels"] == deployments[name]["spec"]["selector"]["matchLabels"]
        assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])


def test_per_service_values_override_the_globals(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["everything-enabled"]
    pdbs = of_kind(objs, "PodDisruptionBudget")
    assert pdbs["query-gateway"]["spec"] == {**pdbs["query-gateway"]["spec"], "minAvailable": 2}
    assert "maxUnavailable" not in pdbs["query-gateway"]["spec"]
    assert pdbs["signaling"]["spec"]["maxUnavailable"] == 1
    containers = {
        n: d["spec"]["template"]["spec"]["containers"][0] for n, d in of_kind(objs, "Deployment").items()
    }
    assert containers["query-gateway"]["resources"]["limits"]["memory"] == "1Gi"
    assert containers["signaling"]["resources"]["limits"]["memory"] == "512Mi"
    assert (
        containers["filter-resolver"]["image"]
        == "registry.example.org/mirror/dataplane-filter-resolver:1.2.4"
    )
    assert containers["audit-relay"]["image"] == "registry.example.org/dataplane/dataplane/audit-relay:1.2.3"
    env = {e["name"]: e for e in containers["query-gateway"]["env"]}
    assert env["CELINE_OIDC_CLIENT_ID"]["value"] == "dataplane-gateway"
    assert env["OTEL_TRACES_SAMPLER"]["value"] == "parentbased_always_on"


def test_minimal_has_no_optional_parts(rendered: dict[str, list[Obj]]) -> None:
    kinds = {o["kind"] for o in rendered["minimal"]}
    assert kinds.isdisjoint(
        {
            "PodDisruptionBudget",
            "HorizontalPodAutoscaler",
            "ScaledObject",
            "ServiceMonitor",
            "NetworkPolicy",
            "Job",
        }
    )
    assert {d["spec"]["replicas"] for d in of_kind(rendered["minimal"], "Deployment").values()} == {1}


@pytest.mark.parametrize("case", CASES)
def test_autoscaling_hpa_xor_keda_never_above_partitions(rendered: dict[str, list[Obj]], case: str) -> None:
    objs = rendered[case]
    values = values_of(*CASES[case])
    partitions = {t: spec["partitions"] for t, spec in values["kafka"]["topics"].items()}
    hpas = of_kind(objs, "HorizontalPodAutoscaler")
    scaled = of_kind(objs, "ScaledObject")
    for name, dep in of_kind(objs, "Deployment").items():
        scalers = [o for o in (hpas.get(name), scaled.get(name)) if o is not None]
        autoscaled = "replicas" not in dep["spec"]
        assert len(scalers) == (1 if autoscaled else 0), name
        for scaler in scalers:
            assert scaler["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
        if name in scaled:
            assert name in CONSUMERS and values["keda"]["enabled"]
            (trigger,) = scaled[name]["spec"]["triggers"]
            assert trigger["type"] == "kafka"
            assert (trigger["metadata"]["topic"], trigger["metadata"]["consumerGroup"]) == CONSUMERS[name]
            assert trigger["metadata"]["bootstrapServersFromEnv"] == "KAFKA_BOOTSTRAP_SERVERS"
        if name in CONSUMERS:
            topic = CONSUMERS[name][0]
            ceiling = (
                scaled[name]["spec"]["maxReplicaCount"]
                if name in scaled
                else hpas[name]["spec"]["maxReplicas"]
                if name in hpas
                else dep["spec"]["replicas"]
            )
            assert ceiling <= partitions[topic], (name, ceiling, partitions[topic])
    if case == "everything-enabled":
        assert set(scaled) == set(CONSUMERS)
        assert set(hpas) == {"query-gateway", "signaling"}


@pytest.mark.parametrize(
    ("file", "expected"),
    [
        ("above-partitions-hpa.yaml", "services.filter-resolver: autoscaling.maxReplicas 8 is above the 6"),
        ("above-partitions-keda.yaml", "services.audit-relay: autoscaling.maxReplicas 4 is above the 3"),
        ("above-partitions-fixed.yaml", "services.filter-resolver: replicas 7 is above the 6"),
    ],
)
def test_replicas_above_topic_partitions_refused(file: str, expected: str) -> None:
    message = refusal(VALUES / file)
    assert expected in message
    assert "kafka.topics." in message


def test_min_above_max_replicas_refused() -> None:
    with pytest.raises(chart.ChartError, match=r"minReplicas \(5\) is above maxReplicas \(3\)"):
        render(services={"signaling": {"autoscaling": {"minReplicas": 5, "maxReplicas": 3}}})


@pytest.mark.parametrize("case", ["default", "everything-enabled"])
def test_migration_and_topic_jobs_are_pre_install_pre_upgrade_hooks(
    rendered: dict[str, list[Obj]], case: str
) -> None:
    jobs = {o["metadata"]["name"].rsplit("-", 1)[-1]: o for o in rendered[case] if o["kind"] == "Job"}
    assert set(jobs) == {"migrate", "topics"}
    for job in jobs.values():
        assert job["metadata"]["annotations"]["helm.sh/hook"] == HOOK
        pod = job["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        # its ServiceAccount must exist before the hook runs, so it is a hook too (lower weight)
        (account,) = [
            o
            for o in rendered[case]
            if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == pod["serviceAccountName"]
        ]
        assert account["metadata"]["annotations"]["helm.sh/hook"] == HOOK
        assert int(account["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
            job["metadata"]["annotations"]["helm.sh/hook-weight"]
        )
    assert jobs["migrate"]["spec"]["template"]["spec"]["containers"][0]["command"] == ["signaling-migrate"]
    topics_cmd = jobs["topics"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert topics_cmd[:2] == ["dataplane-topics", "create"]
    partitions = values_of(*CASES[case])["kafka"]["topics"]
    for topic, spec in partitions.items():
        assert f"{topic}={spec['partitions']}" in topics_cmd


@pytest.mark.parametrize(
    ("switch", "left"),
    [
        ({"migrations": {"enabled": False}}, {"topics"}),
        ({"topics": {"create": {"enabled": False}}}, {"migrate"}),
    ],
)
def test_each_hook_job_can_be_switched_off(switch: dict[str, Any], left: set[str]) -> None:
    jobs = {o["metadata"]["name"].rsplit("-", 1)[-1] for o in render(**switch) if o["kind"] == "Job"}
    assert jobs == left


def test_migrate_job_grants_the_configured_pull_grant_role() -> None:
    """signaling-migrate grants the pull-grant view to DPS_PULL_GRANT_ROLE: the Job must carry the
    same role as the service, or a custom role would be left without its grant."""
    objs = render(dps={"pullGrantRole": "tenant_a_pull"})
    (job,) = [o for o in objs if o["kind"] == "Job" and o["metadata"]["name"].endswith("-migrate")]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DPS_PULL_GRANT_ROLE"] == {"name": "DPS_PULL_GRANT_ROLE", "value": "tenant_a_pull"}
    assert set(env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]) == {"name", "key"}
    signaling = of_kind(objs, "Deployment")["signaling"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "DPS_PULL_GRANT_ROLE", "value": "tenant_a_pull"} in signaling["env"]


def _containers(objs: list[Obj]) -> list[tuple[str, Obj]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", c)
        for o in objs
        if o["kind"] in {"Deployment", "Job"}
        for c in o["spec"]["template"]["spec"]["containers"]
    ]


@pytest.mark.parametrize("case", CASES)
def test_no_secret_value_inlined(rendered: dict[str, list[Obj]], case: str) -> None:
    objs = rendered[case]
    assert not [o for o in objs if o["kind"] == "Secret"]
    seen: set[str] = set()
    for where, container in _containers(objs):
        for env in container.get("env", []):
            name = env["name"]
            if name in SECRET_ENV or "SECRET" in name or name.endswith("_KEY"):
                seen.add(name)
                assert "value" not in env, f"{where}: {name} inlined"
                assert set(env["valueFrom"]["secretKeyRef"]) == {"name", "key"}, where
    assert {"KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL", "DATABASE_URL", "ROW_FILTERS_CACHE_KEY_SECRET"} <= seen
    if case == "everything-enabled":
        assert {"DPS_TOKEN_SIGNING_KEY", "DPS_TOKEN_PUBLIC_KEY", "DPS_FLOWS_DATABASE_URL"} <= seen


def test_secret_given_as_plain_env_refused() -> None:
    with pytest.raises(chart.ChartError, match="ROW_FILTERS_CACHE_KEY_SECRET is a secret; name its Secret"):
        render(services={"filter-resolver": {"env": {"ROW_FILTERS_CACHE_KEY_SECRET": "0123456789abcdef"}}})
    with pytest.raises(chart.ChartError, match="KAFKA_FETCH_MAX_WAIT_MS is set by the chart"):
        render(services={"signaling": {"env": {"KAFKA_FETCH_MAX_WAIT_MS": "10"}}})


def test_env_follows_architecture_configuration(rendered: dict[str, list[Obj]]) -> None:
    containers = {
        n: {e["name"] for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        for n, d in of_kind(rendered["everything-enabled"], "Deployment").items()
    }
    common = {"KAFKA_BOOTSTRAP_SERVERS", "KAFKA_FETCH_MAX_WAIT_MS", "KAFKA_ENABLE_IDEMPOTENCE", "HTTP_PORT"}
    common |= {"CELINE_OIDC_BASE_URL", "CELINE_OIDC_CLIENT_ID", "CELINE_OIDC_CLIENT_SECRET"}
    common |= {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"}
    assert containers["query-gateway"] >= common | {
        "REDIS_URL",
        "DATASETS_DATABASE_URL",
        "DPS_FLOWS_DATABASE_URL",
        "DPS_TOKEN_PUBLIC_KEY",
        "CATALOGUE_PATH",
        "ROW_FILTERS_CACHE_KEY_SECRET",
        "ROW_FILTERS_RESOLVE_TIMEOUT_MS",
        "AUDIT_PUBLISH_TIMEOUT_MS",
        "QUERY_STATEMENT_TIMEOUT_MS",
        "EDR_ENABLED",
        "CONNECTOR_INTERNAL_URL",
        "CONNECTOR_INTERNAL_URLS",
    }
    assert containers["signaling"] >= common | {
        "DATABASE_URL",
        "DPS_PULL_GRANT_ROLE",
        "DPS_TOKEN_SIGNING_KEY",
    }
    assert containers["filter-resolver"] >= common | {
        "REDIS_URL",
        "DATASETS_DATABASE_URL",
        "ROW_FILTERS_CACHE_KEY_SECRET",
        "ROW_FILTERS_MODULES",
        "REC_REGISTRY_URL",
    }
    assert containers["audit-relay"] >= common | {"CONNECTOR_INTERNAL_URL"}
    # least privilege: a service gets only the stores it uses
    assert "DATABASE_URL" not in containers["query-gateway"] | containers["audit-relay"]
    assert "REDIS_URL" not in containers["audit-relay"] | containers["signaling"]


def test_catalogue_from_configmap_and_a_change_rolls_the_gateway() -> None:
    def gateway_and_map(catalogue: str) -> tuple[Obj, Obj]:
        objs = render(catalogue=catalogue)
        (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
        return of_kind(objs, "Deployment")["query-gateway"], cm

    first, cm = gateway_and_map("datasets: []\n")
    second, _ = gateway_and_map("datasets:\n  - dataset_id: meters\n")
    assert cm["data"]["catalogue.yaml"] == "datasets: []\n"
    checksum = "checksum/catalogue"
    assert (
        first["spec"]["template"]["metadata"]["annotations"][checksum]
        != (second["spec"]["template"]["metadata"]["annotations"][checksum])
    )
    pod = first["spec"]["template"]["spec"]
    container = pod["containers"][0]
    path = next(e["value"] for e in container["env"] if e["name"] == "CATALOGUE_PATH")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "catalogue")
    assert path == f"{mount['mountPath']}/catalogue.yaml"
    volume = next(v for v in pod["volumes"] if v["name"] == "catalogue")
    assert volume["configMap"]["name"] == cm["metadata"]["name"]


def test_network_policies_default_deny_then_what_each_needs(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["everything-enabled"]
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "NetworkPolicy"}
    deny = policies["dataplane-default-deny"]["spec"]
    assert set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in of_kind(objs, "Deployment").values()]
    pod_labels += [o["spec"]["template"]["metadata"]["labels"] for o in objs if o["kind"] == "Job"]
    for labels in pod_labels:  # the deny covers every pod of the release, hook pods too
        assert deny["podSelector"]["matchLabels"].items() <= labels.items()
    per_service = of_kind(
        [p for p in objs if p["kind"] == "NetworkPolicy" and "default-deny" not in p["metadata"]["name"]],
        "NetworkPolicy",
    )
    values = values_of(*CASES["everything-enabled"])["networkPolicy"]
    for name in SERVICES:
        spec = per_service[name]["spec"]
        egress_ports = {p["port"] for rule in spec["egress"] for p in rule["ports"]}
        assert 53 in egress_ports
        assert 9092 in egress_ports  # every service reaches Kafka
        (ingress,) = spec["ingress"]
        expected = (
            values["ingressFrom"] + values["metricsFrom"]
            if name in ("query-gateway", "signaling")
            else values["metricsFrom"]
        )
        assert ingress["from"] == expected
    assert 6379 not in {p["port"] for r in per_service["audit-relay"]["spec"]["egress"] for p in r["ports"]}
    assert {"port": 8443, "protocol": "TCP"} in [
        p for r in per_service["filter-resolver"]["spec"]["egress"] for p in r["ports"]
    ]


def test_service_monitor_per_service_scrapes_metrics(rendered: dict[str, list[Obj]]) -> None:
    monitors = of_kind(rendered["everything-enabled"], "ServiceMonitor")
    services = of_kind(rendered["everything-enabled"], "Service")
    assert set(monitors) == set(SERVICES)
    for name, monitor in monitors.items():
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] == services[name]["spec"]["ports"][0]["name"]
    assert not of_kind(rendered["default"], "ServiceMonitor")


def test_schema_rejects_a_wrong_type_readably() -> None:
    message = refusal(VALUES / "wrong-type.yaml")
    assert "values.schema.json" in message
    assert "/services/filter-resolver/replicas" in message
    assert "got string, want integer" in message


def test_schema_rejects_an_unknown_key_readably() -> None:
    message = refusal(VALUES / "unknown-key.yaml")
    assert "/services/audit-relay" in message
    assert "'replicaCount' not allowed" in message


def test_schema_rejects_a_secret_value_in_a_secret_reference() -> None:
    message = refusal(VALUES / "inline-secret-ref.yaml")
    assert "/secrets/redisUrl" in message
    assert "'value' not allowed" in message
    assert "hunter2" not in message


@pytest.mark.parametrize("protocol", ["grpc", "http/json"])
def test_schema_accepts_only_the_otlp_protocol_the_services_export(protocol: str) -> None:
    """The services export with the OTLP/HTTP protobuf exporter only (and refuse to start on any
    other OTEL_EXPORTER_OTLP_PROTOCOL): the chart must not accept a value that cannot work."""
    with pytest.raises(chart.ChartError) as err:
        render(otel={"endpoint": "http://collector:4318", "protocol": protocol})
    assert "/otel/protocol" in str(err.value)


def test_otel_endpoint_sets_the_supported_protocol(rendered: dict[str, list[Obj]]) -> None:
    for dep in of_kind(rendered["everything-enabled"], "Deployment").values():
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    for dep in of_kind(rendered["default"], "Deployment").values():
        names = {e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert not names & {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"}


def test_schema_is_closed_at_every_object_level() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_objects: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object":
                extra = node.get("additionalProperties", True)
                # structs: false; maps (env, labels, selectors): a typed value schema, never "anything"
                if extra is True or ("properties" in node and extra is not False):
                    open_objects.append(path)
            for key, child in node.items():
                walk(child, f"{path}/{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{path}/{i}")

    walk(schema, "#")
    assert schema["additionalProperties"] is False
    assert open_objects == []


def _readiness_timeouts(objs: list[Obj]) -> dict[str, int]:
    return {
        name: dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["timeoutSeconds"]
        for name, dep in of_kind(objs, "Deployment").items()
    }


@pytest.mark.parametrize("case", CASES)
def test_issue35_the_readiness_probe_waits_longer_than_readyz_takes(
    rendered: dict[str, list[Obj]], case: str
) -> None:
    timeouts = _readiness_timeouts(rendered[case])
    assert set(timeouts) == set(SERVICES)
    for name, timeout in timeouts.items():
        assert timeout > READYZ_BOUND_S, (name, timeout)


def test_issue35_a_readiness_timeout_within_the_readyz_bound_is_refused() -> None:
    message = refusal(VALUES / "readiness-timeout-1.yaml")
    assert "values.schema.json" in message
    assert "/services/signaling/probes/readiness/timeoutSeconds" in message
