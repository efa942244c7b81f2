#!/usr/bin/env python3
"""Lints and renders charts/trainingrun-operator with the Helm v4 Go SDK
(helm-python-sdk, no helm binary), validates every rendered object against the
official Kubernetes schemas (kubernetes-validate, strict), checks the operator's
restricted pod security and that the PrometheusRule carries files/alerts.yaml, and
compares the fully enabled render with tests/snapshot.yaml.

    python scripts/check-chart.py            # check
    python scripts/check-chart.py --update   # rewrite the snapshot after a deliberate change
"""
import argparse
import pathlib
import sys

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "charts/trainingrun-operator"
SNAPSHOT = CHART / "tests/snapshot.yaml"
K8S_VERSION = "1.33"
NAMESPACE = "trainingrun-system"
# Prometheus Operator kinds: not in the Kubernetes schemas; checked by hand below.
MONITORING = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

CONFIGS = {
    "defaults": {},
    "everything": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        "trainerMetrics": {"podMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        "grafanaDashboard": {"enabled": True},
        "networkPolicy": {"enabled": True, "metricsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    },
    "one-namespace": {"watchNamespace": "ml", "leaderElection": {"enabled": False}, "replicas": 1},
}

failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL {msg}", file=sys.stderr)


def render(values):
    chart = helm.Chart.load(str(CHART))
    try:
        out = chart.render(values, name="trainingrun-operator", namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    return {path: text for path, text in sorted(out.items())}


def objects(rendered):
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                yield path, doc


def check_lint(name, values):
    result = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version=f"v{K8S_VERSION}.0")
    for e in result.get("errors") or []:
        fail(f"lint ({name}): {e}")
    for m in result.get("messages") or []:
        # Severity 1 is INFO ("icon is recommended"); warnings and errors fail.
        if m.get("severity", 0) >= 2:
            fail(f"lint ({name}): {m['path']}: {m['error']}")


def check_objects(name, rendered):
    kinds = []
    for path, obj in objects(rendered):
        kinds.append(obj["kind"])
        if obj["kind"] in MONITORING:
            if obj.get("apiVersion") != "monitoring.coreos.com/v1" or not obj.get("spec"):
                fail(f"{name}: {path}: {obj['kind']} needs apiVersion monitoring.coreos.com/v1 and a spec")
            if obj["kind"] == "PodMonitor":
                check_pod_monitor(name, obj["spec"])
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            fail(f"{name}: {path}: {obj['kind']} {obj['metadata']['name']}: {e.message} at {list(e.path)}")
        if obj["kind"] == "Deployment":
            check_security(name, obj)
        if obj["kind"] == "PrometheusRule":
            shipped = yaml.safe_load((CHART / "files/alerts.yaml").read_text())["groups"]
            if obj["spec"]["groups"] != shipped:
                fail(f"{name}: the PrometheusRule's groups differ from files/alerts.yaml")
    return kinds


def check_pod_monitor(name, spec):
    # Field names of the Prometheus Operator's PodMonitor (monitoring.coreos.com/v1);
    # the label and port values are tested against the operator's constants in Rust.
    allowed = {"selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel", "podTargetLabels"}
    if set(spec) - allowed:
        fail(f"{name}: PodMonitor spec has unknown fields {sorted(set(spec) - allowed)}")
    ns = spec.get("namespaceSelector", {})
    if not (ns.get("any") is True or ns.get("matchNames")):
        fail(f"{name}: the PodMonitor must select the runs' namespaces")
    for ep in spec.get("podMetricsEndpoints", []):
        if set(ep) - {"port", "path", "interval", "relabelings"}:
            fail(f"{name}: PodMonitor endpoint has unknown fields {sorted(set(ep) - {'port', 'path', 'interval', 'relabelings'})}")
        for r in ep.get("relabelings", []):
            if set(r) - {"sourceLabels", "targetLabel", "action", "regex", "replacement"}:
                fail(f"{name}: PodMonitor relabeling has unknown fields {sorted(r)}")


def check_security(name, deploy):
    pod = deploy["spec"]["template"]["spec"]
    psc = pod.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True or psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        fail(f"{name}: the operator pod must run as non-root with the RuntimeDefault seccomp profile")
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        want = sc.get("allowPrivilegeEscalation") is False and sc.get("readOnlyRootFilesystem") is True
        if not want or sc.get("capabilities", {}).get("drop") != ["ALL"]:
            fail(f"{name}: container {c['name']} must drop ALL capabilities, forbid privilege escalation and mount a read-only root")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--update", action="store_true", help="rewrite tests/snapshot.yaml")
    args = ap.parse_args()
    expected_kinds = {
        "defaults": {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment"},
        "everything": {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment",
                       "ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "NetworkPolicy"},
        "one-namespace": {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment"},
    }
    rendered_everything = None
    for name, values in CONFIGS.items():
        check_lint(name, values)
        rendered = render(values)
        kinds = check_objects(name, rendered)
        if set(kinds) != expected_kinds[name]:
            fail(f"{name}: rendered kinds {sorted(set(kinds))}, expected {sorted(expected_kinds[name])}")
        print(f"{name}: {len(kinds)} objects valid ({', '.join(sorted(set(kinds)))})")
        if name == "everything":
            rendered_everything = rendered
        if name == "one-namespace":
            roles = [o for _, o in objects(rendered) if o["kind"] == "Role" and o["metadata"].get("namespace") == "ml"]
            if not roles:
                fail("one-namespace: watchNamespace must turn the TrainingRun permissions into a Role in that namespace")
    # With one watched namespace, the trainers are scraped there only.
    pm = [o for _, o in objects(render({"watchNamespace": "ml", "trainerMetrics": {"podMonitor": {"enabled": True}}}))
          if o["kind"] == "PodMonitor"]
    if len(pm) != 1 or pm[0]["spec"]["namespaceSelector"] != {"matchNames": ["ml"]}:
        fail("watchNamespace must limit the trainers' PodMonitor to that namespace")
    # prometheusRule.for replaces an alert's `for:` and nothing else.
    shorter = {"TrainingRunStalled": "5s", "TrainingRunNaNLoss": "1s"}
    rules = [o for _, o in objects(render({"prometheusRule": {"enabled": True, "for": shorter}})) if o["kind"] == "PrometheusRule"]
    expected = yaml.safe_load((CHART / "files/alerts.yaml").read_text())["groups"]
    for group in expected:
        for rule in group["rules"]:
            if rule.get("alert") in shorter:
                rule["for"] = shorter[rule["alert"]]
    if len(rules) != 1 or rules[0]["spec"]["groups"] != expected:
        fail("prometheusRule.for must set the named alerts' for: and change nothing else")
    if not helm.lint(str(CHART), {"prometheusRule": {"for": {"TrainingRunStalled": "soon"}}}, strict=True, namespace=NAMESPACE).get("errors"):
        fail("values.schema.json accepted prometheusRule.for TrainingRunStalled: soon")
    # values.schema.json is enforced.
    bad = helm.lint(str(CHART), {"replicas": 0, "logFormat": "xml"}, strict=True, namespace=NAMESPACE)
    if not bad.get("errors"):
        fail("values.schema.json accepted replicas: 0 and logFormat: xml")
    crd = yaml.safe_load((CHART / "crds/trainingruns.yaml").read_text())
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)

    text = "".join(f"# Source: {path}\n{body.strip()}\n---\n" for path, body in rendered_everything.items() if not path.endswith("NOTES.txt"))
    if args.update:
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text)
        print(f"wrote {SNAPSHOT.relative_to(ROOT)}")
    elif not SNAPSHOT.exists() or SNAPSHOT.read_text() != text:
        fail(f"{SNAPSHOT.relative_to(ROOT)} is stale: review the change, then run scripts/check-chart.py --update")
    if failures:
        print(f"{len(failures)} chart check(s) failed", file=sys.stderr)
        return 1
    print("chart: lint, render, schema validation and snapshot OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
