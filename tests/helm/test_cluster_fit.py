"""The chart fits real clusters (issue 14): scheduling, ingresses with TLS, ServiceAccount
annotations, extra env, volumes, init containers and native sidecars, per-service probes with a
startup probe, a preStop drain, image digests, every setting the services read, and the EDC
registration Job — each set in deploy/helm/ci/cluster-fit.yaml (which CI renders and validates),
and each refusal readable."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dataplane_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm"
FIT = CHART / "ci" / "cluster-fit.yaml"

chart = load_script("deploy/helm/render.py", "dataplane_chart_render_fit")

Obj = dict[str, Any]

# The values this work added; the CI file must set every one of them.
NEW_VALUES = [
    "global.affinity",
    "global.topologySpreadConstraints",
    "global.priorityClassName",
    "global.serviceAccount.annotations",
    "global.extraEnv",
    "global.extraVolumes",
    "global.extraVolumeMounts",
    "global.initContainers",
    "global.sidecars",
    "global.probes.startup",
    "global.preStopDrainSeconds",
    "services.query-gateway.image.digest",
    "services.query-gateway.affinity",
    "services.query-gateway.topologySpreadConstraints",
    "services.query-gateway.priorityClassName",
    "services.query-gateway.serviceAccount.annotations",
    "services.query-gateway.extraEnv",
    "services.query-gateway.extraVolumes",
    "services.query-gateway.extraVolumeMounts",
    "services.query-gateway.initContainers",
    "services.query-gateway.sidecars",
    "services.query-gateway.probes.startup",
    "services.query-gateway.preStopDrainSeconds",
    "secrets.columnMaskKey",
    "gateway.queryMaxSqlChars",
    "gateway.queryMaxBodyBytes",
    "gateway.datasetsPoolMaxSize",
    "gateway.dsDecisionCache.enabled",
    "gateway.dsDecisionCache.maxSize",
    "dps.tokenTtlSeconds",
    "dps.refreshUrl",
    *[
        f"ingress.{w}.{k}"
        for w in ("public", "signaling")
        for k in ("enabled", "className", "annotations", "host", "tls")
    ],
    *[
        f"edcRegistration.{k}"
        for k in (
            "enabled",
            "url",
            "spelling",
            "clientId",
            "clientSecret",
            "apiKey",
            "backoffLimit",
            "activeDeadlineSeconds",
        )
    ],
    "trust.caBundle.configMap",
    "trust.caBundle.key",
    "trust.proxy.https",
    "trust.proxy.noProxy",
    "grafanaDashboard.enabled",
    "grafanaDashboard.labels",
    "grafanaDashboard.annotations",
    *[
        f"prometheusRule.{k}"
        for k in ("enabled", "labels", "errorRatio", "latencyP99Seconds", "relayLagRecords")
    ],
]

# Settings a service reads that the chart does not pass as a value of its own: tuning whose
# default fits a cluster, or names a test or the local stack sets. Any of them can be given with
# `services.<svc>.env`; a setting missing from both lists fails test_every_setting_is_passed_or_tunable.
TUNABLE_BY_ENV = {
    "http_host",
    "http_keep_alive_timeout_seconds",
    "kafka_rpc_fetch_max_wait_ms",
    "kafka_bulk_fetch_max_wait_ms",
    "redis_connect_timeout_seconds",
    "redis_socket_timeout_seconds",
    "plan_reply_partition",
    "plan_reply_kafka_fallback_ms",
    "dps_callback_relay_enabled",
    "dps_callback_retry_first_seconds",
    "dps_callback_retry_max_seconds",
    "connector_timeout_seconds",
    "connector_keepalive_expiry_seconds",
    "database_acquire_timeout_ms",
    "database_command_timeout_ms",
    "dps_grant_timeout_ms",
    "db_pool_size",
    "signaling_max_body_bytes",
    "db_acquire_timeout_seconds",
    "db_command_timeout_seconds",
    "outbox_relay_enabled",
    "outbox_poll_interval_ms",
    "outbox_batch_size",
    "flow_metrics_interval_seconds",
    "dps_did_web_allow_http",
    "celine_oidc_jwks_min_refetch_seconds",
    "callback_timeout_seconds",
    "rec_registry_timeout_seconds",
    "rec_registry_lookup_scope",
    "resolver_retry_attempts",
    "resolver_retry_base_ms",
    "plan_requests_topic",
    "resolver_group_id",
    "resolver_max_batch",
    "resolver_idle_fetch_max_wait_ms",
    "resolver_idle_after_ms",
    "audit_relay_group_id",
    "audit_relay_topic",
    "audit_relay_dlq_topic",
    "audit_relay_unready_grace_s",
    "audit_relay_backoff_initial_s",
    "audit_relay_backoff_max_s",
    "audit_relay_retry_after_max_s",
    "audit_relay_http_timeout_s",
    "audit_relay_session_timeout_ms",
    "audit_relay_monitor_interval_s",
    "audit_relay_max_in_flight_per_partition",
    "audit_relay_max_in_flight_per_connector",
    "audit_relay_max_buffered_per_partition",
    "audit_relay_broker_hole_confirm_s",
}
SETTINGS = {
    "query-gateway": ("query_gateway.settings", "Settings"),
    "signaling": ("signaling.settings", "Settings"),
    "filter-resolver": ("filter_resolver.settings", "Settings"),
    "audit-relay": ("audit_relay.settings", "Settings"),
}


def render(*files: Path, **extra: Any) -> list[Obj]:
    values: dict[str, Any] = chart.load_values(*files)
    chart._deep_merge(values, extra)
    objs: list[Obj] = chart.render_objects(values)
    return objs


def deployments(objs: list[Obj]) -> dict[str, Obj]:
    return {
        o["metadata"]["labels"]["app.kubernetes.io/name"]: o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] == "Deployment"
    }


@pytest.fixture(scope="module")
def fit() -> list[Obj]:
    return render(FIT)


def test_the_ci_file_sets_every_new_value() -> None:
    values = yaml.safe_load(FIT.read_text())
    missing = []
    for path in NEW_VALUES:
        node: Any = values
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(path)
                break
            node = node[part]
    assert missing == []


def test_the_gateway_spreads_over_nodes_by_default() -> None:
    pods = deployments(render())
    (spread,) = pods["query-gateway"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == "query-gateway"
    assert "topologySpreadConstraints" not in pods["signaling"]


def test_scheduling_values_reach_each_pod(fit: list[Obj]) -> None:
    pods = deployments(fit)
    gateway, relay = pods["query-gateway"], pods["audit-relay"]
    assert gateway["priorityClassName"] == "dataplane-critical"
    assert relay["priorityClassName"] == "dataplane-normal"
    assert "podAntiAffinity" in gateway["affinity"] and "nodeAffinity" in relay["affinity"]
    assert [c["topologyKey"] for c in gateway["topologySpreadConstraints"]] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    for name, pod in pods.items():
        for constraint in pod["topologySpreadConstraints"]:
            assert constraint["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == name


def test_probes_startup_first_then_liveness_and_readiness_per_service(fit: list[Obj]) -> None:
    pods = deployments(fit)
    gateway = pods["query-gateway"]["containers"][0]
    assert gateway["startupProbe"]["httpGet"]["path"] == "/healthz"
    # the service's own key wins, the others come from global
    assert gateway["startupProbe"]["failureThreshold"] == 60
    assert gateway["startupProbe"]["periodSeconds"] == 3
    assert gateway["readinessProbe"]["periodSeconds"] == 3
    assert gateway["readinessProbe"]["failureThreshold"] == 2
    assert pods["signaling"]["containers"][0]["startupProbe"]["failureThreshold"] == 40


def test_prestop_drain_within_the_grace_period(fit: list[Obj]) -> None:
    pods = deployments(fit)
    gateway = pods["query-gateway"]
    assert gateway["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": 15}}
    assert gateway["terminationGracePeriodSeconds"] == 40
    assert "lifecycle" not in pods["signaling"]["containers"][0]  # 0: no drain
    assert pods["audit-relay"]["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] == 10
    with pytest.raises(chart.ChartError, match="preStopDrainSeconds 30 must be below"):
        render(**{"global": {"preStopDrainSeconds": 30, "terminationGracePeriodSeconds": 30}})


def test_image_digest_pins_the_reference(fit: list[Obj]) -> None:
    pods = deployments(fit)
    assert pods["query-gateway"]["containers"][0]["image"] == (
        "registry.example.org/dataplane/dataplane/query-gateway:1.2.3@sha256:" + "0123456789abcdef" * 4
    )
    assert "@" not in pods["signaling"]["containers"][0]["image"]
    with pytest.raises(chart.ChartError, match="/services/signaling/image/digest"):
        render(services={"signaling": {"image": {"digest": "latest"}}})


def test_extra_env_volumes_init_containers_and_native_sidecars(fit: list[Obj]) -> None:
    gateway = deployments(fit)["query-gateway"]
    container = gateway["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["DATABASE_COMMAND_TIMEOUT_MS"]["value"] == "7000"
    # issue 15's limits (GS-14, QE-06) as the values set them
    limits = {
        k: env[k]["value"] for k in ("QUERY_MAX_PLAN_COST", "RATE_LIMIT_PER_SECOND", "RATE_LIMIT_BURST")
    }
    assert limits == {
        "QUERY_MAX_PLAN_COST": "50000000",
        "RATE_LIMIT_PER_SECOND": "20",
        "RATE_LIMIT_BURST": "40",
    }
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["site-config"] == "/etc/site" and mounts["proxy-config"] == "/etc/db-proxy"
    assert {"site-config", "proxy-config"} <= {v["name"] for v in gateway["volumes"]}
    init = {c["name"]: c for c in gateway["initContainers"]}
    assert "restartPolicy" not in init["wait-for-dns"]
    assert init["db-proxy"]["restartPolicy"] == "Always"  # a native sidecar: up before, down after
    assert [c["name"] for c in gateway["initContainers"]] == ["wait-for-dns", "db-proxy"]


@pytest.mark.parametrize(
    ("extra_env", "expected"),
    [
        ([{"name": "QUERY_STATEMENT_TIMEOUT_MS", "value": "1"}], "QUERY_STATEMENT_TIMEOUT_MS is already set"),
        ([{"name": "COLUMN_MASK_KEY", "value": "0123456789abcdef"}], "COLUMN_MASK_KEY is a secret"),
        ([{"name": "X", "value": "1"}, {"name": "X", "value": "2"}], "X is already set"),
    ],
)
def test_extra_env_refuses_duplicates_and_literal_secrets(extra_env: list[Obj], expected: str) -> None:
    with pytest.raises(chart.ChartError, match=expected):
        render(services={"query-gateway": {"extraEnv": extra_env}})


def test_kubernetes_objects_in_values_are_checked_strictly() -> None:
    """The embedded Kubernetes schemas refuse a misspelt field inside an affinity or a sidecar."""
    with pytest.raises(chart.ChartError, match="nodeAfinity"):
        render(services={"signaling": {"affinity": {"nodeAfinity": {}}}})
    with pytest.raises(chart.ChartError, match="/services/signaling/sidecars/0"):
        render(services={"signaling": {"sidecars": [{"name": "x", "imagee": "y"}]}})


def test_service_account_annotations_merge(fit: list[Obj]) -> None:
    accounts = {
        o["metadata"]["name"]: o["metadata"].get("annotations", {})
        for o in fit
        if o["kind"] == "ServiceAccount"
    }
    assert accounts["dataplane-query-gateway"] == {
        "example.org/team": "dataspace",
        "iam.gke.io/gcp-service-account": "gateway@example.iam.gserviceaccount.com",
    }
    assert accounts["dataplane-signaling"] == {"example.org/team": "dataspace"}


def test_ingresses_with_tls_route_the_public_and_signalling_paths(fit: list[Obj]) -> None:
    ingresses = {o["metadata"]["name"]: o["spec"] for o in fit if o["kind"] == "Ingress"}
    routes = {}
    for name, spec in ingresses.items():
        (rule,) = spec["rules"]
        (tls,) = spec["tls"]
        assert tls["hosts"] == [rule["host"]] and tls["secretName"]
        assert spec["ingressClassName"] == "nginx"
        for p in rule["http"]["paths"]:
            routes[(name, rule["host"], p["path"])] = (p["pathType"], p["backend"]["service"]["name"])
    assert routes == {
        ("dataplane-public", "data.example.org", "/dps/public"): ("Prefix", "dataplane-query-gateway"),
        ("dataplane-public", "data.example.org", "/dps/token"): ("Exact", "dataplane-signaling"),
        ("dataplane-signaling", "signaling.example.org", "/dps/v1"): ("Prefix", "dataplane-signaling"),
        ("dataplane-signaling", "signaling.example.org", "/dps/registration"): (
            "Exact",
            "dataplane-signaling",
        ),
    }


def test_issue33_the_query_ingress_routes_query_and_plan_to_the_gateway_without_dps() -> None:
    """The normal and EDR paths behind an Ingress of their own, with TLS, whether DPS is on or not."""
    query = {
        "enabled": True,
        "host": "query.example.org",
        "tls": {"secretName": "q-tls"},
        "className": "nginx",
    }
    for dps in (False, True):
        objs = render(dps={"enabled": dps}, ingress={"query": query})
        (ing,) = [o for o in objs if o["kind"] == "Ingress"]
        assert ing["metadata"]["name"] == "dataplane-query"
        (rule,) = ing["spec"]["rules"]
        assert ing["spec"]["tls"] == [{"hosts": ["query.example.org"], "secretName": "q-tls"}]
        (path,) = rule["http"]["paths"]
        assert (path["path"], path["pathType"]) == ("/query", "Prefix")  # /query and /query/plan
        service = next(
            o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "dataplane-query-gateway"
        )
        backend = path["backend"]["service"]
        assert backend["name"] == service["metadata"]["name"]
        assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    with pytest.raises(chart.ChartError, match="/ingress/query"):  # TLS is not optional
        render(ingress={"query": {"enabled": True, "host": "q.example.org"}})


def test_issue33_the_chart_admits_no_kubernetes_below_1_30() -> None:
    """The preStop `sleep` action is off by default on 1.29, where the API server would refuse
    the pods: helm checks Chart.yaml's kubeVersion against the cluster before installing."""
    meta = yaml.safe_load((Path(chart.CHART_DIR) / "Chart.yaml").read_text())
    match = re.fullmatch(r">=(\d+)\.(\d+)\.(\d+)-0", meta["kubeVersion"].strip())
    assert match is not None, meta["kubeVersion"]
    floor = tuple(int(g) for g in match.groups())
    assert (1, 29, 99) < floor <= (1, 30, 0)


def test_ingress_refusals() -> None:
    with pytest.raises(chart.ChartError, match=r"ingress\.public\.enabled needs dps\.enabled"):
        render(ingress={"public": {"enabled": True, "host": "a.example.org", "tls": {"secretName": "t"}}})
    with pytest.raises(chart.ChartError, match="/ingress/signaling"):  # TLS is not optional
        render(dps={"enabled": True}, ingress={"signaling": {"enabled": True, "host": "a.example.org"}})


def test_settings_other_work_added_are_passed(fit: list[Obj]) -> None:
    pods = deployments(fit)
    gateway = {e["name"]: e for e in pods["query-gateway"]["containers"][0]["env"]}
    assert gateway["COLUMN_MASK_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "dataplane-column-mask",
        "key": "key",
    }
    assert gateway["QUERY_MAX_SQL_CHARS"]["value"] == "4096"
    assert gateway["DS_DECISION_CACHE_MAXSIZE"]["value"] == "20000"
    signaling = {e["name"]: e for e in pods["signaling"]["containers"][0]["env"]}
    assert signaling["DPS_TOKEN_TTL_SECONDS"]["value"] == "600"
    assert signaling["DPS_REFRESH_URL"]["value"] == "https://data.example.org"
    default_gateway = {e["name"] for e in deployments(render())["query-gateway"]["containers"][0]["env"]}
    assert "COLUMN_MASK_KEY" not in default_gateway
    # the records API (a cursor key, the catalogue in signaling), plugin handler names on both
    # sides, asynchronous signals
    assert gateway["RECORDS_CURSOR_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "dataplane-records",
        "key": "cursor-secret",
    }
    resolver = {e["name"]: e for e in pods["filter-resolver"]["containers"][0]["env"]}
    for env in (gateway, resolver):
        assert env["ROW_FILTERS_PLUGIN_HANDLERS"]["value"] == "tariff_members"
    assert signaling["DPS_ASYNC_SIGNALS"]["value"] == "true"
    assert signaling["CATALOGUE_PATH"]["value"] == "/etc/dataplane/catalogue.yaml"
    mounts = {m["name"]: m["mountPath"] for m in pods["signaling"]["containers"][0]["volumeMounts"]}
    assert mounts["catalogue"] == "/etc/dataplane"


def test_every_setting_is_passed_or_tunable(fit: list[Obj]) -> None:
    """Each variable a service reads is set by the chart from a value (or a secret), or is in the
    documented list of tunables left to `env`: a new setting cannot be forgotten silently."""
    fields = {
        svc: sorted(getattr(importlib.import_module(module), cls).model_fields)
        for svc, (module, cls) in SETTINGS.items()
    }
    # a value that is empty by default (a URL, a module list) is passed only when set: look at both
    # CI files that set them
    both = [deployments(fit), deployments(render(CHART / "ci" / "everything-enabled.yaml"))]
    forgotten = {}
    for svc, names in fields.items():
        passed = {e["name"].lower() for pods in both for e in pods[svc]["containers"][0]["env"]}
        left = [n for n in names if n not in passed and n not in TUNABLE_BY_ENV]
        if left:
            forgotten[svc] = left
    assert forgotten == {}


def registration_job(objs: list[Obj]) -> Obj:
    (job,) = [
        o for o in objs if o["kind"] == "Job" and o["metadata"]["name"].startswith("dataplane-registration")
    ]
    return job


def test_registration_job_runs_signaling_register_after_install(fit: list[Obj]) -> None:
    job = registration_job(fit)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["signaling", "register"]
    env = {e["name"]: e for e in container["env"]}
    assert (
        env["EDC_REGISTRATION_URL"]["value"]
        == "https://control-plane.example.org/api/management/v4/dataplanes"
    )
    assert env["DPS_REGISTRATION_CLIENT_ID"]["value"] == "edc-control-plane"
    assert env["DPS_CONTROL_PLANE_CLIENTS"]["value"] == "edc-control-plane"
    assert env["DPS_SIGNALING_URL"]["value"] == "https://signaling.example.org"
    for secret in ("DPS_REGISTRATION_CLIENT_SECRET", "EDC_REGISTRATION_API_KEY", "CELINE_OIDC_CLIENT_SECRET"):
        assert set(env[secret]["valueFrom"]["secretKeyRef"]) == {"name", "key"}
    (account,) = [
        o for o in fit if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == pod["serviceAccountName"]
    ]
    assert "helm.sh/hook" not in account["metadata"].get("annotations", {})
    policies = {o["metadata"]["name"] for o in fit if o["kind"] == "NetworkPolicy"}
    assert "dataplane-registration" in policies
    # the variables the Job sets are the ones `signaling register` reads (the proxy variables are
    # httpx's, read through trust_env)
    from signaling.register import RegisterSettings

    readable = {n.upper() for n in RegisterSettings.model_fields}
    assert set(env) - {"LOG_LEVEL", "HTTPS_PROXY", "NO_PROXY"} <= readable


def test_registration_refusals() -> None:
    with pytest.raises(chart.ChartError, match=r"edcRegistration\.enabled needs dps\.enabled"):
        render(
            edcRegistration={
                "enabled": True,
                "url": "https://cp.example.org/dataplanes",
                "clientId": "cp",
                "clientSecret": {"name": "s", "key": "k"},
            }
        )
    with pytest.raises(chart.ChartError, match="/edcRegistration"):
        render(dps={"enabled": True}, edcRegistration={"enabled": True, "url": "http://cp.example.org/"})


def test_schema_definitions_match_the_kubernetes_schemas() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "chart_schema.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr


def test_the_ca_bundle_is_mounted_and_read_by_every_service_and_the_registration_job(fit: list[Obj]) -> None:
    """The corporate CA of `trust.caBundle` reaches DATAPLANE_CA_BUNDLE in every container that
    calls out, as a file of the mounted ConfigMap; `trust.proxy` sets the proxy variables there."""
    job = registration_job(fit)
    pods = {**deployments(fit), "registration": job["spec"]["template"]["spec"]}
    assert set(pods) == {"query-gateway", "signaling", "filter-resolver", "audit-relay", "registration"}
    for name, pod in pods.items():
        (container,) = [c for c in pod["containers"] if c["name"] in (name, "register")]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["DATAPLANE_CA_BUNDLE"] == "/etc/ssl/dataplane/ca-bundle.pem", name
        assert env["HTTPS_PROXY"] == "http://proxy.example.org:3128", name
        assert env["NO_PROXY"] == ".svc.cluster.local,.cluster.local,10.0.0.0/8", name
        assert "HTTP_PROXY" not in env, name  # not set in the values: not passed
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["ca-bundle"] == {
            "name": "ca-bundle",
            "mountPath": "/etc/ssl/dataplane",
            "readOnly": True,
        }
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["ca-bundle"]["configMap"] == {
            "name": "corporate-ca",
            "items": [{"key": "ca.crt", "path": "ca-bundle.pem"}],
        }, name


def test_a_ca_bundle_from_a_secret_and_none_by_default() -> None:
    from_secret = deployments(render(trust={"caBundle": {"secret": "corporate-ca", "key": "bundle.pem"}}))
    for name, pod in from_secret.items():
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["DATAPLANE_CA_BUNDLE"] == "/etc/ssl/dataplane/ca-bundle.pem", name
        (volume,) = [v for v in pod["volumes"] if v["name"] == "ca-bundle"]
        assert volume["secret"] == {
            "secretName": "corporate-ca",
            "items": [{"key": "bundle.pem", "path": "ca-bundle.pem"}],
        }
    for name, pod in deployments(render()).items():
        env = {e["name"] for e in pod["containers"][0]["env"]}
        assert not env & {"DATAPLANE_CA_BUNDLE", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"}, name
        assert "ca-bundle" not in {v["name"] for v in pod["volumes"]}, name
    with pytest.raises(chart.ChartError, match="configMap or secret, not both"):
        render(trust={"caBundle": {"secret": "a", "configMap": "b"}})


def test_a_proxy_variable_set_by_trust_cannot_be_set_again_in_extra_env() -> None:
    with pytest.raises(chart.ChartError, match="HTTPS_PROXY is already set"):
        render(
            trust={"proxy": {"https": "http://proxy.example.org:3128"}},
            **{"global": {"extraEnv": [{"name": "HTTPS_PROXY", "value": "http://other:3128"}]}},
        )


def test_an_unreachable_control_plane_cannot_fail_the_release(fit: list[Obj]) -> None:
    """The registration is no Helm hook (a failed hook fails the release): an ordinary Job that
    Kubernetes retries, named per revision so an upgrade registers again with a new Job (a Job's
    template is immutable), removing itself a day after it finished."""
    job = registration_job(fit)
    assert "helm.sh/hook" not in job["metadata"].get("annotations", {})
    assert job["metadata"]["name"] == "dataplane-registration-1"  # revision 1: the install
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (12, 3600)
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    hooks = [o for o in fit if "helm.sh/hook" in o["metadata"].get("annotations", {})]
    assert all("registration" not in o["metadata"]["name"] for o in hooks)
    tuned = registration_job(render(FIT, edcRegistration={"backoffLimit": 3, "activeDeadlineSeconds": 600}))
    assert (tuned["spec"]["backoffLimit"], tuned["spec"]["activeDeadlineSeconds"]) == (3, 600)
