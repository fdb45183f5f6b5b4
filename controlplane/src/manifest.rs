//! Manifest files for `gpuctl apply`: YAML (several documents separated by `---`), JSON
//! (one object or an array) or TOML (`[[resource]]` tables). Every resource is checked
//! on its own before anything is sent, and errors name the document and the field.

use serde::{Deserialize, Serialize};

use crate::resources::{validate_name, validate_spec, FieldError, Kind, Spec};

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
    let docs: Vec<ManifestResource> = match format {
        Format::Json => {
            let value: serde_json::Value = serde_json::from_str(text).map_err(|e| err(String::new(), format!("malformed JSON: {e}")))?;
            let items = match value {
                serde_json::Value::Array(items) => items,
                other => vec![other],
            };
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| serde_path_to_error::deserialize(v).map_err(|e| err(format!("document {}: ", i + 1), field_message(e))))
                .collect::<Result<_, _>>()?
        }
        Format::Toml => {
            let file: TomlFile = toml::from_str(text).map_err(|e| err(String::new(), format!("malformed TOML: {}", e.message())))?;
            file.resource
        }
        Format::Yaml => {
            let mut out = Vec::new();
            for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
                let value = serde_yaml_ng::Value::deserialize(doc)
                    .map_err(|e| err(format!("document {}: ", i + 1), format!("malformed YAML: {e}")))?;
                if value.is_null() {
                    continue; // an empty document, e.g. a trailing `---`
                }
                let parsed: ManifestResource =
                    serde_path_to_error::deserialize(value).map_err(|e| err(format!("document {}: ", i + 1), field_message(e)))?;
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
        assert!(e.contains("document 2 (Service \"resnet\")") && e.contains("spec.slo.request_rate: must be > 0"), "{e}");

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
}
