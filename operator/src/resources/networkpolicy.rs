//! The run's NetworkPolicy (with `--network-policy`): its pods accept traffic from the
//! run's own pods (rendezvous, and the ports NCCL and Gloo open between ranks) and, on
//! the status port only, from the operator's pods and, when given, from every pod of the
//! scraping namespace (Prometheus, for the trainers' `/metrics`). Everything else is
//! refused.

use std::collections::BTreeMap;

use crds::contract::STATUS_PORT;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{Inputs, run_selector, service_name};

/// The operator pods' label, as the Helm chart sets it.
pub const OPERATOR_NAME_LABEL: (&str, &str) = ("app.kubernetes.io/name", "trainingrun-operator");

pub fn network_policy(i: &Inputs, operator_namespace: &str, scrape_namespace: Option<&str>) -> NetworkPolicy {
    let run_pods = LabelSelector { match_labels: Some(run_selector(&i.name())), ..Default::default() };
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let operator = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(labels(&[("kubernetes.io/metadata.name", operator_namespace)])),
            ..Default::default()
        }),
        pod_selector: Some(LabelSelector { match_labels: Some(labels(&[OPERATOR_NAME_LABEL])), ..Default::default() }),
        ..Default::default()
    };
    let scraper = scrape_namespace.map(|ns| NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(labels(&[("kubernetes.io/metadata.name", ns)])),
            ..Default::default()
        }),
        ..Default::default()
    });
    NetworkPolicy {
        metadata: i.meta(service_name(&i.name()), "network-policy", true),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(run_pods.clone()),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer { pod_selector: Some(run_pods), ..Default::default() }]),
                    ports: None,
                },
                NetworkPolicyIngressRule {
                    from: Some([Some(operator), scraper].into_iter().flatten().collect()),
                    ports: Some(vec![NetworkPolicyPort {
                        port: Some(IntOrString::Int(STATUS_PORT.into())),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    }]),
                },
            ]),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};

    #[test]
    fn only_the_runs_pods_and_the_operator_get_in() {
        let r = run(GPU_SPEC);
        let cfg = crds::resolve(&r).unwrap();
        let inputs = Inputs { run: &r, cfg: &cfg, trainer_image: "img" };
        let np = network_policy(&inputs, "trainingrun-system", None);
        assert_eq!(np.metadata.owner_references.unwrap()[0].controller, Some(true));
        let spec = np.spec.unwrap();
        assert_eq!(spec.pod_selector.unwrap().match_labels.unwrap()["training.puretransformer.dev/run"], "llm");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        let rules = spec.ingress.unwrap();
        assert_eq!(rules.len(), 2);
        let own = &rules[0].from.as_ref().unwrap()[0];
        assert_eq!(
            own.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["training.puretransformer.dev/run"],
            "llm"
        );
        assert!(own.namespace_selector.is_none(), "the run's own namespace only");
        assert!(rules[0].ports.is_none(), "ranks talk on rendezvous and ephemeral NCCL/Gloo ports");
        let op = &rules[1].from.as_ref().unwrap()[0];
        assert_eq!(
            op.namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"],
            "trainingrun-system"
        );
        assert_eq!(
            op.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["app.kubernetes.io/name"],
            "trainingrun-operator"
        );
        assert_eq!(rules[1].ports.as_ref().unwrap()[0].port, Some(IntOrString::Int(8080)));
        assert_eq!(rules[1].from.as_ref().unwrap().len(), 1, "the operator alone");

        // A scraping namespace: all its pods, on the status port only.
        let np = network_policy(&inputs, "trainingrun-system", Some("monitoring"));
        let rules = np.spec.unwrap().ingress.unwrap();
        let peers = rules[1].from.as_ref().unwrap();
        assert_eq!(peers.len(), 2);
        let scraper = &peers[1];
        assert_eq!(
            scraper.namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"],
            "monitoring"
        );
        assert!(scraper.pod_selector.is_none(), "any pod of that namespace");
        assert_eq!(rules[1].ports.as_ref().unwrap().len(), 1);
    }
}
