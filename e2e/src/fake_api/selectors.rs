//! Label and field selectors: what a list, watch or deletecollection selects.

use serde_json::Value;

use super::error::FakeError;
use super::request::Req;
use super::resource::{Key, Res, Target};

/// What a list, watch or deletecollection selects.
pub(super) struct Filter {
    pub(super) res: Res,
    pub(super) namespace: Option<String>,
    name: Option<String>,
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

impl Filter {
    pub(super) fn new(t: &Target, req: &Req) -> Result<Filter, FakeError> {
        let labels = match req.q("labelSelector") {
            Some(s) => parse_label_selector(s).map_err(FakeError::BadRequest)?,
            None => Vec::new(),
        };
        let fields = match req.q("fieldSelector") {
            Some(s) => parse_field_selector(s).map_err(FakeError::BadRequest)?,
            None => Vec::new(),
        };
        Ok(Filter { res: t.res.clone(), namespace: t.namespace.clone(), name: t.name.clone(), labels, fields })
    }

    /// One label (`key=value`) every selected object carries, if the selector requires one.
    pub(super) fn label_equal(&self) -> Option<String> {
        self.labels.iter().find_map(|r| match r {
            LabelReq::Eq(k, v) => Some(format!("{k}={v}")),
            _ => None,
        })
    }

    pub(super) fn matches(&self, key: &Key, obj: &Value) -> bool {
        key.res == self.res
            && (self.namespace.is_none() || key.namespace == self.namespace)
            && self.name.as_ref().is_none_or(|n| *n == key.name)
            && self.labels.iter().all(|r| r.matches(obj))
            && self.fields.iter().all(|r| r.matches(obj))
    }
}

#[derive(Debug)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl LabelReq {
    pub(super) fn matches(&self, obj: &Value) -> bool {
        // Not `Value::pointer`, which allocates: lists test every object of their type.
        let label = |k: &str| obj.get("metadata")?.get("labels")?.get(k)?.as_str();
        match self {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => label(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        }
    }
}

/// Splits on commas outside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    terms.into_iter().map(str::trim).filter(|t| !t.is_empty()).collect()
}

fn valid_label_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_label_selector(s: &str) -> Result<Vec<LabelReq>, String> {
    let bad = |term: &str| format!("unable to parse requirement: {term:?} in label selector {s:?}");
    let mut reqs = Vec::new();
    for term in split_terms(s) {
        let req = if let Some((head, rest)) = term.split_once('(') {
            let values: Vec<String> = rest
                .strip_suffix(')')
                .ok_or_else(|| bad(term))?
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            match head.split_whitespace().collect::<Vec<_>>().as_slice() {
                [k, "in"] if valid_label_key(k) => LabelReq::In(k.to_string(), values),
                [k, "notin"] if valid_label_key(k) => LabelReq::NotIn(k.to_string(), values),
                _ => return Err(bad(term)),
            }
        } else if let Some((k, v)) = term.split_once("!=") {
            LabelReq::NotEq(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = term.split_once("==") {
            LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = term.split_once('=') {
            LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
        } else if let Some(k) = term.strip_prefix('!') {
            LabelReq::NotExists(k.trim().to_string())
        } else {
            LabelReq::Exists(term.to_string())
        };
        let key = match &req {
            LabelReq::Eq(k, _)
            | LabelReq::NotEq(k, _)
            | LabelReq::In(k, _)
            | LabelReq::NotIn(k, _)
            | LabelReq::Exists(k)
            | LabelReq::NotExists(k) => k,
        };
        if !valid_label_key(key) {
            return Err(bad(term));
        }
        reqs.push(req);
    }
    Ok(reqs)
}

#[derive(Debug)]
struct FieldReq {
    /// JSON pointer of the field (`metadata.name` → `/metadata/name`).
    pointer: String,
    value: String,
    equal: bool,
}

impl FieldReq {
    pub(super) fn matches(&self, obj: &Value) -> bool {
        let actual = match obj.pointer(&self.pointer) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        (actual == self.value) == self.equal
    }
}

fn parse_field_selector(s: &str) -> Result<Vec<FieldReq>, String> {
    split_terms(s)
        .into_iter()
        .map(|term| {
            let (field, value, equal) = if let Some((k, v)) = term.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, v, true)
            } else {
                return Err(format!("invalid field selector term {term:?}"));
            };
            let field = field.trim();
            if field.is_empty() {
                return Err(format!("invalid field selector term {term:?}"));
            }
            Ok(FieldReq { pointer: format!("/{}", field.replace('.', "/")), value: value.trim().to_string(), equal })
        })
        .collect()
}
