#!/usr/bin/env bash
# Python tools the tests use, in the project venv: kubernetes-validate (official
# Kubernetes schemas, offline), jsonschema, PyYAML and helm-python-sdk (Helm v4's Go
# SDK, to lint and render the chart without a helm binary).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
[ -x "$PT_VENV_CPU/bin/python" ] || python3 -m venv "$PT_VENV_CPU"
if ! "$PT_VENV_CPU/bin/python" -c "import kubernetes_validate, jsonschema, yaml, helm_python" 2>/dev/null; then
  "$PT_VENV_CPU/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate==1.37.0 jsonschema pyyaml helm-python-sdk==0.2.2
fi
