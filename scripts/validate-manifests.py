#!/usr/bin/env python3
"""Validates the CRDs against the official Kubernetes schemas (kubernetes-validate),
every example TrainingRun and TrainingDataset against its CRD's openAPIV3Schema (jsonschema), failing on
unknown fields as `kubectl apply --validate=strict` does, and, with --operator BIN,
every object the operator builds for each example (`operator render`) against the
official schemas in strict mode."""
import glob
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

K8S_VERSION = "1.33"


def unknown_fields(obj, schema, path):
    """Fields the API server would prune (x-kubernetes-preserve-unknown-fields aside)."""
    out = []
    if isinstance(obj, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        for key, value in obj.items():
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue  # implicit in every custom resource
            if key in schema["properties"]:
                out += unknown_fields(value, schema["properties"][key], f"{path}.{key}")
            elif "additionalProperties" not in schema:
                out.append(f"{path}.{key}")
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


def validate_rendered(operator, examples, datasets):
    """ConfigMap, Service, PVC and Job of every example, as the operator builds them
    (with each TrainingDataset of the examples at its spec.output)."""
    failed = False
    flags = [f"--dataset={name}={output}" for name, output in sorted(datasets.items())]
    for path in examples:
        out = subprocess.run([operator, "render", path, *flags], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAIL operator render {path}: {out.stderr.strip()}")
            failed = True
            continue
        for obj in yaml.safe_load_all(out.stdout):
            what = f"{path} → {obj['kind']} {obj['metadata']['name']}"
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
                print(f"ok   {what}")
            except kubernetes_validate.ValidationError as e:
                print(f"FAIL {what}: {e.message} at {'.'.join(map(str, e.path))}")
                failed = True
    return failed


def check_crd(path):
    """The CRD at `path`, checked against Kubernetes' own schemas; and whether it failed."""
    with open(path) as f:
        crd = yaml.safe_load(f)
    try:
        kubernetes_validate.validate(crd, K8S_VERSION, strict=True)
        print(f"ok   {path} is a valid CustomResourceDefinition (Kubernetes {K8S_VERSION})")
        return crd, False
    except kubernetes_validate.ValidationError as e:
        print(f"FAIL {path}: {e.message} at {'.'.join(map(str, e.path))}")
        return crd, True


def check_objects(crd, paths):
    """Each manifest at `paths` against the CRD's schema, unknown fields refused; the
    objects that pass, and whether any failed."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft4Validator(schema)
    kind = crd["spec"]["names"]["kind"]
    api_version = f"{crd['spec']['group']}/v1alpha1"
    passed, failed = [], False
    for path in paths:
        with open(path) as f:
            obj = yaml.safe_load(f)
        errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]
        errors += [f"{p}: unknown field" for p in unknown_fields(obj, schema, "")]
        if obj.get("apiVersion") != api_version or obj.get("kind") != kind:
            errors.append(f"not a {api_version} {kind}")
        if errors:
            failed = True
            for e in errors:
                print(f"FAIL {path}: {e}")
        else:
            passed.append(obj)
            print(f"ok   {path}")
    return passed, failed


def main():
    run_crd, failed = check_crd("crds/trainingruns.yaml")
    dataset_crd, bad = check_crd("crds/trainingdatasets.yaml")
    failed |= bad
    examples = sorted(glob.glob("examples/*.yaml")) + sorted(glob.glob("deploy/argocd/runs/*.yaml"))
    if not examples:
        print("FAIL no examples found")
        failed = True
    _, bad = check_objects(run_crd, examples)
    failed |= bad
    found, bad = check_objects(dataset_crd, sorted(glob.glob("examples/datasets/**/*.yaml", recursive=True)))
    failed |= bad
    datasets = {d["metadata"]["name"]: d["spec"]["output"] for d in found}
    if len(datasets) < 4:
        print(f"FAIL the seed-002 mix's four datasets in examples/datasets: {sorted(datasets)}")
        failed = True
    if "--operator" in sys.argv:
        failed |= validate_rendered(sys.argv[sys.argv.index("--operator") + 1], examples, datasets)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
