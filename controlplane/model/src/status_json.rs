//! A resource's status as the state keeps it: its JSON text, as written.
//!
//! A Node's status holds every GPU's instances and workloads. Kept as a parsed
//! `serde_json::Value`, each one was a tree of hundreds of allocations: built by every
//! controller from every entry of agents' statuses (at 10,000 hosts the followers'
//! decoding of those trees was 7% of the controllers' CPU while the fleet registered,
//! perf), dropped when replaced, walked again for every snapshot, and several times the
//! text's size in memory. As text it is checked once (it must be JSON) and then copied,
//! compared and written as it is; the few keys read on hot paths (a Node's health, digest
//! and applied version, which the provisioner and the failure detector read for every Node
//! on every pass) are read from it once, on first use.

use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::status::HOT_KEYS;

/// JSON text, shared by clones (every change event and answer carries the resource).
/// Equal when the texts are: writers serialize the same state the same way.
#[derive(Clone)]
pub struct StatusJson(Arc<Stored>);

struct Stored {
    text: Box<RawValue>,
    /// The values of [`HOT_KEYS`] present at the top level, read on first use.
    hot: OnceLock<Vec<(usize, Value)>>,
}

impl StatusJson {
    fn new(text: Box<RawValue>) -> Self {
        Self(Arc::new(Stored { text, hot: OnceLock::new() }))
    }

    /// No status (`null`): a resource nothing has reported on.
    pub fn null() -> Self {
        Self::new(RawValue::from_string("null".to_string()).expect("null is JSON"))
    }

    /// `value` as a status.
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self::new)
    }

    /// A client's status text, refused unless it is JSON; written compact.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        let value: Value = serde_json::from_str(text)?;
        Self::of(&value)
    }

    pub fn as_str(&self) -> &str {
        self.0.text.get()
    }

    /// Whether `other` is this very status (a clone of it), not only the same text.
    pub fn is_shared_with(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    pub fn is_null(&self) -> bool {
        self.as_str() == "null"
    }

    /// The status parsed (a tree: for readers off the hot paths); `null` when it cannot be
    /// (JSON nested deeper than serde_json reads, 128 levels: a client's status is refused
    /// past that, and no reader may panic on one that came another way).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.as_str()).unwrap_or(Value::Null)
    }

    /// The status read as `T`.
    pub fn read<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.as_str())
    }

    /// The value of the top-level key `key`, if the status is an object holding it. Keys in
    /// [`HOT_KEYS`] come from a cache filled on first use; any other is looked for in the text.
    pub fn field(&self, key: &str) -> Option<Value> {
        match HOT_KEYS.iter().position(|k| *k == key) {
            Some(i) => {
                let hot = self.0.hot.get_or_init(|| pick(self.as_str(), &HOT_KEYS));
                hot.iter().find(|(at, _)| *at == i).map(|(_, v)| v.clone())
            }
            None => pick(self.as_str(), &[key]).pop().map(|(_, v)| v),
        }
    }
}

/// The values of `keys` at the top level of `text`, with each key's position in `keys`;
/// none when `text` is not an object. The rest of the text is skipped, not built, and not
/// read at all once every key is found (a Node's status puts the keys read on hot paths
/// before its GPUs). Should a key come twice, the first counts.
fn pick(text: &str, keys: &[&str]) -> Vec<(usize, Value)> {
    struct Pick<'k, 'f> {
        keys: &'k [&'k str],
        found: &'f mut Vec<(usize, Value)>,
    }

    impl<'de> Visitor<'de> for Pick<'_, '_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                match self.keys.iter().position(|k| *k == key).filter(|i| !self.found.iter().any(|(at, _)| at == i)) {
                    Some(i) => {
                        self.found.push((i, map.next_value::<Value>()?));
                        if self.found.len() == self.keys.len() {
                            // An error is the one way to leave a map before its end.
                            return Err(serde::de::Error::custom("every key found"));
                        }
                    }
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(())
        }
    }

    impl<'de> DeserializeSeed<'de> for Pick<'_, '_> {
        type Value = ();

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }

    let mut found = Vec::new();
    // Whether it ended with every key, at the end of the object, or on text that is not
    // one, what was found before is the answer.
    let _ = Pick { keys, found: &mut found }.deserialize(&mut serde_json::Deserializer::from_str(text));
    found
}

impl Default for StatusJson {
    fn default() -> Self {
        Self::null()
    }
}

impl From<Value> for StatusJson {
    fn from(value: Value) -> Self {
        Self::of(&value).expect("a JSON value is JSON")
    }
}

impl PartialEq for StatusJson {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.as_str() == other.as_str()
    }
}

impl fmt::Debug for StatusJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for StatusJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Written as the JSON it holds, not as a string (the log, the peers' messages and the
/// snapshots are JSON).
impl Serialize for StatusJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.text.serialize(s)
    }
}

/// Read from JSON: the value's text is kept (checked to be JSON, not built into a tree),
/// without the whitespace between its tokens, so that equal statuses have equal texts
/// however they were formatted.
impl<'de> Deserialize<'de> for StatusJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        match compacted(raw.get()) {
            None => Ok(Self::new(raw)),
            Some(text) => RawValue::from_string(text).map(Self::new).map_err(serde::de::Error::custom),
        }
    }
}

/// `json` (valid JSON) without whitespace outside its strings; `None` when it has none.
/// Written here because serde_json compacts only by building the value.
fn compacted(json: &str) -> Option<String> {
    let is_space = |b: u8| matches!(b, b' ' | b'\n' | b'\r' | b'\t');
    let (mut in_string, mut escaped) = (false, false);
    let mut first_space = None;
    for (i, b) in json.bytes().enumerate() {
        match (in_string, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (_, _, b'"') => in_string = !in_string,
            (false, _, b) if is_space(b) => {
                first_space = Some(i);
                break;
            }
            _ => {}
        }
    }
    let start = first_space?;
    let mut out = String::with_capacity(json.len());
    out.push_str(&json[..start]);
    for c in json[start..].chars() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, _, '"') => in_string = !in_string,
            (false, _, c) if c.is_ascii() && is_space(c as u8) => continue,
            _ => {}
        }
        out.push(c);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_status_keeps_its_text_and_reads_its_top_level_keys() {
        let status = StatusJson::from(json!({"health": "healthy", "observed_digest": 7, "gpus": [{"health": "x"}], "other": {"a": 1}}));
        assert_eq!(status.field("health"), Some(json!("healthy")));
        assert_eq!(status.field("observed_digest"), Some(json!(7)));
        assert_eq!(status.field("applied_version"), None, "absent");
        assert_eq!(status.field("other"), Some(json!({"a": 1})), "a key that is not cached");
        assert_eq!(status.field("a"), None, "top level only");
        let twice =
            StatusJson::of(&serde_json::value::RawValue::from_string(r#"{"health":"unhealthy","health":"healthy"}"#.into()).unwrap())
                .unwrap();
        assert_eq!(twice.field("health"), Some(json!("unhealthy")), "the first of a key given twice");
        assert_eq!(status.to_value(), json!({"health": "healthy", "observed_digest": 7, "gpus": [{"health": "x"}], "other": {"a": 1}}));
        for not_an_object in [json!(null), json!([1, 2]), json!("health"), json!(3)] {
            assert_eq!(StatusJson::from(not_an_object.clone()).field("health"), None, "{not_an_object}");
        }
        assert!(StatusJson::default().is_null() && !status.is_null());
        assert!(status.clone().is_shared_with(&status) && !StatusJson::from(status.to_value()).is_shared_with(&status));
        assert_eq!(StatusJson::from(status.to_value()), status, "equal: the same text");
    }

    #[test]
    fn it_travels_as_the_json_it_holds_and_only_json_is_taken() {
        #[derive(Serialize, Deserialize)]
        struct Put {
            status: StatusJson,
        }
        let put = Put { status: StatusJson::parse(r#"{ "health" : "unhealthy", "n": [1, 2.5] }"#).unwrap() };
        assert_eq!(put.status.as_str(), r#"{"health":"unhealthy","n":[1,2.5]}"#, "a client's text is written compact");
        let wire = serde_json::to_string(&put).unwrap();
        assert_eq!(wire, r#"{"status":{"health":"unhealthy","n":[1,2.5]}}"#, "not as a string");
        let back: Put = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.status, put.status);
        assert_eq!(back.status.field("health"), Some(json!("unhealthy")));
        assert_eq!(serde_json::to_value(&put).unwrap(), json!({"status": {"health": "unhealthy", "n": [1, 2.5]}}));
        let from_value: Put = serde_json::from_value(json!({"status": {"x": 1}})).unwrap();
        assert_eq!(from_value.status.as_str(), r#"{"x":1}"#);

        let spaced: Put = serde_json::from_str("{\"status\": { \"a b\" : [ 1 ,\n\t\"c \\\" d\" ] } }").unwrap();
        assert_eq!(spaced.status.as_str(), r#"{"a b":[1,"c \" d"]}"#, "whitespace between tokens is dropped, not in strings");
        assert_eq!(compacted(r#"{"a":"x y"}"#), None, "nothing to drop: kept as it is");

        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert!(StatusJson::parse(&deep).is_err(), "too deep for a client's status");
        // From a peer or a snapshot the text is only captured, which has no depth limit.
        let stored: Put = serde_json::from_str(&format!(r#"{{"status": {{"health": "healthy", "x": {deep}}}}}"#)).unwrap();
        assert_eq!(stored.status.to_value(), Value::Null, "read as no status, not a panic");
        assert_eq!(stored.status.field("health"), Some(json!("healthy")), "the keys before it are read");
        assert_eq!(stored.status.field("x"), None);

        for bad in ["", "{", r#"{"a": }"#, "nul", "[1,]"] {
            assert!(StatusJson::parse(bad).is_err(), "{bad:?}");
        }
        assert!(serde_json::from_str::<Put>(r#"{"status": {"a": }}"#).is_err());
    }
}
