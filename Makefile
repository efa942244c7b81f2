# The two set-up commands of the README; both install what they need.
.PHONY: demo test crds cuda-build ci

demo: ## the main job: a local training run on the embedded corpus
	scripts/demo.sh

test: ## every test: Rust unit/integration tests, CRD freshness, schema validation
	scripts/test.sh

crds: ## regenerate crds/trainingruns.yaml from the Rust types
	. scripts/env.sh && cargo run -q -p crds --bin crdgen > crds/trainingruns.yaml

cuda-build: ## compile and link the trainer with --features cuda (full torch wheel)
	scripts/build-cuda.sh

ci:
	bash .ci/run
