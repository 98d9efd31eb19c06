//! Kubernetes label selectors as `--label-selector` gives them: parsed once, matched in process.
//!
//! Owns [`LabelSelector`]: the string syntax of `k8s.io/apimachinery/pkg/labels.Parse`
//! (comma-separated requirements, all of which must hold: `key=value`, `key==value`,
//! `key!=value`, `key in (a,b)`, `key notin (a,b)`, `key`, `!key`, `key>1`, `key<1`) turned into
//! requirements that can be checked against an object's labels with the apiserver's semantics,
//! and written back in canonical form for a watch's `labelSelector` parameter. A process that
//! keeps one watch of every object of a kind and narrows it itself (instead of one server-side
//! selected watch per user) needs exactly that. kube-core's `Selector` matches but does not parse
//! strings and has no `>`/`<`, hence this module; keys and values are checked against
//! Kubernetes' label syntax so a bad selector is refused at startup, not by every watch.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use argocd_agent_proto::event::names::is_dns1123_subdomain;

/// A parsed label selector: every requirement must hold. The empty selector selects everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// One requirement on one label key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// `key in (values)`, also `key=value` and `key==value`.
    In(String, BTreeSet<String>),
    /// `key notin (values)`, also `key!=value`: holds when the label is absent too.
    NotIn(String, BTreeSet<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
    /// `key>n`: the label is an integer greater than `n`.
    GreaterThan(String, i64),
    /// `key<n`: the label is an integer less than `n`.
    LessThan(String, i64),
}

/// Why a label selector string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(String);

impl LabelSelector {
    /// Whether an object with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the selector selects every object (no requirement).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
            Requirement::GreaterThan(key, n) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Requirement::LessThan(key, n) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        }
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(value: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_terms(value)? {
            requirements.push(parse_requirement(term.trim())?);
        }
        Ok(LabelSelector { requirements })
    }
}

/// The comma-separated terms of `value`, commas inside `( )` belonging to their set.
fn split_terms(value: &str) -> Result<Vec<&str>, SelectorError> {
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut terms = Vec::new();
    let (mut open, mut start) = (false, 0);
    for (i, c) in value.char_indices() {
        match c {
            '(' if open => return Err(err("nested parentheses")),
            '(' => open = true,
            ')' if !open => return Err(err("unbalanced parentheses")),
            ')' => open = false,
            ',' if !open => {
                terms.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if open {
        return Err(err("unbalanced parentheses"));
    }
    terms.push(&value[start..]);
    Ok(terms)
}

fn err(reason: impl Into<String>) -> SelectorError {
    SelectorError(reason.into())
}

fn parse_requirement(term: &str) -> Result<Requirement, SelectorError> {
    if term.is_empty() {
        return Err(err("it contains an empty term"));
    }
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(label_key(key.trim())?));
    }
    let key_end = term
        .find(|c: char| c.is_whitespace() || matches!(c, '=' | '!' | '<' | '>' | '('))
        .unwrap_or(term.len());
    let key = label_key(&term[..key_end])?;
    let rest = term[key_end..].trim_start();
    if rest.is_empty() {
        return Ok(Requirement::Exists(key));
    }
    let one = |v: &str| -> Result<BTreeSet<String>, SelectorError> {
        Ok(BTreeSet::from([label_value(v.trim())?]))
    };
    if let Some(v) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
        return Ok(Requirement::In(key, one(v)?));
    }
    if let Some(v) = rest.strip_prefix("!=") {
        return Ok(Requirement::NotIn(key, one(v)?));
    }
    let number = |v: &str| {
        v.trim().parse::<i64>().map_err(|_| {
            err(format!(
                "{key}: `>` and `<` need an integer, not {:?}",
                v.trim()
            ))
        })
    };
    if let Some(v) = rest.strip_prefix('>') {
        return Ok(Requirement::GreaterThan(key.clone(), number(v)?));
    }
    if let Some(v) = rest.strip_prefix('<') {
        return Ok(Requirement::LessThan(key.clone(), number(v)?));
    }
    let (op, set) = rest.split_at(
        rest.find(|c: char| c.is_whitespace() || c == '(')
            .unwrap_or(rest.len()),
    );
    let values = set_values(set.trim(), &key)?;
    match op {
        "in" => Ok(Requirement::In(key, values)),
        "notin" => Ok(Requirement::NotIn(key, values)),
        other => Err(err(format!(
            "{key}: unknown operator {other:?} (use =, ==, !=, in, notin, >, < or a bare key)"
        ))),
    }
}

/// The values of `(a, b)`; at least one, as the apiserver requires for `in` and `notin`.
fn set_values(set: &str, key: &str) -> Result<BTreeSet<String>, SelectorError> {
    let inner = set
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| err(format!("{key}: `in` and `notin` need a set like (a,b)")))?;
    let values = inner
        .split(',')
        .map(|v| label_value(v.trim()))
        .collect::<Result<BTreeSet<_>, _>>()?;
    if inner.trim().is_empty() {
        return Err(err(format!("{key}: the set is empty")));
    }
    Ok(values)
}

/// A label key: an optional DNS-subdomain prefix and '/', then a name.
fn label_key(key: &str) -> Result<String, SelectorError> {
    let (prefix, name) = key
        .rsplit_once('/')
        .map_or((None, key), |(p, n)| (Some(p), n));
    let prefix_ok = prefix.is_none_or(|p| p.len() <= 253 && is_dns1123_subdomain(p));
    if key.is_empty() {
        return Err(err("a term has no label key"));
    }
    if !prefix_ok || !is_label_name(name) {
        return Err(err(format!("{key:?} is not a label key")));
    }
    Ok(key.to_string())
}

/// A label value: empty, or a name.
fn label_value(value: &str) -> Result<String, SelectorError> {
    if value.is_empty() || is_label_name(value) {
        Ok(value.to_string())
    } else {
        Err(err(format!("{value:?} is not a label value")))
    }
}

/// Whether `value` is a label name: at most 63 letters, digits, '-', '_' or '.', starting and
/// ending with a letter or digit.
pub(crate) fn is_label_name(value: &str) -> bool {
    let bytes = value.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= 63
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes.iter().all(inner)
        }
        _ => false,
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |values: &BTreeSet<String>| values.iter().cloned().collect::<Vec<_>>().join(",");
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::In(k, v) if v.len() == 1 => write!(f, "{k}={}", set(v))?,
                Requirement::In(k, v) => write!(f, "{k} in ({})", set(v))?,
                Requirement::NotIn(k, v) if v.len() == 1 => write!(f, "{k}!={}", set(v))?,
                Requirement::NotIn(k, v) => write!(f, "{k} notin ({})", set(v))?,
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::DoesNotExist(k) => write!(f, "!{k}")?,
                Requirement::GreaterThan(k, n) => write!(f, "{k}>{n}")?,
                Requirement::LessThan(k, n) => write!(f, "{k}<{n}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn each_operator_matches_as_the_apiserver_does() {
        let obj = labels(&[("app", "web"), ("tier", "front"), ("replicas", "3")]);
        let none = labels(&[]);
        for (selector, on_obj, on_none) in [
            ("app=web", true, false),
            ("app==web", true, false),
            ("app=db", false, false),
            ("app!=db", true, true),
            ("app!=web", false, true),
            ("tier in (front, back)", true, false),
            ("tier in (back)", false, false),
            ("tier notin (back)", true, true),
            ("tier notin (front,back)", false, true),
            ("app", true, false),
            ("!app", false, true),
            ("!legacy", true, true),
            ("replicas>2", true, false),
            ("replicas>3", false, false),
            ("replicas<4", true, false),
            ("app=web,tier=back", false, false),
            ("app=web, tier in (front)", true, false),
            ("example.com/team", false, false),
            ("", true, true),
        ] {
            assert_eq!(sel(selector).matches(&obj), on_obj, "{selector} on {obj:?}");
            assert_eq!(
                sel(selector).matches(&none),
                on_none,
                "{selector} on no labels"
            );
        }
    }

    #[test]
    fn bad_selectors_say_what_is_wrong() {
        for (bad, says) in [
            ("app=foo,", "empty term"),
            ("env in (a,b", "unbalanced"),
            ("env in a,b)", "unbalanced"),
            ("=x", "no label key"),
            ("env in ()", "empty"),
            ("env between (a)", "unknown operator"),
            ("replicas>many", "integer"),
            ("app=-bad-", "not a label value"),
            ("-app=x", "not a label key"),
            ("a/b/c=x", "not a label key"),
        ] {
            let e = bad.parse::<LabelSelector>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_canonical_form_parses_back_to_the_same_selector() {
        for s in [
            "app=web",
            "app!=web,!legacy",
            "env in (a,b),x",
            "env notin (a,b)",
            "n>1,m<2",
            "example.com/owner==me",
        ] {
            let parsed = sel(s);
            assert_eq!(sel(&parsed.to_string()), parsed, "{s} -> {parsed}");
        }
        assert_eq!(
            sel("app == web , tier in ( b , a )").to_string(),
            "app=web,tier in (a,b)"
        );
    }
}
