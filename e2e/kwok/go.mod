// Names kwok, which plays the simulated nodes of the real control plane's kwok clusters
// (e2e/src/kwok.rs), built by scripts/setup-kwok.sh. Only a list of tools: no code.
module puretransformer.dev/e2e/kwok

go 1.26.0

require sigs.k8s.io/kwok v0.8.0
