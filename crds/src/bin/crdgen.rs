//! Prints a CRD: `cargo run -p crds --bin crdgen > crds/trainingruns.yaml`, and with
//! `trainingdatasets` the TrainingDataset CRD (`crds/trainingdatasets.yaml`).
fn main() {
    match std::env::args().nth(1).as_deref() {
        None | Some("trainingruns") => print!("{}", crds::manifest::crd_yaml()),
        Some("trainingdatasets") => print!("{}", crds::manifest::dataset_crd_yaml()),
        Some(other) => {
            eprintln!("crdgen: no CRD named {other:?}; give trainingruns or trainingdatasets");
            std::process::exit(2);
        }
    }
}
