//! What a request addresses: resource types, object keys and the URL layout.

/// Plurals whose kind is needed before any object of theirs exists (empty lists,
/// bookmarks), and kinds whose plural is not the naive lowercase + "s".
const KNOWN_KINDS: &[(&str, &str)] = &[
    ("pods", "Pod"),
    ("jobs", "Job"),
    ("services", "Service"),
    ("configmaps", "ConfigMap"),
    ("persistentvolumeclaims", "PersistentVolumeClaim"),
    ("persistentvolumes", "PersistentVolume"),
    ("events", "Event"),
    ("leases", "Lease"),
    ("trainingruns", "TrainingRun"),
    ("trainingdatasets", "TrainingDataset"),
    ("customresourcedefinitions", "CustomResourceDefinition"),
    ("secrets", "Secret"),
    ("nodes", "Node"),
    ("namespaces", "Namespace"),
    ("networkpolicies", "NetworkPolicy"),
    ("endpoints", "Endpoints"),
    ("serviceaccounts", "ServiceAccount"),
    ("deployments", "Deployment"),
    ("statefulsets", "StatefulSet"),
    ("priorityclasses", "PriorityClass"),
];

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Res {
    group: String,
    version: String,
    pub(super) plural: String,
}

impl Res {
    pub(super) fn of_type(api_version: &str, kind: &str) -> Res {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        Res { group: group.to_string(), version: version.to_string(), plural: plural_of(kind) }
    }

    pub(super) fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// `plural[.group]`, as Status messages name resources.
    pub(super) fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.clone() } else { format!("{}.{}", self.plural, self.group) }
    }

    /// Custom resources answer a completed DELETE with the object, built-ins with a Status.
    pub(super) fn is_builtin(&self) -> bool {
        self.group.is_empty() || !self.group.contains('.') || self.group.ends_with(".k8s.io")
    }

    pub(super) fn default_propagation(&self) -> Propagation {
        // batch/v1 Jobs orphan their pods unless told otherwise (legacy default).
        if self.group == "batch" && self.plural == "jobs" { Propagation::Orphan } else { Propagation::Background }
    }
}

fn plural_of(kind: &str) -> String {
    if let Some((plural, _)) = KNOWN_KINDS.iter().find(|(_, k)| *k == kind) {
        return plural.to_string();
    }
    let lower = kind.to_ascii_lowercase();
    if lower.ends_with('s') || lower.ends_with('x') || lower.ends_with("ch") || lower.ends_with("sh") {
        format!("{lower}es")
    } else if lower.ends_with('y') && !lower.ends_with("ey") && !lower.ends_with("ay") && !lower.ends_with("oy") {
        format!("{}ies", &lower[..lower.len() - 1])
    } else {
        format!("{lower}s")
    }
}

pub(super) fn kind_of_plural(plural: &str) -> String {
    if let Some((_, kind)) = KNOWN_KINDS.iter().find(|(p, _)| *p == plural) {
        return kind.to_string();
    }
    let singular = plural.strip_suffix('s').unwrap_or(plural);
    let mut chars = singular.chars();
    chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Key {
    pub(super) res: Res,
    pub(super) namespace: Option<String>,
    pub(super) name: String,
}

impl Key {
    pub(super) fn of_type(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Key {
        Key { res: Res::of_type(api_version, kind), namespace: namespace.map(str::to_string), name: name.to_string() }
    }
}

/// What a request path addresses.
#[derive(Clone, Debug)]
pub(super) struct Target {
    pub(super) res: Res,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) subresource: Option<String>,
}

impl Target {
    /// `/api/v1/...` or `/apis/{group}/{version}/...`, then
    /// `namespaces/{ns}/{plural}[/{name}[/{sub}]]` or `{plural}[/{name}[/{sub}]]`.
    pub(super) fn parse(path: &str) -> Option<Target> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
        let (group, version, rest) = match segs.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, plural, tail @ ..] if !matches!(*plural, "status" | "finalize") => {
                (Some(ns.to_string()), std::iter::once(plural).chain(tail.iter()).copied().collect::<Vec<_>>())
            }
            _ => (None, rest.to_vec()),
        };
        let (plural, name, subresource) = match rest.as_slice() {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(name.to_string()), None),
            [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        let res = Res { group: group.to_string(), version: version.to_string(), plural: plural.to_string() };
        Some(Target { res, namespace, name, subresource })
    }

    pub(super) fn key(&self, name: &str) -> Key {
        Key { res: self.res.clone(), namespace: self.namespace.clone(), name: name.to_string() }
    }
}

/// How a deletion reaches the dependents of the deleted object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Propagation {
    Orphan,
    Background,
    Foreground,
}
