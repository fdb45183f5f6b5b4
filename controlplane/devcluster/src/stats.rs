//! Figures the benchmarks and the chaos runner print from what they measured.

/// The `p`-th percentile (0-100) of `values`, nearest rank; `None` when there are none.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    Some(v[rank.min(v.len() - 1)])
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_nearest_rank_of_the_sorted_values() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!((percentile(&v, 0.0), percentile(&v, 50.0), percentile(&v, 100.0)), (Some(1.0), Some(3.0), Some(5.0)));
        assert_eq!(percentile(&v, 99.0), Some(5.0));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
