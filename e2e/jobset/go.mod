// Names the JobSet controller that `make bench-recovery` runs beside our operator on
// the test cluster, built by scripts/setup-jobset.sh. Only a list of tools: no code.
module puretransformer.dev/e2e/jobset

go 1.25.0

require sigs.k8s.io/jobset v0.11.0
