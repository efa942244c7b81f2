//! The test cluster's credentials: a CA, the API server's serving certificate, the
//! ServiceAccount token signing key, and the static tokens of the admin and of each
//! component (the API server's `--token-auth-file`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use super::error::Error;

/// Who a static token authenticates as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub token: String,
}

impl Identity {
    pub fn new(user: &str, groups: &[&str]) -> Identity {
        Identity {
            user: user.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            token: random_token(),
        }
    }

    /// The admin: `system:masters`, as `kubeadm`'s admin.conf.
    pub fn admin() -> Identity {
        Identity::new("kubernetes-admin", &["system:masters"])
    }

    /// A kubelet, as the Node authorizer and NodeRestriction expect it.
    pub fn node(name: &str) -> Identity {
        Identity::new(&format!("system:node:{name}"), &["system:nodes"])
    }
}

/// 32 random bytes as hex, from the kernel.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("getrandom(2)");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The files the control plane's flags name.
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// ServiceAccount tokens are signed with this key (ECDSA P-256, ES256)...
    pub sa_key: PathBuf,
    /// ...and verified with this one.
    pub sa_pub: PathBuf,
    pub token_file: PathBuf,
    pub ca_pem: String,
    /// The API server's client certificate towards the kubelets (`--kubelet-client-*`).
    pub kubelet_client: CertPair,
    /// Each kubelet's serving certificate, by node name, for its address and name.
    pub kubelets: Vec<(String, CertPair)>,
}

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct CertPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate that `ca` signs: a server's for `names` (addresses or DNS names), or a
/// client's (no names) with `cn` as its user and `groups` as its organizations.
fn issue(
    ca: &CertifiedIssuer<'_, KeyPair>,
    cn: &str,
    groups: &[&str],
    names: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String), Error> {
    let tls = |e: rcgen::Error| Error::Pki(format!("{cn}: {e}"));
    let mut params = CertificateParams::new(names).map_err(tls)?;
    params.distinguished_name.push(DnType::CommonName, cn);
    for g in groups {
        params.distinguished_name.push(DnType::OrganizationName, *g);
    }
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().map_err(tls)?;
    let cert = params.signed_by(&key, ca).map_err(tls)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl Pki {
    /// Writes a fresh CA, a serving certificate for `ips` (and the in-cluster names),
    /// the ServiceAccount key pair and the token file for `identities` into `dir`, and
    /// for real nodes the serving certificate of each kubelet in `kubelets` (its name
    /// and address) and the API server's client certificate towards them.
    pub fn create(
        dir: &Path,
        ips: &[IpAddr],
        identities: &[Identity],
        kubelets: &[(String, IpAddr)],
    ) -> Result<Pki, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let tls = |e: rcgen::Error| Error::Pki(e.to_string());
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
        ca_params.distinguished_name.push(DnType::CommonName, "puretransformer-e2e-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(tls)?).map_err(tls)?;

        let mut names: Vec<String> = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        names.push("kubernetes.default.svc.cluster.local".into());
        names.extend(ips.iter().map(IpAddr::to_string));
        let mut serving = CertificateParams::new(names).map_err(tls)?;
        serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        let serving_key = KeyPair::generate().map_err(tls)?;
        let serving_cert = serving.signed_by(&serving_key, &ca).map_err(tls)?;
        let sa = KeyPair::generate().map_err(tls)?;

        let mut tokens = String::new();
        for (i, id) in identities.iter().enumerate() {
            tokens.push_str(&format!("{},{},uid-{i},\"{}\"\n", id.token, id.user, id.groups.join(",")));
        }
        let write = |p: &Path, text: &str| std::fs::write(p, text).map_err(|e| Error::io(p, e));
        let write_pair = |name: &str, (cert, key): (String, String)| -> Result<CertPair, Error> {
            let pair = CertPair { cert: dir.join(format!("{name}.crt")), key: dir.join(format!("{name}.key")) };
            write(&pair.cert, &cert)?;
            write(&pair.key, &key)?;
            Ok(pair)
        };
        // kubeadm's apiserver-kubelet-client: an admin towards the kubelets' webhook authorizer.
        let client = issue(
            &ca,
            "kube-apiserver-kubelet-client",
            &["system:masters"],
            vec![],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let kubelet_client = write_pair("apiserver-kubelet-client", client)?;
        let mut kubelet_certs = Vec::new();
        for (node, ip) in kubelets {
            let names = vec![node.clone(), ip.to_string()];
            let pair = issue(
                &ca,
                &format!("system:node:{node}"),
                &["system:nodes"],
                names,
                ExtendedKeyUsagePurpose::ServerAuth,
            )?;
            kubelet_certs.push((node.clone(), write_pair(&format!("kubelet-{node}"), pair)?));
        }
        let pki = Pki {
            kubelet_client,
            kubelets: kubelet_certs,
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            token_file: dir.join("tokens.csv"),
            ca_pem: ca.pem(),
        };
        write(&pki.ca_cert, &pki.ca_pem)?;
        write(&pki.serving_cert, &serving_cert.pem())?;
        write(&pki.serving_key, &serving_key.serialize_pem())?;
        write(&pki.sa_key, &sa.serialize_pem())?;
        write(&pki.sa_pub, &sa.public_key_pem())?;
        write(&pki.token_file, &tokens)?;
        Ok(pki)
    }

    /// A kubeconfig for `token` against `server`, trusting the cluster's CA.
    pub fn kubeconfig(&self, server: &str, user: &str, token: &str) -> String {
        use base64::Engine;
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {user}\ncurrent-context: e2e\n",
            ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes()),
        )
    }
}
