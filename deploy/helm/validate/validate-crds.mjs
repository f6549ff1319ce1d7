// Validates the chart's custom resources with the published kubernetes-models packages
// (@kubernetes-models/keda, @kubernetes-models/prometheus-operator: ScaledObject, ServiceMonitor,
// PrometheusRule): never hand-written schemas.
//
//   node validate-crds.mjs [--require ScaledObject,ServiceMonitor,PrometheusRule] FILE.yaml ...
//
// Every document must be a kind this script knows; an unknown custom kind is an error rather than
// a silent pass. --require fails the run when a kind was not seen in any file, so a values change
// that stops rendering (say) the ScaledObject cannot make this check vacuous.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";

const MODELS = new Map([
  ["keda.sh/v1alpha1/ScaledObject", ScaledObject],
  ["monitoring.coreos.com/v1/ServiceMonitor", ServiceMonitor],
  ["monitoring.coreos.com/v1/PrometheusRule", PrometheusRule],
]);

const args = process.argv.slice(2);
let required = [];
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--require") required = args[++i].split(",").filter(Boolean);
  else files.push(args[i]);
}

const seen = new Map();
let failures = 0;
for (const file of files) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length) {
      console.error(`FAIL ${file}: YAML error: ${doc.errors[0].message}`);
      failures++;
      continue;
    }
    const obj = doc.toJSON();
    if (!obj) continue;
    const id = `${obj.kind}/${obj.metadata?.name ?? "?"}`;
    const Model = MODELS.get(`${obj.apiVersion}/${obj.kind}`);
    if (!Model) {
      console.error(`FAIL ${file}: ${id}: no published model for ${obj.apiVersion} ${obj.kind}`);
      failures++;
      continue;
    }
    try {
      new Model(obj).validate();
      seen.set(obj.kind, (seen.get(obj.kind) ?? 0) + 1);
      console.log(`ok   ${file}: ${id}`);
    } catch (err) {
      console.error(`FAIL ${file}: ${id}: ${err.message}`);
      failures++;
    }
  }
}
for (const kind of required) {
  if (!seen.has(kind)) {
    console.error(`FAIL no ${kind} was rendered in any file, so none was validated`);
    failures++;
  }
}
console.log(`validated ${[...seen].map(([k, n]) => `${n} ${k}`).join(", ") || "nothing"}; ${failures} failure(s)`);
process.exit(failures ? 1 : 0);
