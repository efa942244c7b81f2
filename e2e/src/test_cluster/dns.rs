//! Cluster DNS on real nodes: CoreDNS as a Deployment in `kube-system` behind the
//! `kube-dns` Service at [`CLUSTER_DNS`], answering Services, headless Services' pod
//! names and pods from the API, as kubeadm installs it (its RBAC, a non-root container
//! with a read-only root file system and only `NET_BIND_SERVICE`, which the image's
//! binary carries as a file capability to bind port 53, readiness on `/ready`; two
//! replicas on different nodes where there are two, so that losing a node leaves DNS).

use crate::network::CLUSTER_DNS;

/// The port CoreDNS listens on, inside its container and as the Service.
pub const LISTEN_PORT: u16 = 53;

/// The manifests, for `kubectl apply -f -`, with CoreDNS's image `image`, for a cluster
/// of `nodes` nodes.
pub fn manifests(image: &str, nodes: usize) -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: coredns, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects: [{{kind: ServiceAccount, name: coredns, namespace: kube-system}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: coredns, namespace: kube-system}}
data:
  Corefile: |
    .:{port} {{
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 5
        }}
        loadbalance
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{k8s-app: kube-dns}}}}
  template:
    metadata: {{labels: {{k8s-app: kube-dns}}}}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {{matchLabels: {{k8s-app: kube-dns}}}}
            topologyKey: kubernetes.io/hostname
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      securityContext: {{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {{type: RuntimeDefault}}}}
      containers:
      - name: coredns
        image: {image}
        imagePullPolicy: IfNotPresent
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {{name: dns, containerPort: {port}, protocol: UDP}}
        - {{name: dns-tcp, containerPort: {port}, protocol: TCP}}
        resources:
          requests: {{cpu: 50m, memory: 70Mi}}
          limits: {{memory: 170Mi}}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {{add: [NET_BIND_SERVICE], drop: [ALL]}}
        readinessProbe:
          httpGet: {{path: /ready, port: 8181}}
          periodSeconds: 2
        livenessProbe:
          httpGet: {{path: /health, port: 8080}}
          initialDelaySeconds: 10
        volumeMounts: [{{name: config, mountPath: /etc/coredns, readOnly: true}}]
      volumes:
      - name: config
        configMap: {{name: coredns, items: [{{key: Corefile, path: Corefile}}]}}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {{k8s-app: kube-dns, kubernetes.io/name: CoreDNS}}
spec:
  clusterIP: {ip}
  selector: {{k8s-app: kube-dns}}
  ports:
  - {{name: dns, port: 53, targetPort: {port}, protocol: UDP}}
  - {{name: dns-tcp, port: 53, targetPort: {port}, protocol: TCP}}
"#,
        port = LISTEN_PORT,
        ip = CLUSTER_DNS,
        replicas = nodes.clamp(1, 2),
    )
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[test]
    fn the_manifests_parse_and_the_service_is_the_kubelets_resolver() {
        let text = super::manifests("puretransformer.local/coredns:1", 3);
        let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| serde_json::Value::deserialize(d).expect("YAML"))
            .collect();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Service"]
        );
        assert_eq!(docs[5]["spec"]["clusterIP"], "10.96.0.10");
        let container = &docs[4]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "puretransformer.local/coredns:1");
        assert!(docs[3]["data"]["Corefile"].as_str().unwrap().contains(".:53 {"));
    }

    #[test]
    fn two_nodes_or_more_get_two_replicas_on_different_nodes() {
        let deployment = |nodes: usize| {
            let text = super::manifests("coredns:1", nodes);
            let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
                .map(|d| serde_json::Value::deserialize(d).expect("YAML"))
                .collect();
            docs[4]["spec"].clone()
        };
        assert_eq!(deployment(1)["replicas"], 1);
        assert_eq!(deployment(2)["replicas"], 2);
        assert_eq!(deployment(3)["replicas"], 2);
        let anti = &deployment(3)["template"]["spec"]["affinity"]["podAntiAffinity"];
        assert_eq!(anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"], "kubernetes.io/hostname");
    }
}
