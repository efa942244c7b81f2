// Names Kueue's controller, which the Kueue drills run beside our operator on the test
// cluster, built by scripts/setup-kueue.sh. Only a list of tools: no code.
module puretransformer.dev/e2e/kueue

go 1.25.0

require sigs.k8s.io/kueue v0.17.0
