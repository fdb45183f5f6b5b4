//! Manifest files for `gpuctl apply`: YAML (several documents separated by `---`), JSON
//! (one object or an array) or TOML (`[[resource]]` tables). Every resource is checked
//! on its own before anything is sent, and errors name the document and the field.
//!
//! A manifest is bounded before it is parsed (README, "gpuctl"): at most
//! [`MAX_MANIFEST_BYTES`] and [`MAX_MANIFEST_DOCUMENTS`], nested at most
//! [`MAX_MANIFEST_DEPTH`] levels (YAML's in one linear pass before the parser sees the
//! text, `yaml_depth`), and a NaN or an infinity (YAML's `.nan`, `.inf`; TOML's `nan`,
//! `inf`) is refused with its field, where converting it to JSON would make it a null.

mod yaml_depth;

use serde::{Deserialize, Serialize};

use crate::resources::{validate_name, validate_spec, FieldError, Kind, Spec};

/// The largest manifest text gpuctl reads (one file, or stdin).
pub const MAX_MANIFEST_BYTES: usize = 64 * 1024 * 1024;
/// The most documents (resources) one manifest text may hold.
pub const MAX_MANIFEST_DOCUMENTS: usize = 100_000;
/// How deep a manifest's collections may nest (a resource nests about 6 levels deep).
/// libyaml's tokeniser costs O(depth) a token: a 100,000-deep `[[[...]]]` took 20 s of CPU.
pub const MAX_MANIFEST_DEPTH: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
    Toml,
}

impl Format {
    /// From the file extension; anything unknown is read as YAML (a superset of JSON).
    pub fn from_path(path: &str) -> Format {
        let lower = path.to_ascii_lowercase();
        if lower.ends_with(".json") {
            Format::Json
        } else if lower.ends_with(".toml") {
            Format::Toml
        } else {
            Format::Yaml
        }
    }
}

/// One resource as written in a manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestResource {
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tenant: String,
    /// Compare-and-set: apply only if the stored resource is at this version (0 = any).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resource_version: u64,
    #[serde(default)]
    pub spec: serde_json::Value,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlFile {
    resource: Vec<ManifestResource>,
}

#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {location}{message}")]
pub struct ManifestError {
    pub source_name: String,
    /// e.g. "document 2: " or "" for file-level errors.
    pub location: String,
    pub message: String,
}

impl ManifestResource {
    /// Checks the resource on its own (name, kind, spec fields) and converts it.
    pub fn to_proto(&self) -> Result<proto::Resource, FieldError> {
        let kind: Kind = self.kind.parse().map_err(|e: String| FieldError::invalid("kind", e))?;
        validate_name("name", &self.name)?;
        let spec_json = self.spec.to_string();
        let spec = Spec::from_json(kind, if self.spec.is_null() { "{}" } else { &spec_json })?;
        validate_spec(&spec)?;
        Ok(proto::Resource {
            kind: kind.to_string(),
            name: self.name.clone(),
            tenant: self.tenant.clone(),
            resource_version: self.resource_version,
            spec_json: spec.to_json(),
            ..Default::default()
        })
    }
}

/// Parses and checks every resource of a manifest text.
pub fn parse(source_name: &str, text: &str, format: Format) -> Result<Vec<proto::Resource>, ManifestError> {
    let err = |location: String, message: String| ManifestError { source_name: source_name.to_string(), location, message };
    let document = |i: usize| format!("document {}: ", i + 1);
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(err(String::new(), format!("{} bytes; a manifest may have at most {MAX_MANIFEST_BYTES}", text.len())));
    }
    let too_many = |n: usize| format!("{n} documents; a manifest may have at most {MAX_MANIFEST_DOCUMENTS}");
    let too_deep = format!("nested more than {MAX_MANIFEST_DEPTH} levels deep (collections within collections)");
    let docs: Vec<ManifestResource> = match format {
        Format::Json => {
            let value: serde_json::Value = serde_json::from_str(text).map_err(|e| err(String::new(), format!("malformed JSON: {e}")))?;
            let items = match value {
                serde_json::Value::Array(items) => items,
                other => vec![other],
            };
            if items.len() > MAX_MANIFEST_DOCUMENTS {
                return Err(err(String::new(), too_many(items.len())));
            }
            if let Some(i) = items.iter().position(|v| json_depth(v) > MAX_MANIFEST_DEPTH) {
                return Err(err(document(i), too_deep));
            }
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| serde_path_to_error::deserialize(v).map_err(|e| err(document(i), field_message(e))))
                .collect::<Result<_, _>>()?
        }
        Format::Toml => {
            // Read as TOML values first: a `nan` or `inf` would become a null in the JSON
            // spec (which reads as "no quota" for a `max_gpus`).
            let table: toml::Table = toml::from_str(text).map_err(|e| err(String::new(), format!("malformed TOML: {}", e.message())))?;
            if let Some(toml::Value::Array(items)) = table.get("resource") {
                if items.len() > MAX_MANIFEST_DOCUMENTS {
                    return Err(err(String::new(), too_many(items.len())));
                }
                for (i, item) in items.iter().enumerate() {
                    if toml_depth(item) > MAX_MANIFEST_DEPTH {
                        return Err(err(document(i), too_deep));
                    }
                    if let Some((path, got)) = non_finite_toml(item, "") {
                        let named = |field: &str| item.get(field).and_then(toml::Value::as_str);
                        return Err(err(named_document(i, named("kind"), named("name")), not_finite(&path, got)));
                    }
                }
            }
            let file: TomlFile = toml::from_str(text).map_err(|e| err(String::new(), format!("malformed TOML: {}", e.message())))?;
            file.resource
        }
        Format::Yaml => {
            // Before the parser: its cost grows with the square of the depth.
            yaml_depth::check(text, MAX_MANIFEST_DEPTH, MAX_MANIFEST_DOCUMENTS).map_err(|refusal| match refusal {
                yaml_depth::Refusal::TooDeep { document, line } => err(format!("document {document}, line {line}: "), too_deep.clone()),
                yaml_depth::Refusal::TooManyDocuments { line } => err(
                    format!("line {line}: "),
                    format!("more than {MAX_MANIFEST_DOCUMENTS} documents; a manifest may have at most {MAX_MANIFEST_DOCUMENTS}"),
                ),
            })?;
            let mut out = Vec::new();
            for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
                let value = serde_yaml_ng::Value::deserialize(doc).map_err(|e| err(document(i), format!("malformed YAML: {e}")))?;
                if value.is_null() {
                    continue; // an empty document, e.g. a trailing `---`
                }
                // Converted to JSON a `.nan` or `.inf` would become a null.
                if let Some((path, got)) = non_finite_yaml(&value, "") {
                    let named = |field: &str| value.get(field).and_then(serde_yaml_ng::Value::as_str);
                    return Err(err(named_document(i, named("kind"), named("name")), not_finite(&path, got)));
                }
                let parsed: ManifestResource = serde_path_to_error::deserialize(value).map_err(|e| err(document(i), field_message(e)))?;
                out.push(parsed);
            }
            out
        }
    };
    if docs.is_empty() {
        return Err(err(String::new(), "no resources found".into()));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut resources = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let location = format!("document {} ({} {:?}): ", i + 1, doc.kind, doc.name);
        let resource = doc.to_proto().map_err(|e| err(location.clone(), e.to_string()))?;
        if !seen.insert((resource.kind.clone(), resource.name.clone())) {
            return Err(err(location, "name: duplicate resource in this file".into()));
        }
        resources.push(resource);
    }
    Ok(resources)
}

/// "document 2 (Tenant \"acme\"): ", or without the kind and name when they are not text.
fn named_document(i: usize, kind: Option<&str>, name: Option<&str>) -> String {
    match (kind, name) {
        (Some(kind), Some(name)) => format!("document {} ({kind} {name:?}): ", i + 1),
        _ => format!("document {}: ", i + 1),
    }
}

fn not_finite(path: &str, got: &str) -> String {
    format!("{path}: must be a finite number (got {got})")
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The first NaN or infinity in a YAML value: its path (`spec.max_gpus`) and how YAML
/// spells it. The depth is bounded before (`yaml_depth`), so the recursion is too.
fn non_finite_yaml(v: &serde_yaml_ng::Value, path: &str) -> Option<(String, &'static str)> {
    use serde_yaml_ng::Value;
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.is_nan() => Some((path.to_string(), ".nan")),
            Some(f) if f.is_infinite() => Some((path.to_string(), if f > 0.0 { ".inf" } else { "-.inf" })),
            _ => None,
        },
        Value::Sequence(items) => items.iter().enumerate().find_map(|(i, item)| non_finite_yaml(item, &format!("{path}[{i}]"))),
        Value::Mapping(m) => m.iter().find_map(|(k, v)| {
            let key = match k {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => "?".to_string(),
            };
            non_finite_yaml(k, &child(path, &key)).or_else(|| non_finite_yaml(v, &child(path, &key)))
        }),
        Value::Tagged(t) => non_finite_yaml(&t.value, path),
        _ => None,
    }
}

/// The first NaN or infinity in a TOML value, as [`non_finite_yaml`].
fn non_finite_toml(v: &toml::Value, path: &str) -> Option<(String, &'static str)> {
    match v {
        toml::Value::Float(f) if f.is_nan() => Some((path.to_string(), "nan")),
        toml::Value::Float(f) if f.is_infinite() => Some((path.to_string(), if *f > 0.0 { "inf" } else { "-inf" })),
        toml::Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| non_finite_toml(item, &format!("{path}[{i}]"))),
        toml::Value::Table(t) => t.iter().find_map(|(k, v)| non_finite_toml(v, &child(path, k))),
        _ => None,
    }
}

/// How deep a value's collections nest (the parsers bound it: serde_json at 128 levels,
/// toml at 80, so the recursion is bounded too).
fn json_depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(items) => 1 + items.iter().map(json_depth).max().unwrap_or(0),
        serde_json::Value::Object(m) => 1 + m.values().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn toml_depth(v: &toml::Value) -> usize {
    match v {
        toml::Value::Array(items) => 1 + items.iter().map(toml_depth).max().unwrap_or(0),
        toml::Value::Table(t) => 1 + t.values().map(toml_depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn field_message<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> String {
    let path = e.path().to_string();
    if path == "." {
        e.into_inner().to_string()
    } else {
        format!("{path}: {}", e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"
kind: Tenant
name: acme
spec: {display_name: Acme}
---
kind: Service
name: resnet
tenant: acme
spec:
  model: resnet50
  slo: {latency_ms: 50, request_rate: 200}
"#;

    #[test]
    fn yaml_json_and_toml_give_the_same_resources() {
        let from_yaml = parse("a.yaml", YAML, Format::Yaml).unwrap();
        assert_eq!(from_yaml.len(), 2);
        let json = r#"[{"kind":"Tenant","name":"acme","spec":{"display_name":"Acme"}},
            {"kind":"Service","name":"resnet","tenant":"acme","spec":{"model":"resnet50","slo":{"latency_ms":50,"request_rate":200}}}]"#;
        assert_eq!(parse("a.json", json, Format::Json).unwrap(), from_yaml);
        let toml = r#"
[[resource]]
kind = "Tenant"
name = "acme"
spec = { display_name = "Acme" }

[[resource]]
kind = "Service"
name = "resnet"
tenant = "acme"
[resource.spec]
model = "resnet50"
slo = { latency_ms = 50, request_rate = 200 }
"#;
        assert_eq!(parse("a.toml", toml, Format::Toml).unwrap(), from_yaml);
    }

    #[test]
    fn errors_name_document_and_field() {
        let bad = YAML.replace("request_rate: 200", "request_rate: -5");
        let e = parse("a.yaml", &bad, Format::Yaml).unwrap_err().to_string();
        assert!(
            e.contains("document 2 (Service \"resnet\")") && e.contains("spec.slo.request_rate: must be in [0.001, 10000000] (got -5)"),
            "{e}"
        );

        let unknown = YAML.replace("tenant: acme", "tenant: acme\nreplicas: 3");
        let e = parse("a.yaml", &unknown, Format::Yaml).unwrap_err().to_string();
        assert!(e.contains("document 2") && e.contains("unknown field `replicas`"), "{e}");

        let e = parse("a.yaml", "kind: [unclosed", Format::Yaml).unwrap_err().to_string();
        assert!(e.contains("malformed YAML"), "{e}");
        let e = parse("a.json", "{\"kind\": ", Format::Json).unwrap_err().to_string();
        assert!(e.contains("malformed JSON"), "{e}");
        let e = parse("a.yaml", "", Format::Yaml).unwrap_err().to_string();
        assert!(e.contains("no resources"), "{e}");

        let dup = format!("{YAML}\n---\nkind: Tenant\nname: acme\n");
        let e = parse("a.yaml", &dup, Format::Yaml).unwrap_err().to_string();
        assert!(e.contains("duplicate resource"), "{e}");
        let e = parse("a.yaml", "kind: Pod\nname: x\n", Format::Yaml).unwrap_err().to_string();
        assert!(e.contains("kind: unknown kind \"Pod\""), "{e}");
    }

    #[test]
    fn nan_and_infinities_are_refused_with_their_field_not_read_as_null() {
        // `.nan` became a JSON null: no quota at all for a `max_gpus`.
        for (got, spelled) in [(".nan", ".nan"), (".NaN", ".nan"), (".inf", ".inf"), ("-.Inf", "-.inf")] {
            let text = format!("kind: Tenant\nname: acme\nspec: {{max_gpus: {got}}}\n");
            let e = parse("t.yaml", &text, Format::Yaml).unwrap_err().to_string();
            assert_eq!(e, format!("t.yaml: document 1 (Tenant \"acme\"): spec.max_gpus: must be a finite number (got {spelled})"));
        }
        let nested = format!("{YAML}---\nkind: ModelProfile\nname: p\nspec:\n  points:\n    - {{gpcs: 3, latency_ms: 1}}\n    - {{gpcs: 7, latency_ms: .nan}}\n");
        let e = parse("a.yaml", &nested, Format::Yaml).unwrap_err().to_string();
        assert!(e.ends_with("document 3 (ModelProfile \"p\"): spec.points[1].latency_ms: must be a finite number (got .nan)"), "{e}");

        let toml = "[[resource]]\nkind = \"Tenant\"\nname = \"acme\"\nspec = { max_gpus = nan }\n";
        let e = parse("t.toml", toml, Format::Toml).unwrap_err().to_string();
        assert_eq!(e, "t.toml: document 1 (Tenant \"acme\"): spec.max_gpus: must be a finite number (got nan)");
        let e = parse("t.toml", &toml.replace("nan", "-inf"), Format::Toml).unwrap_err().to_string();
        assert!(e.ends_with("spec.max_gpus: must be a finite number (got -inf)"), "{e}");

        // JSON has no NaN or infinity: its parser refuses them, and a number too large.
        for number in ["NaN", "Infinity", "1e999"] {
            let json = format!("{{\"kind\": \"Tenant\", \"name\": \"acme\", \"spec\": {{\"max_gpus\": {number}}}}}");
            let e = parse("t.json", &json, Format::Json).unwrap_err().to_string();
            assert!(e.starts_with("t.json: malformed JSON: ") && e.contains("column"), "{number}: {e}");
        }
        // A finite quota still reads as one.
        let ok = parse("t.yaml", "kind: Tenant\nname: acme\nspec: {max_gpus: 8.5}\n", Format::Yaml).unwrap();
        assert!(ok[0].spec_json.contains("\"max_gpus\":8.5"), "{}", ok[0].spec_json);
    }

    #[test]
    fn deep_manifests_are_refused_before_parsing_with_document_and_line() {
        let n = 100_000;
        let deep = [
            format!("kind: Tenant\nname: a\nspec: {}\n", "[".repeat(n)),
            format!("kind: Tenant\nname: a\nspec: {}\n", "{a: ".repeat(n)),
            format!("kind: Tenant\nname: a\nspec:\n{}x\n", "- ".repeat(n)),
        ];
        for text in &deep {
            let e = parse("deep.yaml", text, Format::Yaml).unwrap_err().to_string();
            assert!(
                e.starts_with("deep.yaml: document 1, line 3: nested more than 64 levels deep")
                    || e.starts_with("deep.yaml: document 1, line 4: nested more than 64 levels deep"),
                "{e}"
            );
            // The pre-pass's refusal, before libyaml (20-24 s on each, quadratic in the depth).
        }
        // Block nesting by indentation, in a second document.
        let indented: String = (0..70).map(|i| format!("{}a:\n", "  ".repeat(i))).collect();
        let e = parse("deep.yaml", &format!("{YAML}---\n{indented}"), Format::Yaml).unwrap_err().to_string();
        let line = YAML.lines().count() + 1 + MAX_MANIFEST_DEPTH + 1;
        assert!(e.starts_with(&format!("deep.yaml: document 3, line {line}: nested more than 64 levels")), "{e}");

        // JSON and TOML: their parsers stop at 128 and 80 levels; past 64 is refused too.
        let json = format!("{{\"kind\": \"Tenant\", \"name\": \"a\", \"spec\": {{\"x\": {}{}}}}}", "[".repeat(70), "]".repeat(70));
        let e = parse("d.json", &json, Format::Json).unwrap_err().to_string();
        assert_eq!(e, "d.json: document 1: nested more than 64 levels deep (collections within collections)");
        let e = parse("d.json", &"[".repeat(n), Format::Json).unwrap_err().to_string();
        assert!(e.contains("recursion limit exceeded"), "{e}");
        let toml = format!("[[resource]]\nkind = \"Tenant\"\nname = \"a\"\nspec = {{ x = {}{} }}\n", "[".repeat(70), "]".repeat(70));
        let e = parse("d.toml", &toml, Format::Toml).unwrap_err().to_string();
        assert_eq!(e, "d.toml: document 1: nested more than 64 levels deep (collections within collections)");

        // At the bound a manifest parses (and is then checked as usual).
        let at_bound = format!("kind: Tenant\nname: a\nx: {}{}\n", "[".repeat(63), "]".repeat(63));
        let e = parse("ok.yaml", &at_bound, Format::Yaml).unwrap_err().to_string();
        assert!(e.starts_with("ok.yaml: document 1: x: unknown field `x`"), "{e}");
    }

    #[test]
    fn a_manifest_is_bounded_in_bytes_and_documents() {
        let big = "#".repeat(MAX_MANIFEST_BYTES + 1);
        for format in [Format::Yaml, Format::Json, Format::Toml] {
            let e = parse("big", &big, format).unwrap_err().to_string();
            assert_eq!(e, format!("big: {} bytes; a manifest may have at most {MAX_MANIFEST_BYTES}", big.len()));
        }
        let many = "---\nkind: Tenant\n".repeat(MAX_MANIFEST_DOCUMENTS + 1);
        let e = parse("many.yaml", &many, Format::Yaml).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "many.yaml: line {}: more than {MAX_MANIFEST_DOCUMENTS} documents; a manifest may have at most {MAX_MANIFEST_DOCUMENTS}",
                2 * MAX_MANIFEST_DOCUMENTS + 1
            )
        );
        let many = format!("[{}{{}}]", "{},".repeat(MAX_MANIFEST_DOCUMENTS));
        let e = parse("many.json", &many, Format::Json).unwrap_err().to_string();
        assert_eq!(e, format!("many.json: {} documents; a manifest may have at most {MAX_MANIFEST_DOCUMENTS}", MAX_MANIFEST_DOCUMENTS + 1));
    }

    #[test]
    fn the_shipped_manifests_pass_the_bounds() {
        let sample = include_str!("../../deploy/examples/sample-cluster.yaml");
        assert!(parse("sample-cluster.yaml", sample, Format::Yaml).unwrap().len() > 10);
    }
}
