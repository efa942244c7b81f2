//! The headless Service: stable DNS for pod 0 (`<job>-0.<service>`) before any pod
//! is ready, so ranks can rendezvous while they start.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{Inputs, run_selector, service_name};
use crds::contract::{RENDEZVOUS_PORT, STATUS_PORT};

pub fn service(i: &Inputs) -> Service {
    let port = |name: &str, port: u16| ServicePort {
        name: Some(name.into()),
        port: port.into(),
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    Service {
        metadata: i.meta(service_name(&i.name()), "rendezvous", true),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(run_selector(&i.name())),
            ports: Some(vec![port("rendezvous", RENDEZVOUS_PORT), port("status", STATUS_PORT)]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};

    #[test]
    fn headless_with_rendezvous_and_status_ports() {
        let r = run(GPU_SPEC);
        let cfg = crds::resolve(&r).unwrap();
        let svc = service(&Inputs { run: &r, cfg: &cfg, trainer_image: "img" });
        assert_eq!(svc.metadata.name.as_deref(), Some("llm"));
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(spec.selector.unwrap()["training.puretransformer.dev/run"], "llm");
        let ports: Vec<(String, i32)> = spec.ports.unwrap().into_iter().map(|p| (p.name.unwrap(), p.port)).collect();
        assert_eq!(ports, vec![("rendezvous".into(), 29500), ("status".into(), 8080)]);
        assert_eq!(svc.metadata.owner_references.unwrap()[0].controller, Some(true));
    }
}
