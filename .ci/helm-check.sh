#!/usr/bin/env bash
# The chart's CI check: render deploy/helm with its default values and with every file under
# deploy/helm/ci/, lint it, validate every rendered Kubernetes manifest strictly against the 1.33
# schemas (kubernetes-validate), validate the custom resources (KEDA ScaledObject, ServiceMonitor,
# PrometheusRule) with the published npm models (deploy/helm/validate/), and parse every PromQL
# expression the chart renders. Exit non-zero on any finding. No helm binary and no cluster are
# needed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export UV_PYTHON_DOWNLOADS=never
chart=deploy/helm
validate_dir="$chart/validate"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
started=$SECONDS

# 1. Render + schema + lint, one case per values file; custom resources split off.
cases=(default)
for f in "$chart"/ci/*.yaml; do cases+=("$f"); done
core_files=()
crd_files=()
for case in "${cases[@]}"; do
  name="$(basename "$case" .yaml)"
  args=("$work/$name.yaml" --crds "$work/$name.crds.yaml")
  [ "$case" = default ] || args+=(-f "$case")
  echo "== render $name"
  uv run python "$chart/render.py" "${args[@]}"
  core_files+=("$work/$name.yaml")
  crd_files+=("$work/$name.crds.yaml")
done

# 2. Kubernetes 1.33 schemas, strict (unknown fields are errors). CRD kinds were split off above,
# so any remaining "couldn't find schema" warning is a wrong apiVersion/kind: fail on it too.
echo "== kubernetes-validate --strict -k 1.33.0"
if ! report="$(uv run kubernetes-validate --strict -k 1.33.0 --quiet "${core_files[@]}" 2>&1)"; then
  echo "$report"
  exit 1
fi
if [ -n "$report" ]; then
  echo "$report"
  echo "kubernetes-validate reported warnings (unknown kind or apiVersion?)" >&2
  exit 1
fi
echo "all manifests valid"

# 3. The custom resources, with the published models of the npm packages.
echo "== npm models (@kubernetes-models/keda, @kubernetes-models/prometheus-operator)"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  # never a silent pass: without node the ScaledObject and ServiceMonitor go unvalidated
  echo "helm-check: node and npm are required to validate the custom resources" >&2
  exit 1
fi
if [ ! -d "$validate_dir/node_modules" ]; then
  (cd "$validate_dir" && npm ci --no-audit --no-fund --loglevel=error)
fi
node "$validate_dir/validate-crds.mjs" --require ScaledObject,ServiceMonitor,PrometheusRule "${crd_files[@]}"

# 4. Every PromQL expression (alerts, dashboard panels) parses with Prometheus's grammar; the
# metric names it prints are checked against the services' exports by tests/helm/test_monitoring.py.
echo "== PromQL (@prometheus-io/lezer-promql)"
node "$validate_dir/validate-promql.mjs" "${core_files[@]}" "${crd_files[@]}"

echo "helm-check passed in $((SECONDS - started)) s"
