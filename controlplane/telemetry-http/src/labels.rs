//! Label sets for prometheus-client's families, with values escaped as the text exposition
//! format requires. prometheus-client 0.24 writes label values verbatim, so a value holding
//! `"` or a newline (a service name an agent reported, say) could close the label and
//! forge other series; every label value of the controllers and agents goes through here.

use std::fmt::Write;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// A label value, escaped (`\\`, `\"`, `\n`) when encoded.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelValue(pub String);

impl EncodeLabelValue for LabelValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// The label set of one series.
pub type Labels = Vec<(String, LabelValue)>;

/// `[("service", "web")]` as a label set.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), LabelValue(v.to_string()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::registry::Registry;

    #[test]
    fn a_hostile_label_value_cannot_forge_a_series() {
        let mut registry = Registry::default();
        let family: Family<Labels, Counter> = Family::default();
        registry.register("requests", "Requests", family.clone());
        family.get_or_create(&labels(&[("service", "x\"} 1\nrequests_total{service=\"victim\\")])).inc();
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        let series: Vec<&str> = out.lines().filter(|l| l.starts_with("requests_total")).collect();
        assert_eq!(series, [r#"requests_total{service="x\"} 1\nrequests_total{service=\"victim\\"} 1"#], "{out}");
    }
}
