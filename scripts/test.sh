#!/usr/bin/env bash
# Runs every test on a fresh machine: installs PyTorch 2.11.0 (CPU libtorch for the
# build, the full wheel plus transformers for the proofs against PyTorch) and the
# Python validators into ~/.cache/puretransformer (and promtool from Debian), then runs the Rust tests, checks the golden files against PyTorch,
# validates the CRD and the examples, compiles the jiterator kernels with NVRTC, tests
# the GPU benchmark job on CPU, and checks the Helm chart and the alert rules. The
# real-control-plane suite (e2e/tests/real_cluster) runs against kube-apiserver, etcd,
# the controller manager and the scheduler built from source by
# scripts/setup-control-plane.sh (as root: its pods get network namespaces), real nodes
# (the kubelet, containerd, runc, kube-proxy, CoreDNS: scripts/setup-node.sh) running
# our images (scripts/setup-images.sh: the trainer's, the static operator's), with
# Prometheus (scripts/setup-prometheus.sh) for the alert drills, Kueue
# (scripts/setup-kueue.sh) for the queueing scenarios, and Argo CD's Lua health
# evaluation (scripts/setup-argocd-health.sh), which also judges the health check's
# fixtures.
# `make test` runs this.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
scripts/claim-target.sh
scripts/setup-debian.sh --test
scripts/setup-debian.sh --image
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
# The tests compile, and the control plane's Go build runs, while the Python
# environments download (the full torch wheel is ~4.6 GB): on a fresh machine they
# overlap instead of following each other. The real-cluster suite runs the operator and
# trainer binaries, so they are built first.
build_log="$(mktemp)"
control_plane_log="$(mktemp)"
# Every test build has one feature resolution: Cargo resolves features per invocation,
# from the packages it selects, so each invocation below selects the whole workspace
# with the same features (`tests`) and every dependency is built once. (Built apart, the
# trainer's tests and the operator's would unify tokio, hyper, serde and the rest
# differently and compile ~220 of them twice.) Building the trainer's integration tests
# builds its binary (target/debug/trainer), which the real-cluster suite's image runs;
# it honours the TRAINER_INJECT_* drills (`fault-injection`), a release build does not.
# The static operator (operator/Dockerfile's binary) is the real nodes' operator image.
tests=(--workspace --locked --features trainer/fault-injection)
{ cargo test "${tests[@]}" --no-run &&
  cargo test "${tests[@]}" --test real_cluster --no-run &&
  scripts/build-operator-static.sh > "$build_log.operator"; } > "$build_log" 2>&1 &
build=$!
{ scripts/setup-control-plane.sh > "$control_plane_log.bin" &&
  scripts/setup-node.sh > "$control_plane_log.node" &&
  scripts/setup-prometheus.sh > "$control_plane_log.prometheus" &&
  scripts/setup-kueue.sh > "$control_plane_log.kueue" &&
  scripts/setup-kwok.sh > "$control_plane_log.kwok" &&
  scripts/setup-argocd-health.sh > "$control_plane_log.argocd"; } 2> "$control_plane_log" &
control_plane=$!
trap 'kill "$build" "$control_plane" 2>/dev/null || true; rm -f "$build_log" "$build_log".* "$control_plane_log" "$control_plane_log".*' EXIT
TRAINER_TEST_PYTHON="$(scripts/setup-pytorch-ref.sh)"
export TRAINER_TEST_PYTHON
scripts/setup-pytools.sh
scripts/setup-s3.sh
if ! wait "$build"; then
  cat "$build_log" >&2
  echo "building the tests failed (above)" >&2
  exit 1
fi
if ! wait "$control_plane"; then
  cat "$control_plane_log" >&2
  echo "building the control plane, the node, Prometheus, Kueue, kwok or argocd-health failed (above)" >&2
  exit 1
fi
PT_CONTROL_PLANE_BIN="$(cat "$control_plane_log.bin")"
PT_NODE_BIN="$(cat "$control_plane_log.node")"
PT_OPERATOR_STATIC="$(cat "$build_log.operator")"
PT_IMAGES_DIR="$(scripts/setup-images.sh --trainer "$CARGO_TARGET_DIR/debug/trainer" \
  --operator "$PT_OPERATOR_STATIC" --coredns "$PT_NODE_BIN/coredns")"
export PT_NODE_BIN PT_OPERATOR_STATIC PT_IMAGES_DIR
PT_PROMETHEUS_DIR="$(cat "$control_plane_log.prometheus")"
PT_KUEUE_DIR="$(cat "$control_plane_log.kueue")"
PT_KWOK_DIR="$(cat "$control_plane_log.kwok")"
PT_ARGOCD_HEALTH_DIR="$(cat "$control_plane_log.argocd")"
export PT_CONTROL_PLANE_BIN PT_PROMETHEUS_DIR PT_KUEUE_DIR PT_KWOK_DIR PT_ARGOCD_HEALTH_DIR
cargo test "${tests[@]}"
# The real-cluster suite: three clusters at a time (about 14 minutes, much of it spent
# waiting on controllers, leases, grace periods and paced steps), the longest tests first:
# libtest gets a thread for every test, and a cluster's place that frees goes to the
# waiting test expected to take longest (e2e/tests/real_cluster/slots.rs).
clusters="${PT_REAL_CLUSTERS:-3}"
PT_REAL_CLUSTERS="$clusters" RUST_TEST_THREADS=64 cargo test "${tests[@]}" --test real_cluster
"$TRAINER_TEST_PYTHON" scripts/goldens/adamw.py --check
# The fused SwiGLU kernels' source, compiled by NVRTC as libtorch's jiterator will on a GPU.
"$TRAINER_TEST_PYTHON" scripts/check-jiterator.py
# The row kernels (residual RMSNorm, the loss chunk) run on the CPU against PyTorch.
"$TRAINER_TEST_PYTHON" scripts/check-row-kernels.py
# make bench at toy sizes: every row still runs against its peer, the compile peer
# compiles, and the sampler's greedy outputs still equal Hugging Face's.
TRAINER="$CARGO_TARGET_DIR/debug/trainer" \
  OPERATOR_BENCH="OPERATOR_BIN=$CARGO_TARGET_DIR/debug/operator cargo test -q ${tests[*]} --bench operator" \
  bench/suite.sh --smoke >/dev/null
# bench/gpu.sh (issue 10's GPU job) on CPU: a dry run and its micro-batch search and failures.
TRAINER="$CARGO_TARGET_DIR/debug/trainer" PYTHON="$TRAINER_TEST_PYTHON" bench/gpu-test.sh
"$PT_VENV_CPU/bin/python" scripts/validate-manifests.py --operator "$CARGO_TARGET_DIR/debug/operator"
# Packaging: the Helm chart and the alerts (the Argo CD health check: e2e/tests/argocd_health.rs).
"$PT_VENV_CPU/bin/python" scripts/check-chart.py
promtool check rules charts/trainingrun-operator/files/alerts.yaml
promtool test rules charts/trainingrun-operator/files/alerts_test.yaml
