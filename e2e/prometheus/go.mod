// Names Prometheus, which the alert drills run against the test cluster, built by
// scripts/setup-prometheus.sh. Only a list of tools: no code.
module puretransformer.dev/e2e/prometheus

go 1.26.7

require github.com/prometheus/prometheus v0.316.0
