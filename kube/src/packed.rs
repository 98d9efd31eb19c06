//! Objects kept compactly, for the copies a process holds of every object of a kind but reads
//! whole only on rare paths: [`Packed`] (an object kept as its JSON, parsed back when needed) and
//! [`JsonDigest`] (what a copy is compared by, kept as the SHA-256 of its JSON).
//!
//! Parsed, an Argo CD object takes several times its JSON: each of its strings, maps and
//! `serde_json::Value` trees is an allocation of its own, and the typed structs are large inline
//! (an `Application` is over a kilobyte before any of its fields is set). The agent keeps one
//! hub copy per object and the principal one remembered mirror per object of its autonomous
//! agents, so at thousands of objects these copies dominate the heap unless packed.
//!
//! Both are canonical: every map in the objects this project keeps is ordered by key
//! (`BTreeMap`, and `serde_json::Map` without the `preserve_order` feature, which a test guards),
//! so equal objects pack to equal bytes and digest to equal digests, and packs and digests
//! compare as the objects do, without parsing.

use std::fmt;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// An object of type `T` kept as its JSON.
pub struct Packed<T> {
    json: Box<[u8]>,
    // `fn() -> T`: a pack owns bytes, not a `T`, so it is `Send`, `Sync` and `Clone` whatever `T` is.
    kind: PhantomData<fn() -> T>,
}

impl<T: Serialize> Packed<T> {
    /// `obj` as JSON.
    pub fn pack(obj: &T) -> Self {
        let json =
            serde_json::to_vec(obj).expect("an object of JSON-serialisable fields serialises");
        Packed {
            json: json.into_boxed_slice(),
            kind: PhantomData,
        }
    }
}

impl<T: DeserializeOwned> Packed<T> {
    /// The object packed.
    pub fn unpack(&self) -> T {
        serde_json::from_slice(&self.json).expect("packed from a `T`, which reads back")
    }
}

impl<T> Packed<T> {
    /// The JSON's size in bytes.
    pub fn len(&self) -> usize {
        self.json.len()
    }

    /// Whether the JSON is empty (never, for a packed object).
    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }
}

impl<T> Clone for Packed<T> {
    fn clone(&self) -> Self {
        Packed {
            json: self.json.clone(),
            kind: PhantomData,
        }
    }
}

impl<T> PartialEq for Packed<T> {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json
    }
}

impl<T> Eq for Packed<T> {}

impl<T> fmt::Debug for Packed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Packed({} bytes)", self.json.len())
    }
}

/// The SHA-256 of a value's JSON: for what a process only ever compares (a view of an object),
/// where a copy would cost kilobytes per object.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct JsonDigest([u8; 32]);

impl JsonDigest {
    /// The digest of `value`'s JSON.
    pub fn of(value: &impl Serialize) -> Self {
        use sha2::{Digest, Sha256};
        let json = serde_json::to_vec(value).expect("a view of JSON values serialises");
        JsonDigest(Sha256::digest(json).into())
    }
}

impl fmt::Debug for JsonDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0[..8]))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::argocd::Application;

    /// An Application whose `operation` is `operation` (a `Value`, whose maps keep their
    /// insertion order under serde_json's `preserve_order`).
    fn app(project: &str, operation: serde_json::Value) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": "guestbook", "namespace": "agent-a",
                         "labels": {"z": "1", "a": "2"}, "annotations": {"b": "2", "a": "1"}},
            "spec": {"project": project, "destination": {"name": "in-cluster"},
                     "source": {"repoURL": "https://example.com/repo", "path": "guestbook"}},
            "operation": operation,
            "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}
        }))
        .unwrap()
    }

    fn op(revision_first: bool) -> serde_json::Value {
        if revision_first {
            json!({"sync": {"revision": "HEAD", "prune": true}})
        } else {
            json!({"sync": {"prune": true, "revision": "HEAD"}})
        }
    }

    #[test]
    fn a_packed_object_unpacks_to_itself_and_packs_compare_as_the_objects_do() {
        let a = app("default", op(true));
        let packed = Packed::pack(&a);
        assert_eq!(packed.unpack(), a);
        assert_eq!(Packed::pack(&packed.unpack()), packed);
        // The same maps built in another order: the same bytes (guards `preserve_order`).
        assert_eq!(Packed::pack(&app("default", op(false))), packed);
        let mut relabelled = a.clone();
        relabelled.metadata.labels = Some(BTreeMap::from([
            ("a".to_string(), "2".to_string()),
            ("z".to_string(), "1".to_string()),
        ]));
        assert_eq!(Packed::pack(&relabelled), packed);
        assert_ne!(Packed::pack(&app("other", op(true))), packed);
        assert!(packed.len() < 1024, "{packed:?}");
    }

    #[test]
    fn digests_compare_as_the_values_do_whatever_order_their_maps_were_built_in() {
        let a = app("default", op(true));
        assert_eq!(
            JsonDigest::of(&a),
            JsonDigest::of(&app("default", op(false)))
        );
        assert_ne!(JsonDigest::of(&a), JsonDigest::of(&app("other", op(true))));
        assert_eq!(format!("{:?}", JsonDigest::of(&a)).len(), 16);
    }
}
