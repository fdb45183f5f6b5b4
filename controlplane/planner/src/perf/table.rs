//! ParvaGPU-style profile tables: (MIG size in GPCs, batch size, MPS processes) ->
//! (throughput per process, latency), parsed from CSV *text* (the caller reads the file).
//!
//! Format (ParvaGPU's profiler output): header `Mig instance,Batch size,Workload Number,
//! Throughput,Latency`; throughput is per process in req/s (a segment serves
//! `throughput * processes`), latency is in seconds, and `0,0` marks an infeasible point
//! (out of memory), which is kept out of the table.

use serde::{Deserialize, Serialize};

/// The header every profile CSV must start with.
pub const CSV_HEADER: [&str; 5] = ["Mig instance", "Batch size", "Workload Number", "Throughput", "Latency"];

/// One feasible profiled point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProfilePoint {
    /// MIG instance size in GPCs (1, 2, 3, 4 or 7).
    pub gpcs: u8,
    pub batch: u32,
    /// MPS processes of the same model inside the instance.
    pub processes: u32,
    /// Throughput of one process, req/s.
    pub throughput_per_process: f64,
    /// Latency of one batch, seconds.
    pub latency_s: f64,
}

impl ProfilePoint {
    /// Throughput of the whole segment (all processes), req/s.
    pub fn segment_throughput(&self) -> f64 {
        self.throughput_per_process * f64::from(self.processes)
    }
}

/// A model's profile table on one GPU model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfileTable {
    pub points: Vec<ProfilePoint>,
    /// How many `0,0` (infeasible) rows the source had; kept so a caller can report them.
    pub infeasible_rows: usize,
}

/// A malformed CSV row, naming the 1-based line and column.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}, column {column} ({column_name}): {message}")]
pub struct CsvError {
    pub line: usize,
    pub column: usize,
    pub column_name: String,
    pub message: String,
}

impl ProfileTable {
    /// Parses CSV text. Every malformed row is an error naming its line and column; blank
    /// lines are skipped.
    pub fn parse_csv(text: &str) -> Result<Self, CsvError> {
        let mut lines = text.lines().enumerate();
        let err = |line: usize, column: usize, message: String| CsvError {
            line,
            column,
            column_name: CSV_HEADER.get(column.wrapping_sub(1)).map_or_else(|| "-".to_string(), |s| s.to_string()),
            message,
        };
        let (_, header) = lines.find(|(_, l)| !l.trim().is_empty()).ok_or_else(|| err(1, 1, "empty input, expected a header".into()))?;
        let cols: Vec<&str> = header.split(',').map(str::trim).collect();
        for (i, want) in CSV_HEADER.iter().enumerate() {
            let got = cols.get(i).copied().unwrap_or("");
            if !got.trim_start_matches('\u{feff}').eq_ignore_ascii_case(want) {
                return Err(err(1, i + 1, format!("expected header `{want}`, found `{got}`")));
            }
        }
        let mut table = ProfileTable::default();
        for (idx, raw) in lines {
            let line = idx + 1;
            if raw.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = raw.split(',').map(str::trim).collect();
            if fields.len() != CSV_HEADER.len() {
                return Err(err(
                    line,
                    fields.len().min(CSV_HEADER.len()) + 1,
                    format!("expected {} fields, found {}", CSV_HEADER.len(), fields.len()),
                ));
            }
            let int = |c: usize| -> Result<u32, CsvError> {
                fields[c].parse::<u32>().map_err(|_| err(line, c + 1, format!("`{}` is not a non-negative integer", fields[c])))
            };
            let num = |c: usize| -> Result<f64, CsvError> {
                match fields[c].parse::<f64>() {
                    Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                    _ => Err(err(line, c + 1, format!("`{}` is not a finite non-negative number", fields[c]))),
                }
            };
            let gpcs = int(0)?;
            if !matches!(gpcs, 1 | 2 | 3 | 4 | 7) {
                return Err(err(line, 1, format!("MIG size {gpcs} is not one of 1, 2, 3, 4, 7")));
            }
            let batch = int(1)?;
            if batch == 0 {
                return Err(err(line, 2, "batch size must be at least 1".into()));
            }
            let processes = int(2)?;
            if processes == 0 {
                return Err(err(line, 3, "process count must be at least 1".into()));
            }
            let tp = num(3)?;
            let lat = num(4)?;
            match (tp == 0.0, lat == 0.0) {
                (true, true) => table.infeasible_rows += 1,
                (true, false) => return Err(err(line, 4, "throughput is 0 but latency is not (`0,0` marks infeasible)".into())),
                (false, true) => return Err(err(line, 5, "latency is 0 but throughput is not (`0,0` marks infeasible)".into())),
                (false, false) => {
                    table.points.push(ProfilePoint { gpcs: gpcs as u8, batch, processes, throughput_per_process: tp, latency_s: lat })
                }
            }
        }
        Ok(table)
    }

    /// Writes the table back as CSV (feasible points only).
    pub fn to_csv(&self) -> String {
        let mut s = CSV_HEADER.join(",");
        s.push('\n');
        for p in &self.points {
            s.push_str(&format!("{},{},{},{},{}\n", p.gpcs, p.batch, p.processes, p.throughput_per_process, p.latency_s));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "Mig instance,Batch size,Workload Number,Throughput,Latency\n\
        1,1,1,100.5,0.004\n1,2,2,80,0.01\n7,64,1,0,0\n\n2,8,3,50.25,0.02\n";

    #[test]
    fn parses_and_skips_infeasible_rows() {
        let t = ProfileTable::parse_csv(GOOD).unwrap();
        assert_eq!(t.points.len(), 3);
        assert_eq!(t.infeasible_rows, 1);
        assert_eq!(t.points[1].segment_throughput(), 160.0);
        assert_eq!(t.points[2].gpcs, 2);
        let again = ProfileTable::parse_csv(&t.to_csv()).unwrap();
        assert_eq!(again.points, t.points);
    }

    #[test]
    fn errors_name_line_and_column() {
        let bad = |body: &str| {
            ProfileTable::parse_csv(&format!("Mig instance,Batch size,Workload Number,Throughput,Latency\n{body}")).unwrap_err()
        };
        let e = bad("1,1,1,100,0.1\n5,1,1,100,0.1\n");
        assert_eq!((e.line, e.column, e.column_name.as_str()), (3, 1, "Mig instance"));
        let e = bad("1,x,1,100,0.1\n");
        assert_eq!((e.line, e.column), (2, 2));
        let e = bad("1,1,1,abc,0.1\n");
        assert_eq!((e.line, e.column, e.column_name.as_str()), (2, 4, "Throughput"));
        let e = bad("1,1,1,100\n");
        assert_eq!((e.line, e.column), (2, 5));
        assert!(e.message.contains("expected 5 fields"));
        let e = bad("1,1,1,0,0.5\n");
        assert_eq!((e.line, e.column), (2, 4));
        let e = bad("1,1,0,1,0.5\n");
        assert_eq!((e.line, e.column), (2, 3));
        let e = bad("1,1,1,1,-0.5\n");
        assert_eq!((e.line, e.column, e.column_name.as_str()), (2, 5, "Latency"));
        let e = ProfileTable::parse_csv("gpcs,batch\n").unwrap_err();
        assert_eq!((e.line, e.column), (1, 1));
        assert!(e.to_string().starts_with("line 1, column 1 (Mig instance)"));
    }
}
