#!/usr/bin/env bash
# The real-cluster check: a kind cluster, CPU images of the operator and the trainer
# built from this checkout, the Helm chart, and three scenarios with kubectl:
#   1. examples/tiny-cluster.yaml trains to Succeeded with a true status;
#   2. a trainer process killed mid-run: the operator gang-restarts it (attempt 2,
#      restarts 1) and it resumes from its last checkpoint to Succeeded;
#   3. a NaN injected at step 5: Failed with reason NaNLoss, no second attempt.
# Needs docker, kind, kubectl and helm. It is not run in this repository's CI (no
# Docker engine there); run it where those exist:
#   e2e/kind/run.sh            # KEEP=1 keeps the cluster afterwards
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CLUSTER="${CLUSTER:-puretransformer-e2e}"
NS=trainingrun-e2e
OPERATOR_IMAGE=puretransformer/operator:e2e
TRAINER_IMAGE=puretransformer/trainer:e2e-cpu
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e/kind/run.sh needs $tool" >&2; exit 2; }
done
step() { echo; echo "== $*"; }
fail() { echo "FAIL: $*" >&2; kubectl -n "$NS" get trainingruns,jobs,pods -o wide >&2 || true; exit 1; }
jp() { kubectl -n "$NS" get trainingrun "$1" -o "jsonpath=$2"; }
wait_for() { # run, jsonpath, expected, timeout seconds
  local deadline=$(( $(date +%s) + $4 ))
  until [ "$(jp "$1" "$2" 2>/dev/null)" = "$3" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "$1: $2 is '$(jp "$1" "$2" 2>/dev/null)', expected '$3'"
    sleep 5
  done
}
cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

step "kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --config e2e/kind/cluster.yaml --wait 120s

step "images (CPU trainer)"
docker build -f operator/Dockerfile -t "$OPERATOR_IMAGE" .
docker build -f trainer/Dockerfile --build-arg VARIANT=cpu -t "$TRAINER_IMAGE" .
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$TRAINER_IMAGE"

step "helm install"
helm upgrade --install trainingrun-operator charts/trainingrun-operator \
  --namespace trainingrun-system --create-namespace --wait --timeout 5m \
  --set image.repository="${OPERATOR_IMAGE%:*}" --set image.tag="${OPERATOR_IMAGE##*:}" --set image.pullPolicy=Never \
  --set trainerImage.repository="${TRAINER_IMAGE%:*}" --set trainerImage.tag="${TRAINER_IMAGE##*:}" \
  --set replicas=1
kubectl get crd trainingruns.training.puretransformer.dev >/dev/null
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -

# A variant of tiny-cluster: name, token budget and extra spec lines.
variant() { # name tokens [extra yaml under spec]
  sed -e "s/^  name: tiny-cluster$/  name: $1/" -e "s/^  tokens: 1M$/  tokens: $2/" examples/tiny-cluster.yaml
  if [ -n "${3:-}" ]; then printf '%s\n' "$3"; fi
}

step "1. tiny-cluster trains to Succeeded"
kubectl -n "$NS" apply -f examples/tiny-cluster.yaml
kubectl -n "$NS" wait --for=condition=Running trainingrun/tiny-cluster --timeout=10m || fail "tiny-cluster never ran"
kubectl -n "$NS" get trainingruns
kubectl -n "$NS" wait --for=condition=Succeeded trainingrun/tiny-cluster --timeout=30m || fail "tiny-cluster did not succeed"
[ -n "$(jp tiny-cluster '{.status.lastCheckpoint.uri}')" ] || fail "no lastCheckpoint in status"
[ -n "$(jp tiny-cluster '{.status.metrics.loss}')" ] || fail "no loss in status"
[ "$(jp tiny-cluster '{.status.restarts}')" = 0 ] || fail "tiny-cluster restarted"
kubectl -n "$NS" get trainingrun tiny-cluster -o wide

step "2. a killed trainer: gang restart from the last checkpoint"
variant kill-a-pod 2M | kubectl -n "$NS" apply -f -
kubectl -n "$NS" wait --for=condition=Running trainingrun/kill-a-pod --timeout=10m || fail "kill-a-pod never ran"
deadline=$(( $(date +%s) + 900 ))
until [ -n "$(jp kill-a-pod '{.status.lastCheckpoint.step}')" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "kill-a-pod wrote no checkpoint"
  sleep 5
done
pod="$(kubectl -n "$NS" get pods -l training.puretransformer.dev/run=kill-a-pod -o jsonpath='{.items[0].metadata.name}')"
echo "killing the trainer processes of $pod"
# SIGKILL the worker (a child of `trainer launch`, PID 1): the launcher exits 137.
kubectl -n "$NS" exec "$pod" -- sh -c 'for p in /proc/[0-9]*; do if tr "\0" " " < "$p/cmdline" 2>/dev/null | grep -q "trainer worker"; then kill -9 "${p#/proc/}"; fi; done'
wait_for kill-a-pod '{.status.attempt}' 2 600
wait_for kill-a-pod '{.status.restarts}' 1 60
kubectl -n "$NS" wait --for=condition=Succeeded trainingrun/kill-a-pod --timeout=30m || fail "kill-a-pod did not succeed after the restart"
kubectl -n "$NS" get events --field-selector involvedObject.name=kill-a-pod

step "3. NaN loss: Failed/NaNLoss, no new attempt"
variant nan-loss 1M "$(printf '  env:\n    - name: TRAINER_INJECT_NAN_AT_STEP\n      value: "5"')" | kubectl -n "$NS" apply -f -
kubectl -n "$NS" wait --for=condition=Failed trainingrun/nan-loss --timeout=15m || fail "nan-loss did not fail"
[ "$(jp nan-loss '{.status.reason}')" = NaNLoss ] || fail "nan-loss failed with $(jp nan-loss '{.status.reason}')"
sleep 30
[ "$(jp nan-loss '{.status.attempt}')" = 1 ] || fail "a NaN must not be retried"

step "all scenarios passed"
kubectl -n "$NS" get trainingruns -o wide
