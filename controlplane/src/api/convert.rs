use crate::resources::{FieldError, Kind, Spec, StoredResource};

pub fn resource_to_proto(r: &StoredResource) -> proto::Resource {
    proto::Resource {
        kind: r.kind().to_string(),
        name: r.name.clone(),
        tenant: r.tenant.clone(),
        resource_version: r.resource_version,
        spec_json: r.spec.to_json(),
        status_json: if r.status.is_null() { String::new() } else { r.status.to_string() },
        create_revision: r.create_revision,
        mod_revision: r.mod_revision,
    }
}

pub fn parse_kind(field: &str, kind: &str) -> Result<Kind, FieldError> {
    if kind.is_empty() {
        return Err(FieldError::invalid(field, "required"));
    }
    kind.parse().map_err(|e: String| FieldError::invalid(field, e))
}

/// Decodes the kind and spec of a proto resource.
pub fn spec_from_proto(r: &proto::Resource) -> Result<Spec, FieldError> {
    let kind = parse_kind("kind", &r.kind)?;
    Spec::from_json(kind, &r.spec_json)
}
