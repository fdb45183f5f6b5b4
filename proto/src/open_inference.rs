//! What the routers, sim-infer and the clients share about Open Inference Protocol
//! requests: the bounds a request is checked against before it is queued or forwarded, the
//! batch it carries, gpuplane's response parameters, and a request builder. Pure.
//!
//! The bounds are the data plane's documented limits: a request past one is refused with
//! INVALID_ARGUMENT naming the field, before any backend sees it.

use std::collections::HashMap;

use tonic::Status;

use crate::oip::model_infer_request::InferInputTensor;
use crate::oip::{infer_parameter::ParameterChoice, InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse};

/// The largest message a router or sim-infer decodes (tonic's default is 4 MiB): a batch
/// of images. A larger one is refused with RESOURCE_EXHAUSTED before it is read whole.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Input tensors of one request.
pub const MAX_INPUTS: usize = 64;
/// Dimensions of one tensor.
pub const MAX_DIMS: usize = 8;
/// Elements of one request's tensors together (64 Mi: 256 MiB of FP32), whatever the
/// message size allows, so that a shape cannot make a server allocate without bound.
pub const MAX_ELEMENTS: u64 = 64 << 20;
/// Samples in one request (the first dimension of a batched input).
pub const MAX_REQUEST_BATCH: u32 = 4096;

/// Response parameters gpuplane's own servers (sim-infer) set: which process answered,
/// its time for the request, and the batch it ran in. Other servers may leave them out.
pub const SERVED_BY: &str = "gpuplane_served_by";
pub const SERVER_LATENCY_US: &str = "gpuplane_server_latency_us";
pub const EXECUTED_BATCH: &str = "gpuplane_executed_batch";

/// Bytes of one element of `datatype`; `None` for BYTES (variable) and unknown types.
pub fn element_size(datatype: &str) -> Option<u64> {
    Some(match datatype {
        "BOOL" | "UINT8" | "INT8" => 1,
        "UINT16" | "INT16" | "FP16" | "BF16" => 2,
        "UINT32" | "INT32" | "FP32" => 4,
        "UINT64" | "INT64" | "FP64" => 8,
        _ => return None,
    })
}

fn known_datatype(datatype: &str) -> bool {
    datatype == "BYTES" || element_size(datatype).is_some()
}

fn invalid(field: String, message: String) -> Status {
    let mut status = Status::invalid_argument(format!("{field}: {message}"));
    if let Ok(v) = field.parse() {
        status.metadata_mut().insert(crate::meta::FIELD, v);
    }
    status
}

/// Elements of a tensor of `shape`, or why the shape is refused.
fn elements(field: &str, shape: &[i64]) -> Result<u64, Status> {
    if shape.len() > MAX_DIMS {
        return Err(invalid(format!("{field}.shape"), format!("{} dimensions, at most {MAX_DIMS}", shape.len())));
    }
    let mut n: u64 = 1;
    for (d, &dim) in shape.iter().enumerate() {
        let dim = u64::try_from(dim)
            .map_err(|_| invalid(format!("{field}.shape[{d}]"), format!("{dim}: a request's dimensions are sizes, at least 0")))?;
        n = n.saturating_mul(dim);
    }
    Ok(n)
}

/// Elements the typed contents hold (the list of the tensor's type).
fn typed_elements(c: &InferTensorContents) -> u64 {
    [
        c.bool_contents.len(),
        c.int_contents.len(),
        c.int64_contents.len(),
        c.uint_contents.len(),
        c.uint64_contents.len(),
        c.fp32_contents.len(),
        c.fp64_contents.len(),
        c.bytes_contents.len(),
    ]
    .into_iter()
    .max()
    .unwrap_or(0) as u64
}

/// Checks `request` against the protocol and the bounds above; its batch (the first
/// dimension of its first input, 1 for an input of no dimensions). Names the field.
pub fn check(request: &ModelInferRequest) -> Result<u32, Status> {
    let inputs = &request.inputs;
    if inputs.is_empty() {
        return Err(invalid("inputs".into(), "a request needs at least one input tensor".into()));
    }
    if inputs.len() > MAX_INPUTS {
        return Err(invalid("inputs".into(), format!("{} tensors, at most {MAX_INPUTS}", inputs.len())));
    }
    let raw = &request.raw_input_contents;
    if !raw.is_empty() && raw.len() != inputs.len() {
        return Err(invalid(
            "raw_input_contents".into(),
            format!("{} entries for {} inputs: raw contents are one entry per input, for all of them or none", raw.len(), inputs.len()),
        ));
    }
    let mut total: u64 = 0;
    for (i, t) in inputs.iter().enumerate() {
        let field = format!("inputs[{i}]");
        if !known_datatype(&t.datatype) {
            return Err(invalid(format!("{field}.datatype"), format!("{:?} is not a data type of the protocol", t.datatype)));
        }
        let n = elements(&field, &t.shape)?;
        total = total.saturating_add(n);
        if total > MAX_ELEMENTS {
            return Err(invalid(format!("{field}.shape"), format!("the request's tensors hold more than {MAX_ELEMENTS} elements")));
        }
        match (raw.get(i), &t.contents) {
            (Some(_), Some(_)) => {
                return Err(invalid(format!("{field}.contents"), "set together with raw_input_contents".into()));
            }
            (Some(bytes), None) => {
                if let Some(size) = element_size(&t.datatype) {
                    if bytes.len() as u64 != n * size {
                        return Err(invalid(
                            format!("raw_input_contents[{i}]"),
                            format!("{} bytes; shape {:?} of {} needs {}", bytes.len(), t.shape, t.datatype, n * size),
                        ));
                    }
                }
            }
            (None, Some(c)) => {
                if typed_elements(c) != n {
                    return Err(invalid(
                        format!("{field}.contents"),
                        format!("{} elements; shape {:?} needs {n}", typed_elements(c), t.shape),
                    ));
                }
            }
            (None, None) if n > 0 => {
                return Err(invalid(format!("{field}.contents"), "no contents and no raw_input_contents for it".into()));
            }
            (None, None) => {}
        }
    }
    let batch = match inputs[0].shape.first() {
        None => 1,
        Some(&b) => u32::try_from(b).unwrap_or(u32::MAX).max(1),
    };
    if batch > MAX_REQUEST_BATCH {
        return Err(invalid("inputs[0].shape[0]".into(), format!("a batch of {batch}, at most {MAX_REQUEST_BATCH}")));
    }
    Ok(batch)
}

/// A request for `model` of `batch` samples of `features` FP32 values each, all `value`,
/// as raw contents (what the load generators and the tests send).
pub fn fp32_request(model: &str, id: &str, batch: u32, features: u32, value: f32) -> ModelInferRequest {
    let n = u64::from(batch) * u64::from(features);
    let raw: Vec<u8> = (0..n).flat_map(|_| value.to_le_bytes()).collect();
    ModelInferRequest {
        model_name: model.into(),
        id: id.into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![i64::from(batch), i64::from(features)],
            ..Default::default()
        }],
        raw_input_contents: vec![raw.into()],
        ..Default::default()
    }
}

/// A string parameter of a response.
pub fn string_parameter<'a>(parameters: &'a HashMap<String, InferParameter>, key: &str) -> Option<&'a str> {
    match parameters.get(key)?.parameter_choice.as_ref()? {
        ParameterChoice::StringParam(s) => Some(s),
        _ => None,
    }
}

/// An integer parameter of a response.
pub fn int_parameter(parameters: &HashMap<String, InferParameter>, key: &str) -> Option<i64> {
    match parameters.get(key)?.parameter_choice.as_ref()? {
        ParameterChoice::Int64Param(v) => Some(*v),
        _ => None,
    }
}

pub fn string_param(s: impl Into<String>) -> InferParameter {
    InferParameter { parameter_choice: Some(ParameterChoice::StringParam(s.into())) }
}

pub fn int_param(v: i64) -> InferParameter {
    InferParameter { parameter_choice: Some(ParameterChoice::Int64Param(v)) }
}

/// Which process answered `response` (gpuplane's servers set it; empty otherwise).
pub fn served_by(response: &ModelInferResponse) -> &str {
    string_parameter(&response.parameters, SERVED_BY).unwrap_or("")
}

/// The FP32 values of output `i` of `response`, raw or typed.
pub fn fp32_output(response: &ModelInferResponse, i: usize) -> Option<Vec<f32>> {
    if let Some(raw) = response.raw_output_contents.get(i) {
        return Some(raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect());
    }
    response.outputs.get(i)?.contents.as_ref().map(|c| c.fp32_contents.clone())
}

/// The FP64 values of output `i`: raw if the server sent raw contents (MLServer mirrors the
/// request's form), else typed; `None` for raw contents that are not whole values.
pub fn fp64_output(response: &ModelInferResponse, i: usize) -> Option<Vec<f64>> {
    if let Some(raw) = response.raw_output_contents.get(i) {
        if !raw.len().is_multiple_of(8) {
            return None;
        }
        return Some(raw.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("chunks of 8"))).collect());
    }
    response.outputs.get(i)?.contents.as_ref().map(|c| c.fp64_contents.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// README's "Limits" table lists the data plane's bounds too, with their values.
    #[test]
    fn readme_lists_the_data_planes_bounds() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        for (name, value, why) in [
            ("MAX_MESSAGE_BYTES", MAX_MESSAGE_BYTES as u64, "an Open Inference Protocol message a router or sim-infer decodes"),
            ("MAX_INPUTS", MAX_INPUTS as u64, "input tensors of one inference request"),
            ("MAX_DIMS", MAX_DIMS as u64, "dimensions of one tensor"),
            ("MAX_ELEMENTS", MAX_ELEMENTS, "elements of one inference request's tensors together"),
            ("MAX_REQUEST_BATCH", u64::from(MAX_REQUEST_BATCH), "samples in one inference request (its first input's first dimension)"),
        ] {
            let row = format!("| `{name}` | {value} | {why} |");
            assert!(readme.contains(&row), "README.md lacks the row {row}");
        }
    }

    fn field(s: &Status) -> &str {
        s.metadata().get(crate::meta::FIELD).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    #[test]
    fn a_well_formed_request_gives_its_batch() {
        assert_eq!(check(&fp32_request("m", "1", 8, 4, 1.0)).unwrap(), 8);
        let mut scalar = fp32_request("m", "1", 1, 1, 1.0);
        scalar.inputs[0].shape.clear();
        assert_eq!(check(&scalar).unwrap(), 1);
        let mut typed = fp32_request("m", "1", 2, 3, 1.0);
        typed.raw_input_contents.clear();
        typed.inputs[0].contents = Some(InferTensorContents { fp32_contents: vec![0.0; 6], ..Default::default() });
        assert_eq!(check(&typed).unwrap(), 2);
    }

    #[test]
    fn malformed_requests_are_refused_naming_the_field() {
        type Spoil = Box<dyn Fn(&mut ModelInferRequest)>;
        let cases: Vec<(&str, Spoil)> = vec![
            ("inputs", Box::new(|r| r.inputs.clear())),
            ("inputs", Box::new(|r| r.inputs = vec![r.inputs[0].clone(); MAX_INPUTS + 1])),
            ("inputs[0].datatype", Box::new(|r| r.inputs[0].datatype = "FP31".into())),
            ("inputs[0].shape[1]", Box::new(|r| r.inputs[0].shape[1] = -1)),
            ("inputs[0].shape", Box::new(|r| r.inputs[0].shape = vec![1; MAX_DIMS + 1])),
            // A shape that would need far more than the bytes sent, and a huge one.
            ("raw_input_contents[0]", Box::new(|r| r.inputs[0].shape = vec![4, 1000])),
            ("inputs[0].shape", Box::new(|r| r.inputs[0].shape = vec![i64::MAX, i64::MAX])),
            ("raw_input_contents", Box::new(|r| r.raw_input_contents.push(Default::default()))),
            ("inputs[0].contents", Box::new(|r| r.inputs[0].contents = Some(InferTensorContents::default()))),
            (
                "inputs[0].contents",
                Box::new(|r| {
                    r.raw_input_contents.clear();
                    r.inputs[0].contents = Some(InferTensorContents { fp32_contents: vec![1.0], ..Default::default() });
                }),
            ),
            ("inputs[0].contents", Box::new(|r| r.raw_input_contents.clear())),
        ];
        for (want, spoil) in cases {
            let mut r = fp32_request("m", "1", 4, 2, 1.0);
            spoil(&mut r);
            let e = check(&r).unwrap_err();
            assert_eq!((e.code(), field(&e)), (tonic::Code::InvalidArgument, want), "{}", e.message());
        }
        let mut big = fp32_request("m", "1", 1, 1, 1.0);
        big.inputs[0].shape = vec![i64::from(MAX_REQUEST_BATCH) + 1, 0];
        big.raw_input_contents = vec![Default::default()];
        assert_eq!(field(&check(&big).unwrap_err()), "inputs[0].shape[0]");
    }

    #[test]
    fn outputs_are_read_raw_or_typed_and_parameters_by_type() {
        let mut r = ModelInferResponse {
            raw_output_contents: vec![[1.5f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat().into()],
            ..Default::default()
        };
        assert_eq!(fp32_output(&r, 0), Some(vec![1.5, 2.0]));
        r.raw_output_contents.clear();
        r.outputs.push(crate::oip::model_infer_response::InferOutputTensor {
            contents: Some(InferTensorContents { fp32_contents: vec![3.0], ..Default::default() }),
            ..Default::default()
        });
        assert_eq!(fp32_output(&r, 0), Some(vec![3.0]));
        r.parameters.insert(SERVED_BY.into(), string_param("a"));
        r.parameters.insert(EXECUTED_BATCH.into(), int_param(8));
        assert_eq!((served_by(&r), int_parameter(&r.parameters, EXECUTED_BATCH)), ("a", Some(8)));
        assert_eq!(string_parameter(&r.parameters, EXECUTED_BATCH), None);
    }
}
