# The two set-up commands of the README; both install what they need.
.PHONY: demo test lint crds cuda-build check-image fuzz ci bench bench-operator bench-control-plane bench-recovery e2e-kind

demo: ## the main job: local pretraining then GRPO on the embedded corpus
	scripts/demo.sh

test: ## every test: Rust unit/integration tests, CRD freshness, schema validation
	scripts/test.sh

lint: ## clippy on every target, warnings denied, as CI runs it (its own target directory)
	scripts/lint.sh

FUZZ_CASES ?= 20000
fuzz: ## the property tests of every parser, with FUZZ_CASES cases each (make test runs a few hundred)
	. scripts/env.sh && export LIBTORCH="$$(scripts/setup-libtorch.sh cpu)" && export LD_LIBRARY_PATH="$$LIBTORCH/lib" \
	  && export PROPTEST_CASES=$(FUZZ_CASES) \
	  && cargo test -q --locked -p crds --lib properties \
	  && cargo test -q --locked -p operator --lib properties \
	  && cargo test -q --locked -p trainer --lib properties

crds: ## regenerate crds/trainingruns.yaml (and the Helm chart's copy) and crds/trainingdatasets.yaml from the Rust types
	. scripts/env.sh && cargo run -q -p crds --bin crdgen > crds/trainingruns.yaml
	. scripts/env.sh && cargo run -q -p crds --bin crdgen -- trainingdatasets > crds/trainingdatasets.yaml
	cp crds/trainingruns.yaml charts/trainingrun-operator/crds/trainingruns.yaml
	cp crds/trainingdatasets.yaml charts/trainingrun-operator/crds/trainingdatasets.yaml

cuda-build: ## compile and link the trainer with --features cuda (full torch wheel)
	scripts/build-cuda.sh

check-image: ## the trainer image without Docker: its runtime stage by debootstrap, run as the Job's pod (root)
	scripts/check-image.sh

ci:
	bash .ci/run

e2e-kind: ## the real-cluster suite: kind, CPU images, the chart, three scenarios (needs docker, kind, kubectl, helm; not run in CI)
	e2e/kind/run.sh

bench: ## every performance row against its peer (PyTorch eager and compile, HF generate, torch.save, HF tokenizers, the operator's goals), one table
	bench/suite.sh

bench-ddp: ## Gloo all-reduce bandwidth and the 2-rank DDP step-time ratio on this machine
	. scripts/env.sh && LIBTORCH="$$(scripts/setup-libtorch.sh cpu)" cargo run -q --release --locked -p trainer -- bench-ddp

bench-operator: ## BENCH_RUNS (10,000) TrainingRuns on BENCH_NODES (1,000) kwok nodes of the real control plane (root): the release operator's two replicas, settle, requests once settled, edit → status p99, failover, RSS; then JobSet's controller given the same shapes (BENCH_PEER=jobset; empty for none)
	. scripts/env.sh && export PT_CONTROL_PLANE_BIN="$$(scripts/setup-control-plane.sh)" PT_KWOK_DIR="$$(scripts/setup-kwok.sh)" \
	  BENCH_PEER="$${BENCH_PEER-jobset}" && if [ "$$BENCH_PEER" = jobset ]; then export PT_JOBSET_DIR="$$(scripts/setup-jobset.sh)"; fi \
	  && cargo build -q --release --locked -p operator && cargo bench -q --locked -p e2e --bench operator

bench-control-plane: ## on the real control plane (root): apply → first step, rank death → attempt 2's first step, API requests per steady reconcile
	. scripts/env.sh && export LIBTORCH="$$(scripts/setup-libtorch.sh cpu)" PT_CONTROL_PLANE_BIN="$$(scripts/setup-control-plane.sh)" \
	  && cargo build -q --locked -p operator -p trainer --features trainer/fault-injection && cargo bench -q --locked -p e2e --bench control_plane --profile dev

bench-recovery: ## on the real control plane (root): a killed rank's recovery, TrainingRun against JobSet (built from the Go module proxy), 5 kills each
	. scripts/env.sh && export LIBTORCH="$$(scripts/setup-libtorch.sh cpu)" PT_CONTROL_PLANE_BIN="$$(scripts/setup-control-plane.sh)" \
	  PT_JOBSET_DIR="$$(scripts/setup-jobset.sh)" \
	  && cargo build -q --locked -p operator -p trainer --features trainer/fault-injection && cargo bench -q --locked -p e2e --bench recovery --profile dev
