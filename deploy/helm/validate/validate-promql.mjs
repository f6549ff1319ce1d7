// Parses every PromQL expression the chart renders — the PrometheusRule's alert expressions and
// the Grafana dashboard's panel queries — with Prometheus's own grammar (@prometheus-io/lezer-promql),
// and prints the metric names they select, so a test can hold them to what the services export.
//
//   node validate-promql.mjs FILE.yaml ...
//
// Prints one JSON object {"expressions": N, "metrics": [...]} on stdout; a syntax error in any
// expression, or no expression at all, is reported on stderr and exits 1.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import { parser } from "@prometheus-io/lezer-promql";

function expressions(obj) {
  const found = [];
  if (obj?.kind === "PrometheusRule") {
    for (const group of obj.spec?.groups ?? []) {
      for (const rule of group.rules ?? []) found.push([`${group.name}/${rule.alert ?? rule.record}`, String(rule.expr)]);
    }
  }
  if (obj?.kind === "ConfigMap") {
    for (const [key, text] of Object.entries(obj.data ?? {})) {
      if (!key.endsWith(".json")) continue;
      for (const panel of JSON.parse(text).panels ?? []) {
        for (const target of panel.targets ?? []) {
          // Grafana variables are substituted before Prometheus sees the query
          const expr = String(target.expr).replaceAll(/\$\{?[A-Za-z_]+\}?/g, ".*");
          found.push([`${key}/${panel.title}/${target.refId}`, expr]);
        }
      }
    }
  }
  return found;
}

const metrics = new Set();
let count = 0;
let failures = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    for (const [where, expr] of expressions(doc.toJSON())) {
      count++;
      const tree = parser.parse(expr);
      let error = null;
      tree.iterate({
        enter: (node) => {
          if (node.type.isError && error === null) error = node.from;
          if (node.name === "Identifier" && node.node.parent?.name === "VectorSelector") {
            metrics.add(expr.slice(node.from, node.to));
          }
        },
      });
      if (error !== null) {
        console.error(`FAIL ${where}: PromQL syntax error at ${error}: ${expr}`);
        failures++;
      }
    }
  }
}
if (count === 0) {
  console.error("FAIL no PromQL expression found");
  failures++;
}
console.log(JSON.stringify({ expressions: count, metrics: [...metrics].sort() }));
process.exit(failures ? 1 : 0);
