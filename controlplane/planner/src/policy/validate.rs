//! Input checks shared by the runtime policies ([`super::elsa`], [`super::gslice`],
//! [`super::fair_share`]): each refusal names the field and the reason, so a
//! caller can fix the input without reading the policy's code.

/// A refused input value: which field (with its index path, e.g. `partitions[2].gpcs`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {reason}")]
pub struct InvalidField {
    pub field: String,
    pub reason: String,
}

impl InvalidField {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidField { field: field.into(), reason: reason.into() }
    }
}

/// `v` must be a finite number (any sign): timestamps.
pub(crate) fn finite(field: &str, v: f64) -> Result<f64, InvalidField> {
    if v.is_nan() {
        Err(InvalidField::new(field, "is NaN"))
    } else if !v.is_finite() {
        Err(InvalidField::new(field, format!("must be finite, got {v}")))
    } else {
        Ok(v)
    }
}

/// `v` must be finite and `>= 0`.
pub(crate) fn non_negative(field: &str, v: f64) -> Result<f64, InvalidField> {
    finite(field, v)?;
    if v < 0.0 {
        Err(InvalidField::new(field, format!("must be >= 0, got {v}")))
    } else {
        Ok(v)
    }
}

/// `v` must be finite and `> 0`.
pub(crate) fn positive(field: &str, v: f64) -> Result<f64, InvalidField> {
    finite(field, v)?;
    if v <= 0.0 {
        Err(InvalidField::new(field, format!("must be > 0, got {v}")))
    } else {
        Ok(v)
    }
}

/// `v` must be `>= 1` (batch sizes, GPC counts, streak lengths).
pub(crate) fn at_least_one(field: &str, v: u32) -> Result<u32, InvalidField> {
    if v == 0 {
        Err(InvalidField::new(field, "must be >= 1, got 0"))
    } else {
        Ok(v)
    }
}

/// `v` must be finite and within `[lo, hi]`.
pub(crate) fn in_range(field: &str, v: f64, lo: f64, hi: f64) -> Result<f64, InvalidField> {
    finite(field, v)?;
    if v < lo || v > hi {
        Err(InvalidField::new(field, format!("must be in [{lo}, {hi}], got {v}")))
    } else {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_names_the_field_and_the_reason() {
        assert_eq!(finite("a", f64::NAN).unwrap_err(), InvalidField::new("a", "is NaN"));
        assert_eq!(positive("b", 0.0).unwrap_err().to_string(), "invalid `b`: must be > 0, got 0");
        assert_eq!(non_negative("c", -1.0).unwrap_err().reason, "must be >= 0, got -1");
        assert_eq!(non_negative("c", f64::INFINITY).unwrap_err().reason, "must be finite, got inf");
        assert_eq!(at_least_one("d", 0).unwrap_err().field, "d");
        assert_eq!(in_range("e", 101.0, 0.0, 100.0).unwrap_err().reason, "must be in [0, 100], got 101");
        assert_eq!(in_range("e", 100.0, 0.0, 100.0), Ok(100.0));
        assert_eq!(positive("f", 2.5), Ok(2.5));
    }
}
