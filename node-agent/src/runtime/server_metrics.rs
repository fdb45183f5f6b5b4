//! The inference servers' own counters, read from their Prometheus `/metrics` page (Triton's
//! `nv_inference_*`, MLServer's `model_infer_*`), so that the SLO signal carries what a
//! server did (successes, failures, time queued and computing inside it) beside the router's
//! latency windows in front of it. `parse` sums one model's series from one page; `window`
//! turns two cumulative readings into rates and means.
//!
//! A server's page is untrusted input. A page over [`MAX_METRICS_BYTES`] or with more than
//! [`MAX_METRICS_LINES`] lines is refused before anything is read; a sample of a known series
//! of the model that is malformed, not finite or negative fails the page with its line
//! number, so the caller counts a bad page and believes none of it. Nothing is allocated but an
//! error, and no input panics.
//!
//! Hand-written rather than a Prometheus parser crate: only five series of one model are read
//! from a bounded page, and a general parser would allocate every series of an untrusted page
//! (names, label sets) only to throw nearly all of them away. Here a line of another series is
//! skipped on its name and not read further, and the `model` label's value is compared with
//! the model's name as it is unescaped, in place.

/// Upper bound on a metrics page the agent reads (the fetcher stops reading past it).
pub const MAX_METRICS_BYTES: usize = 1 << 20;
/// At most this many lines are looked at.
pub const MAX_METRICS_LINES: usize = 50_000;

/// Cumulative counters one server exports for one model (since the server started).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ServerCounters {
    /// Requests that succeeded.
    pub success: f64,
    /// Requests that failed (all reasons summed).
    pub failure: f64,
    /// Total request time, µs (end to end inside the server). Triton times successful
    /// requests only; MLServer's summary times failed ones too (its `_count` is successes
    /// plus failures), so a mean over successes is high there while requests fail.
    pub request_us: f64,
    /// Total queueing time, µs (0 when the server does not export it).
    pub queue_us: f64,
    /// Total compute (infer) time, µs (0 when not exported).
    pub compute_us: f64,
}

/// Why a metrics page was not believed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics page of {bytes} bytes, over the {max} the agent reads", max = MAX_METRICS_BYTES)]
    TooLarge { bytes: usize },
    #[error("metrics page of more than {max} lines", max = MAX_METRICS_LINES)]
    TooManyLines,
    /// A line of a known series that does not parse: its label block (then whose it is is
    /// unknown), or, for the model's own, its value or timestamp.
    #[error("metrics line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    /// None of the known series for this model. MLServer exports a model's series only once
    /// it has been asked to infer, so a fresh MLServer answers this.
    #[error("metrics page has none of the known series for model {model:?}")]
    NoSeries { model: String },
    /// The model's value (or its sum so far) is NaN or infinite.
    #[error("metrics line {line}: value is not finite")]
    NotFinite { line: usize },
    /// The model's value is negative (its series are all counters).
    #[error("metrics line {line}: counter is negative")]
    Negative { line: usize },
}

/// Parses a Prometheus text-format page and sums the known series of `model`: over its
/// versions (MLServer's `version` label is `""` over gRPC and `"None"` over REST, two series
/// for one model) and over Triton's failure reasons.
pub fn parse(text: &str, model: &str) -> Result<ServerCounters, MetricsError> {
    if text.len() > MAX_METRICS_BYTES {
        return Err(MetricsError::TooLarge { bytes: text.len() });
    }
    if text.lines().nth(MAX_METRICS_LINES).is_some() {
        return Err(MetricsError::TooManyLines);
    }
    let mut counters = ServerCounters::default();
    let mut seen = false;
    for (index, line) in text.lines().enumerate() {
        let at = index + 1;
        let Some((field, value)) = sample(line.as_bytes(), model.as_bytes()).map_err(|bad| bad.at(at))? else { continue };
        seen = true;
        if let Some(sum) = counters.slot(field) {
            *sum += value;
            if !sum.is_finite() {
                return Err(MetricsError::NotFinite { line: at });
            }
        }
    }
    if seen {
        Ok(counters)
    } else {
        Err(MetricsError::NoSeries { model: model.to_owned() })
    }
}

/// What one server did between two reads (the window), from two cumulative readings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerWindow {
    pub success_rps: f64,
    pub failure_rps: f64,
    /// Means per successful request in the window, ms.
    pub mean_request_ms: f64,
    pub mean_queue_ms: f64,
    pub mean_compute_ms: f64,
}

/// `None` when a counter went down (the server restarted: the window is unknown, not
/// negative) or `seconds` <= 0 (or a result is not finite); means are 0 when no request
/// succeeded in the window. A restart whose counters have passed the old ones again by the
/// second read is not seen: that window undercounts.
pub fn window(before: &ServerCounters, after: &ServerCounters, seconds: f64) -> Option<ServerWindow> {
    if !seconds.is_finite() || seconds <= 0.0 {
        return None;
    }
    let success = grown(before.success, after.success)?;
    let failure = grown(before.failure, after.failure)?;
    let request_us = grown(before.request_us, after.request_us)?;
    let queue_us = grown(before.queue_us, after.queue_us)?;
    let compute_us = grown(before.compute_us, after.compute_us)?;
    let mean_ms = |total_us: f64| if success > 0.0 { total_us / success / 1000.0 } else { 0.0 };
    let w = ServerWindow {
        success_rps: success / seconds,
        failure_rps: failure / seconds,
        mean_request_ms: mean_ms(request_us),
        mean_queue_ms: mean_ms(queue_us),
        mean_compute_ms: mean_ms(compute_us),
    };
    let all = [w.success_rps, w.failure_rps, w.mean_request_ms, w.mean_queue_ms, w.mean_compute_ms];
    all.iter().all(|v| v.is_finite()).then_some(w)
}

/// How much a cumulative counter grew; `None` when it went down (or is not a number).
fn grown(before: f64, after: f64) -> Option<f64> {
    let by = after - before;
    (by >= 0.0).then_some(by)
}

/// Where a known series' samples go.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Success,
    Failure,
    Request,
    Queue,
    Compute,
    /// Validated like the others, summed nowhere (MLServer's `_count`).
    Checked,
}

impl ServerCounters {
    fn slot(&mut self, field: Field) -> Option<&mut f64> {
        match field {
            Field::Success => Some(&mut self.success),
            Field::Failure => Some(&mut self.failure),
            Field::Request => Some(&mut self.request_us),
            Field::Queue => Some(&mut self.queue_us),
            Field::Compute => Some(&mut self.compute_us),
            Field::Checked => None,
        }
    }
}

/// The known series by exact name: where they go and the factor to the field's unit. Every
/// other name (`_created`, `_bucket`, `nv_cpu_*`, …) is another series.
fn series(name: &[u8]) -> Option<(Field, f64)> {
    Some(match name {
        b"nv_inference_request_success" | b"model_infer_request_success_total" => (Field::Success, 1.0),
        b"nv_inference_request_failure" | b"model_infer_request_failure_total" => (Field::Failure, 1.0),
        b"nv_inference_request_duration_us" => (Field::Request, 1.0),
        b"nv_inference_queue_duration_us" => (Field::Queue, 1.0),
        b"nv_inference_compute_infer_duration_us" => (Field::Compute, 1.0),
        // Seconds.
        b"model_infer_request_duration_sum" => (Field::Request, 1e6),
        b"model_infer_request_duration_count" => (Field::Checked, 1.0),
        _ => return None,
    })
}

/// Why one line was not believed (the line number is added by `parse`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bad {
    Malformed(&'static str),
    NotFinite,
    Negative,
}

impl Bad {
    fn at(self, line: usize) -> MetricsError {
        match self {
            Bad::Malformed(reason) => MetricsError::Malformed { line, reason: reason.to_owned() },
            Bad::NotFinite => MetricsError::NotFinite { line },
            Bad::Negative => MetricsError::Negative { line },
        }
    }
}

/// One line: a sample of a known series of `model` (where it goes, its value in the field's
/// unit), or `None` for a comment, a blank line, another series or another model.
fn sample(line: &[u8], model: &[u8]) -> Result<Option<(Field, f64)>, Bad> {
    let line = blanks(line);
    if line.first().is_none_or(|&b| b == b'#') {
        return Ok(None);
    }
    let name_len = line.iter().position(|&b| b == b'{' || is_blank(b)).unwrap_or(line.len());
    let (name, rest) = line.split_at(name_len);
    let Some((field, scale)) = series(name) else { return Ok(None) };
    let rest = blanks(rest);
    let Some(inner) = rest.strip_prefix(b"{") else {
        // No labels, so no `model` label: not any one model's.
        return Ok(None);
    };
    let (ours, rest) = labels(inner, model).map_err(Bad::Malformed)?;
    if !ours {
        return Ok(None);
    }
    let value = value(rest)? * scale;
    if !value.is_finite() {
        return Err(Bad::NotFinite);
    }
    Ok(Some((field, value)))
}

/// Reads a label block from just after its `{`: whether its `model` label is `model`, and
/// what follows the `}`. Blanks may surround names, `=` and values; a trailing `,` is fine.
fn labels<'a>(inner: &'a [u8], model: &[u8]) -> Result<(bool, &'a [u8]), &'static str> {
    let mut rest = inner;
    let mut ours = None;
    loop {
        rest = blanks(rest);
        if let Some(after) = rest.strip_prefix(b"}") {
            return Ok((ours == Some(true), after));
        }
        let name_len = rest.iter().position(|&b| !is_label_byte(b)).unwrap_or(rest.len());
        let (name, after_name) = rest.split_at(name_len);
        if name.first().is_none_or(u8::is_ascii_digit) {
            return Err("expected a label name");
        }
        let quoted = blanks(after_name).strip_prefix(b"=").ok_or("expected '=' after a label name")?;
        let (same, after_value) = label_value(blanks(quoted), model)?;
        if name == b"model" {
            if ours.is_some() {
                return Err("two model labels");
            }
            ours = Some(same);
        }
        rest = blanks(after_value);
        match rest.split_first() {
            Some((&b',', after)) => rest = after,
            Some((&b'}', _)) => {}
            _ => return Err("expected ',' or '}' after a label value"),
        }
    }
}

/// Reads a double-quoted label value (escapes `\"`, `\\`, `\n`) from its opening quote,
/// comparing it unescaped with `want` as it goes, without a copy: whether they are equal, and
/// what follows the closing quote.
fn label_value<'a>(quoted: &'a [u8], want: &[u8]) -> Result<(bool, &'a [u8]), &'static str> {
    let body = quoted.strip_prefix(b"\"").ok_or("expected '\"' to open a label value")?;
    // `at` walks the escaped value, `seen` counts the unescaped bytes.
    let (mut at, mut seen, mut same) = (0, 0, true);
    while let Some(&escaped) = body.get(at) {
        let byte = match escaped {
            b'"' => return Ok((same && seen == want.len(), &body[at + 1..])),
            b'\\' => {
                at += 1;
                match body.get(at) {
                    Some(&b'\\') => b'\\',
                    Some(&b'"') => b'"',
                    Some(&b'n') => b'\n',
                    Some(_) => return Err("unknown escape in a label value"),
                    None => break,
                }
            }
            plain => plain,
        };
        same = same && want.get(seen) == Some(&byte);
        seen += 1;
        at += 1;
    }
    Err("unterminated label value")
}

/// The value after the label block, checked (a finite, non-negative number), then an
/// optional timestamp and nothing else.
fn value(rest: &[u8]) -> Result<f64, Bad> {
    let (number, rest) = split_token(blanks(rest));
    let (stamp, rest) = split_token(blanks(rest));
    if number.is_empty() {
        return Err(Bad::Malformed("no value"));
    }
    let value = float(number).ok_or(Bad::Malformed("the value is not a number"))?;
    if !value.is_finite() {
        return Err(Bad::NotFinite);
    }
    if value < 0.0 {
        return Err(Bad::Negative);
    }
    if !stamp.is_empty() && float(stamp).is_none_or(|t| !t.is_finite()) {
        return Err(Bad::Malformed("the timestamp is not a number"));
    }
    if !blanks(rest).is_empty() {
        return Err(Bad::Malformed("text after the timestamp"));
    }
    Ok(value)
}

/// A number as Prometheus writes one (`NaN`, `+Inf` included, checked by the caller).
fn float(token: &[u8]) -> Option<f64> {
    std::str::from_utf8(token).ok()?.parse().ok()
}

fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t')
}

fn is_label_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `s` without its leading blanks.
fn blanks(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| is_blank(b)).count();
    &s[n..]
}

/// The leading run of non-blanks of `s`, and the rest.
fn split_token(s: &[u8]) -> (&[u8], &[u8]) {
    let n = s.iter().position(|&b| is_blank(b)).unwrap_or(s.len());
    s.split_at(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Modeled on Triton 2.51's page: two models, `double` at two versions, four failure
    /// reasons, series this module does not read, CPU and pinned-memory gauges.
    const TRITON: &str = r#"# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="add_sub",version="1"} 40
nv_inference_request_success{model="double",version="1"} 5
nv_inference_request_success{model="double",version="2"} 2
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="add_sub",reason="OTHER",version="1"} 9
nv_inference_request_failure{model="double",reason="REJECTED",version="1"} 1
nv_inference_request_failure{model="double",reason="CANCELED",version="1"} 0
nv_inference_request_failure{model="double",reason="BACKEND",version="1"} 2
nv_inference_request_failure{model="double",reason="OTHER",version="1"} 3
nv_inference_request_failure{model="double",reason="OTHER",version="2"} 1
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="add_sub",version="1"} 40
nv_inference_count{model="double",version="1"} 5
# HELP nv_inference_exec_count Number of model executions performed (does not include cached requests)
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="double",version="1"} 5
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="double",version="1"} 0
# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds (includes cached requests)
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{model="add_sub",version="1"} 999999
nv_inference_request_duration_us{model="double",version="1"} 12000
nv_inference_request_duration_us{model="double",version="2"} 3000
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds (includes cached requests)
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="add_sub",version="1"} 77777
nv_inference_queue_duration_us{model="double",version="1"} 400
nv_inference_queue_duration_us{model="double",version="2"} 100
# HELP nv_inference_compute_input_duration_us Cumulative compute input duration in microseconds (does not include cached requests)
# TYPE nv_inference_compute_input_duration_us counter
nv_inference_compute_input_duration_us{model="double",version="1"} 700
# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds (does not include cached requests)
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="add_sub",version="1"} 55555
nv_inference_compute_infer_duration_us{model="double",version="1"} 9000
nv_inference_compute_infer_duration_us{model="double",version="2"} 2000
# HELP nv_inference_compute_output_duration_us Cumulative inference compute output duration in microseconds
# TYPE nv_inference_compute_output_duration_us counter
nv_inference_compute_output_duration_us{model="double",version="1"} 600
# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.25
# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes
# TYPE nv_cpu_memory_total_bytes gauge
nv_cpu_memory_total_bytes 16471719936
# HELP nv_pinned_memory_pool_total_bytes Pinned memory pool total memory size, in bytes
# TYPE nv_pinned_memory_pool_total_bytes gauge
nv_pinned_memory_pool_total_bytes 268435456
"#;

    /// Modeled on MLServer's (prometheus_client) page: `lin` asked over gRPC (`version=""`)
    /// and REST (`version="None"`), another model, `_created` series, the REST server's own
    /// series (a label value with braces in it).
    const MLSERVER: &str = r#"# HELP model_infer_request_success_total Model infer request success count
# TYPE model_infer_request_success_total counter
model_infer_request_success_total{model="lin",version=""} 3.0
model_infer_request_success_total{model="lin",version="None"} 2.0
model_infer_request_success_total{model="other",version="None"} 50.0
# HELP model_infer_request_success_created Model infer request success count
# TYPE model_infer_request_success_created gauge
model_infer_request_success_created{model="lin",version=""} 1.7301234567891e+09
model_infer_request_success_created{model="lin",version="None"} 1.7301234598765e+09
# HELP model_infer_request_failure_total Model infer request failure count
# TYPE model_infer_request_failure_total counter
model_infer_request_failure_total{model="lin",version=""} 1.0
model_infer_request_failure_total{model="lin",version="None"} 0.0
model_infer_request_failure_total{model="other",version="None"} 4.0
# HELP model_infer_request_failure_created Model infer request failure count
# TYPE model_infer_request_failure_created gauge
model_infer_request_failure_created{model="lin",version=""} 1.7301234567891e+09
# HELP model_infer_request_duration Model infer request duration
# TYPE model_infer_request_duration summary
model_infer_request_duration_count{model="lin",version=""} 4.0
model_infer_request_duration_sum{model="lin",version=""} 0.25
model_infer_request_duration_count{model="lin",version="None"} 2.0
model_infer_request_duration_sum{model="lin",version="None"} 0.125
model_infer_request_duration_count{model="other",version="None"} 54.0
model_infer_request_duration_sum{model="other",version="None"} 9.5
# HELP model_infer_request_duration_created Model infer request duration
# TYPE model_infer_request_duration_created gauge
model_infer_request_duration_created{model="lin",version=""} 1.7301234567891e+09
# HELP rest_server_requests_total Total number of requests by method, status and handler.
# TYPE rest_server_requests_total counter
rest_server_requests_total{app_name="mlserver",method="POST",path="/v2/models/{model_name}/infer",status_code="200"} 2.0
# HELP rest_server_requests_in_progress Gauge of requests by method and path currently being processed
# TYPE rest_server_requests_in_progress gauge
rest_server_requests_in_progress{app_name="mlserver",method="POST",path="/v2/models/{model_name}/infer"} 0.0
# HELP rest_server_request_duration_seconds Latency of a request by method, status and handler.
# TYPE rest_server_request_duration_seconds histogram
rest_server_request_duration_seconds_bucket{app_name="mlserver",le="0.005",method="POST",path="/v2/models/{model_name}/infer",status_code="200"} 1.0
rest_server_request_duration_seconds_bucket{app_name="mlserver",le="+Inf",method="POST",path="/v2/models/{model_name}/infer",status_code="200"} 2.0
rest_server_request_duration_seconds_count{app_name="mlserver",method="POST",path="/v2/models/{model_name}/infer",status_code="200"} 2.0
rest_server_request_duration_seconds_sum{app_name="mlserver",method="POST",path="/v2/models/{model_name}/infer",status_code="200"} 0.1
"#;

    fn counters(success: f64, failure: f64, request_us: f64, queue_us: f64, compute_us: f64) -> ServerCounters {
        ServerCounters { success, failure, request_us, queue_us, compute_us }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    /// `line`, alone on a page, read for `double`.
    fn one(line: &str) -> Result<ServerCounters, MetricsError> {
        parse(line, "double")
    }

    fn malformed_at(result: &Result<ServerCounters, MetricsError>, at: usize) -> bool {
        matches!(result, Err(MetricsError::Malformed { line, .. }) if *line == at)
    }

    #[test]
    fn a_triton_page_sums_one_models_versions_and_failure_reasons() {
        assert_eq!(parse(TRITON, "double"), Ok(counters(7.0, 7.0, 15_000.0, 500.0, 11_000.0)));
        assert_eq!(parse(TRITON, "add_sub"), Ok(counters(40.0, 9.0, 999_999.0, 77_777.0, 55_555.0)));
        assert_eq!(parse(TRITON, "doubl"), Err(MetricsError::NoSeries { model: "doubl".to_owned() }));
    }

    #[test]
    fn an_mlserver_page_sums_grpc_and_rest_versions_in_microseconds_and_skips_created() {
        // The `""` (gRPC) and `"None"` (REST) series are one model's; no queue/compute split.
        assert_eq!(parse(MLSERVER, "lin"), Ok(counters(5.0, 1.0, 375_000.0, 0.0, 0.0)));
        assert_eq!(parse(MLSERVER, "other"), Ok(counters(50.0, 4.0, 9_500_000.0, 0.0, 0.0)));
        assert_eq!(parse(MLSERVER, "mlserver"), Err(MetricsError::NoSeries { model: "mlserver".to_owned() }));
    }

    #[test]
    fn mlserver_count_is_checked_though_summed_nowhere() {
        let page = "model_infer_request_duration_count{model=\"lin\",version=\"\"} NaN\n";
        assert_eq!(parse(page, "lin"), Err(MetricsError::NotFinite { line: 1 }));
        let page = "model_infer_request_duration_count{model=\"lin\",version=\"\"} 4\n";
        assert_eq!(parse(page, "lin"), Ok(ServerCounters::default()));
    }

    #[test]
    fn a_bad_value_of_the_model_fails_the_page_with_its_line() {
        let page = "# TYPE nv_inference_request_success counter\n\nnv_inference_request_success{model=\"double\"} x\n";
        let got = parse(page, "double");
        assert!(malformed_at(&got, 3), "{got:?}");
        assert_eq!(one("nv_inference_request_success{model=\"double\"} NaN"), Err(MetricsError::NotFinite { line: 1 }));
        assert_eq!(one("nv_inference_request_success{model=\"double\"} +Inf"), Err(MetricsError::NotFinite { line: 1 }));
        assert_eq!(one("nv_inference_request_success{model=\"double\"} 1e309"), Err(MetricsError::NotFinite { line: 1 }));
        assert_eq!(one("nv_inference_request_success{model=\"double\"} -1"), Err(MetricsError::Negative { line: 1 }));
        assert!(malformed_at(&one("nv_inference_request_success{model=\"double\"}"), 1));
        assert!(malformed_at(&one("nv_inference_request_success{model=\"double\"} 0x10"), 1));
        assert!(malformed_at(&one("nv_inference_request_success{model=\"double\"} 5 12 13"), 1));
        assert!(malformed_at(&one("nv_inference_request_success{model=\"double\"} 5 soon"), 1));
        // A sum that overflows is not finite either, at the line that overflowed it.
        let page = "nv_inference_request_success{model=\"double\",version=\"1\"} 1e308\n\
                    nv_inference_request_success{model=\"double\",version=\"2\"} 1e308\n";
        assert_eq!(parse(page, "double"), Err(MetricsError::NotFinite { line: 2 }));
        // Seconds that overflow once in microseconds.
        assert_eq!(parse("model_infer_request_duration_sum{model=\"lin\"} 1e303", "lin"), Err(MetricsError::NotFinite { line: 1 }));
    }

    #[test]
    fn another_models_garbage_and_other_series_exotic_syntax_are_skipped() {
        let page = "nv_inference_request_success{model=\"double\"} 5\n\
                    nv_inference_request_success{model=\"other\"} NaN\n\
                    nv_inference_request_failure{model=\"other\"} -3\n\
                    {\"my.metric\",model=\"double\"} 9\n\
                    some_other{path=\"unterminated 1\n\
                    nv_inference_request_success_total{model=\"double\"} 100\n\
                    nv_inference_request_success 100\n\
                    \t  # a comment after blanks\n";
        assert_eq!(parse(page, "double"), Ok(counters(5.0, 0.0, 0.0, 0.0, 0.0)));
    }

    #[test]
    fn label_values_are_unescaped_and_matched_exactly() {
        let page = r#"nv_inference_request_success{version="1",model="a,b}=c\"d\\e\nf"} 4"#;
        assert_eq!(parse(page, "a,b}=c\"d\\e\nf"), Ok(counters(4.0, 0.0, 0.0, 0.0, 0.0)));
        // The escaped spelling is not the name, nor is a prefix or an extension of it.
        for other in [r#"a,b}=c\"d\\e\nf"#, "a,b}=c\"d\\e\n", "a,b}=c\"d\\e\nff", "a,b"] {
            assert_eq!(parse(page, other), Err(MetricsError::NoSeries { model: other.to_owned() }));
        }
        // A `model` label spelled inside another label's value is not the model label.
        let page = r#"nv_inference_request_success{note="x\",model=\"double",model="other"} 4"#;
        assert_eq!(one(page), Err(MetricsError::NoSeries { model: "double".to_owned() }));
        // Blanks around the tokens, a trailing comma, a timestamp, no blank before the value.
        assert_eq!(one(r#"nv_inference_request_success { model = "double" , version="1" , } 5 1700000000000"#).map(|c| c.success), Ok(5.0));
        assert_eq!(one(r#"nv_inference_request_success{model="double"}6"#).map(|c| c.success), Ok(6.0));
        assert_eq!(one("nv_inference_request_success{model=\"double\"} 7\r\n").map(|c| c.success), Ok(7.0));
    }

    #[test]
    fn a_broken_label_block_of_a_known_series_is_malformed() {
        for line in [
            r#"nv_inference_request_success{model="double"#,
            r#"nv_inference_request_success{model="double",version="1" 5"#,
            r#"nv_inference_request_success{model="double\"} 5"#,
            r#"nv_inference_request_success{model="dou\ble"} 5"#,
            r#"nv_inference_request_success{model="double",model="double"} 5"#,
            r#"nv_inference_request_success{model=double} 5"#,
            r#"nv_inference_request_success{model "double"} 5"#,
            r#"nv_inference_request_success{1model="double"} 5"#,
            r#"nv_inference_request_success{"model"="double"} 5"#,
            r#"nv_inference_request_success{,} 5"#,
            r#"nv_inference_request_success{model="double";version="1"} 5"#,
            r#"nv_inference_request_success{model="double"\"#,
            "nv_inference_request_success{",
        ] {
            let got = one(line);
            assert!(malformed_at(&got, 1), "{line}: {got:?}");
        }
    }

    #[test]
    fn the_bounds_are_checked_before_anything_is_read() {
        let at_limit = "x".repeat(MAX_METRICS_BYTES);
        assert_eq!(one(&at_limit), Err(MetricsError::NoSeries { model: "double".to_owned() }));
        let over = format!("nv_inference_request_success{{model=\"double\"}} 1\n{}", "x".repeat(MAX_METRICS_BYTES - 40));
        assert_eq!(over.len(), MAX_METRICS_BYTES + 7);
        assert_eq!(one(&over), Err(MetricsError::TooLarge { bytes: MAX_METRICS_BYTES + 7 }));

        let lines = "\n".repeat(MAX_METRICS_LINES);
        assert_eq!(one(&lines), Err(MetricsError::NoSeries { model: "double".to_owned() }));
        let too_many = format!("nv_inference_request_success{{model=\"double\"}} x\n{}", "\n".repeat(MAX_METRICS_LINES));
        assert_eq!(one(&too_many), Err(MetricsError::TooManyLines));
    }

    #[test]
    fn a_one_mebibyte_line_is_read_in_place() {
        let room = MAX_METRICS_BYTES - 64;
        let value = format!("nv_inference_request_success{{model=\"double\"}}{}7", " ".repeat(room));
        assert_eq!(one(&value).map(|c| c.success), Ok(7.0));
        let label = format!("nv_inference_request_success{{model=\"{}\"}} 7", "d".repeat(room));
        assert_eq!(one(&label), Err(MetricsError::NoSeries { model: "double".to_owned() }));
        let unterminated = format!("nv_inference_request_success{{model=\"{}", "\\\"".repeat(room / 2));
        assert!(malformed_at(&one(&unterminated), 1));
        let braces = format!("nv_inference_request_success{}", "{".repeat(room));
        assert!(malformed_at(&one(&braces), 1));
    }

    /// xorshift64: reproducible noise without a dependency.
    struct Noise(u64);

    impl Noise {
        fn bits(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.bits() % n as u64) as usize
        }
    }

    fn believable(got: &Result<ServerCounters, MetricsError>) -> bool {
        match got {
            Ok(c) => [c.success, c.failure, c.request_us, c.queue_us, c.compute_us].iter().all(|v| v.is_finite() && *v >= 0.0),
            Err(_) => true,
        }
    }

    #[test]
    fn adversarial_pages_never_panic_and_never_yield_a_bad_number() {
        const PIECES: &[&str] = &[
            "nv_inference_request_success",
            "model_infer_request_duration_sum",
            "nv_inference_request_failure",
            "{",
            "}",
            "model",
            "version",
            "=",
            "\"",
            "\\",
            "\\\"",
            "\\n",
            ",",
            " ",
            "\t",
            "\n",
            "\r",
            "#",
            "double",
            "1",
            "-",
            "0.5",
            "e309",
            "NaN",
            "+Inf",
            "é",
            "∞",
            "\u{0}",
        ];
        let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
        for _ in 0..3000 {
            let mut page = String::new();
            for _ in 0..noise.below(60) {
                page.push_str(PIECES[noise.below(PIECES.len())]);
            }
            let got = one(&page);
            assert!(believable(&got), "{page:?}: {got:?}");
        }
        for _ in 0..500 {
            let bytes: Vec<u8> = (0..noise.below(300)).map(|_| noise.bits() as u8).collect();
            let page = String::from_utf8_lossy(&bytes);
            let got = one(&page);
            assert!(believable(&got), "{page:?}: {got:?}");
        }
        // A page of mostly good lines with noise spliced into one of them.
        for _ in 0..500 {
            let mut page = TRITON.to_owned();
            let at = noise.below(page.len());
            let at = (at..page.len()).find(|&i| page.is_char_boundary(i)).unwrap_or(page.len());
            page.insert_str(at, PIECES[noise.below(PIECES.len())]);
            let got = one(&page);
            assert!(believable(&got), "{page:?}: {got:?}");
        }
    }

    #[test]
    fn a_window_is_the_growth_over_the_seconds() {
        let before = counters(10.0, 1.0, 10_000.0, 1_000.0, 5_000.0);
        let after = counters(30.0, 3.0, 50_000.0, 3_000.0, 25_000.0);
        let w = window(&before, &after, 2.0).expect("counters grew");
        assert!(close(w.success_rps, 10.0), "{w:?}");
        assert!(close(w.failure_rps, 1.0), "{w:?}");
        assert!(close(w.mean_request_ms, 2.0), "{w:?}");
        assert!(close(w.mean_queue_ms, 0.1), "{w:?}");
        assert!(close(w.mean_compute_ms, 1.0), "{w:?}");
    }

    #[test]
    fn a_window_from_two_parsed_pages() {
        let before = parse(MLSERVER, "lin").expect("page");
        let later = MLSERVER.replace("version=\"\"} 3.0", "version=\"\"} 7.0").replace("version=\"\"} 0.25", "version=\"\"} 0.75");
        let after = parse(&later, "lin").expect("page");
        let w = window(&before, &after, 4.0).expect("counters grew");
        assert!(close(w.success_rps, 1.0), "{w:?}");
        assert_eq!(w.failure_rps, 0.0);
        assert!(close(w.mean_request_ms, 125.0), "{w:?}");
        assert_eq!((w.mean_queue_ms, w.mean_compute_ms), (0.0, 0.0));
    }

    #[test]
    fn no_request_in_the_window_means_zero_rates_and_means() {
        let c = counters(10.0, 1.0, 10_000.0, 1_000.0, 5_000.0);
        let w = window(&c, &c, 5.0).expect("nothing went down");
        assert_eq!(w, ServerWindow { success_rps: 0.0, failure_rps: 0.0, mean_request_ms: 0.0, mean_queue_ms: 0.0, mean_compute_ms: 0.0 });
        // Only failures: a failure rate, no means.
        let failed = counters(10.0, 5.0, 10_000.0, 1_000.0, 5_000.0);
        let w = window(&c, &failed, 2.0).expect("nothing went down");
        assert!(close(w.failure_rps, 2.0), "{w:?}");
        assert_eq!((w.success_rps, w.mean_request_ms, w.mean_queue_ms, w.mean_compute_ms), (0.0, 0.0, 0.0, 0.0));
    }

    #[test]
    fn a_counter_that_went_down_is_a_restart_not_a_window() {
        let before = counters(10.0, 1.0, 10_000.0, 1_000.0, 5_000.0);
        // The server restarted and has served two requests since.
        let restarted = counters(2.0, 0.0, 900.0, 50.0, 400.0);
        assert_eq!(window(&before, &restarted, 2.0), None);
        // Any one counter down is enough.
        let only_time_down = counters(20.0, 1.0, 9_999.0, 2_000.0, 6_000.0);
        assert_eq!(window(&before, &only_time_down, 2.0), None);
        let only_failures_down = counters(20.0, 0.0, 20_000.0, 2_000.0, 6_000.0);
        assert_eq!(window(&before, &only_failures_down, 2.0), None);
    }

    #[test]
    fn a_window_needs_a_positive_length() {
        let before = counters(10.0, 1.0, 10_000.0, 1_000.0, 5_000.0);
        let after = counters(20.0, 1.0, 20_000.0, 2_000.0, 6_000.0);
        for seconds in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(window(&before, &after, seconds), None, "{seconds}");
        }
        assert!(window(&before, &after, 0.5).is_some());
    }
}
