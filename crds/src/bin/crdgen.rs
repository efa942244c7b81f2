//! Prints the TrainingRun CRD: `cargo run -p crds --bin crdgen > crds/trainingruns.yaml`.
fn main() {
    print!("{}", crds::manifest::crd_yaml());
}
