//! The Open Inference Protocol's HTTP/REST bodies (KServe v2: `$inference_request`,
//! `$inference_response`, `$metadata_model_response`) to and from its gRPC messages, so the
//! REST routes run the gRPC path. Pure. Tensor data is JSON numbers, booleans or strings,
//! flat or nested in row-major order; FP16/BF16 tensors have no JSON form here (send them
//! over gRPC as raw contents).

use proto::oip::infer_parameter::ParameterChoice;
use proto::oip::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use proto::oip::{InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse, ModelMetadataResponse};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// Why a body was refused: the field and the reason (a 400).
#[derive(Debug, Clone, PartialEq)]
pub struct BodyError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> BodyError {
    BodyError { field: field.into(), message: message.into() }
}

fn parameters(field: &str, v: Option<&Value>) -> Result<HashMap<String, InferParameter>, BodyError> {
    let Some(v) = v else { return Ok(HashMap::new()) };
    let obj = v.as_object().ok_or_else(|| refuse(field, "expected an object"))?;
    obj.iter()
        .map(|(k, v)| {
            let choice = match v {
                Value::Bool(b) => ParameterChoice::BoolParam(*b),
                Value::String(s) => ParameterChoice::StringParam(s.clone()),
                Value::Number(n) if n.as_i64().is_some() => ParameterChoice::Int64Param(n.as_i64().unwrap_or_default()),
                _ => return Err(refuse(format!("{field}.{k}"), "a parameter is a boolean, an integer or a string")),
            };
            Ok((k.clone(), InferParameter { parameter_choice: Some(choice) }))
        })
        .collect()
}

fn parameters_json(p: &HashMap<String, InferParameter>) -> Value {
    let mut out = Map::new();
    for (k, v) in p {
        let value = match &v.parameter_choice {
            Some(ParameterChoice::BoolParam(b)) => json!(b),
            Some(ParameterChoice::Int64Param(i)) => json!(i),
            Some(ParameterChoice::StringParam(s)) => json!(s),
            None => Value::Null,
        };
        out.insert(k.clone(), value);
    }
    Value::Object(out)
}

/// The elements of `data`, flattened (nested arrays in row-major order), at most `depth`
/// levels deep.
fn flatten<'a>(field: &str, data: &'a Value, depth: usize, out: &mut Vec<&'a Value>) -> Result<(), BodyError> {
    match data {
        Value::Array(items) => {
            if depth == 0 {
                return Err(refuse(field, "nested deeper than the tensor's dimensions allow"));
            }
            for item in items {
                flatten(field, item, depth - 1, out)?;
            }
            Ok(())
        }
        scalar => {
            out.push(scalar);
            Ok(())
        }
    }
}

fn contents(field: &str, datatype: &str, items: &[&Value]) -> Result<InferTensorContents, BodyError> {
    let mut c = InferTensorContents::default();
    let int = |i: usize, v: &Value, lo: i64, hi: i64| -> Result<i64, BodyError> {
        v.as_i64().filter(|x| (lo..=hi).contains(x)).ok_or_else(|| refuse(format!("{field}[{i}]"), format!("{v} is not a {datatype}")))
    };
    let uint = |i: usize, v: &Value, hi: u64| -> Result<u64, BodyError> {
        v.as_u64().filter(|x| *x <= hi).ok_or_else(|| refuse(format!("{field}[{i}]"), format!("{v} is not a {datatype}")))
    };
    let float = |i: usize, v: &Value| -> Result<f64, BodyError> {
        v.as_f64().ok_or_else(|| refuse(format!("{field}[{i}]"), format!("{v} is not a {datatype}")))
    };
    for (i, v) in items.iter().enumerate() {
        match datatype {
            "BOOL" => c.bool_contents.push(v.as_bool().ok_or_else(|| refuse(format!("{field}[{i}]"), format!("{v} is not a BOOL")))?),
            "INT8" => c.int_contents.push(int(i, v, i8::MIN.into(), i8::MAX.into())? as i32),
            "INT16" => c.int_contents.push(int(i, v, i16::MIN.into(), i16::MAX.into())? as i32),
            "INT32" => c.int_contents.push(int(i, v, i32::MIN.into(), i32::MAX.into())? as i32),
            "INT64" => c.int64_contents.push(int(i, v, i64::MIN, i64::MAX)?),
            "UINT8" => c.uint_contents.push(uint(i, v, u8::MAX.into())? as u32),
            "UINT16" => c.uint_contents.push(uint(i, v, u16::MAX.into())? as u32),
            "UINT32" => c.uint_contents.push(uint(i, v, u32::MAX.into())? as u32),
            "UINT64" => c.uint64_contents.push(uint(i, v, u64::MAX)?),
            "FP32" => c.fp32_contents.push(float(i, v)? as f32),
            "FP64" => c.fp64_contents.push(float(i, v)?),
            "BYTES" => c
                .bytes_contents
                .push(v.as_str().ok_or_else(|| refuse(format!("{field}[{i}]"), format!("{v} is not a string")))?.as_bytes().to_vec()),
            "FP16" | "BF16" => return Err(refuse(field, format!("{datatype} tensors have no JSON form here; send them over gRPC"))),
            other => return Err(refuse(field, format!("{other:?} is not a data type of the protocol"))),
        }
    }
    Ok(c)
}

/// An `$inference_request` body for `model` (the path's), as the gRPC request.
pub fn infer_request(model: &str, version: &str, body: &Value) -> Result<ModelInferRequest, BodyError> {
    let obj = body.as_object().ok_or_else(|| refuse("body", "expected a JSON object"))?;
    let inputs = obj.get("inputs").and_then(Value::as_array).ok_or_else(|| refuse("inputs", "expected an array of tensors"))?;
    if inputs.len() > proto::open_inference::MAX_INPUTS {
        return Err(refuse("inputs", format!("{} tensors, at most {}", inputs.len(), proto::open_inference::MAX_INPUTS)));
    }
    let mut tensors = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        let field = format!("inputs[{i}]");
        let text = |key: &str| {
            t.get(key).and_then(Value::as_str).map(str::to_string).ok_or_else(|| refuse(format!("{field}.{key}"), "expected a string"))
        };
        let shape = t
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| refuse(format!("{field}.shape"), "expected an array of sizes"))?
            .iter()
            .enumerate()
            .map(|(d, s)| s.as_i64().ok_or_else(|| refuse(format!("{field}.shape[{d}]"), format!("{s} is not a size"))))
            .collect::<Result<Vec<i64>, _>>()?;
        let datatype = text("datatype")?;
        let data = t.get("data").ok_or_else(|| refuse(format!("{field}.data"), "missing"))?;
        let mut items = Vec::new();
        flatten(&format!("{field}.data"), data, shape.len().max(1), &mut items)?;
        tensors.push(InferInputTensor {
            name: text("name")?,
            contents: Some(contents(&format!("{field}.data"), &datatype, &items)?),
            datatype,
            shape,
            parameters: parameters(&format!("{field}.parameters"), t.get("parameters"))?,
        });
    }
    let outputs = match obj.get("outputs") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .ok_or_else(|| refuse("outputs", "expected an array"))?
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let name =
                    o.get("name").and_then(Value::as_str).ok_or_else(|| refuse(format!("outputs[{i}].name"), "expected a string"))?;
                Ok(InferRequestedOutputTensor {
                    name: name.into(),
                    parameters: parameters(&format!("outputs[{i}].parameters"), o.get("parameters"))?,
                })
            })
            .collect::<Result<_, BodyError>>()?,
    };
    Ok(ModelInferRequest {
        model_name: model.into(),
        model_version: version.into(),
        id: obj.get("id").and_then(Value::as_str).unwrap_or_default().into(),
        parameters: parameters("parameters", obj.get("parameters"))?,
        inputs: tensors,
        outputs,
        raw_input_contents: Vec::new(),
    })
}

/// Elements of little-endian `raw` of `datatype` as JSON values.
fn raw_json(datatype: &str, raw: &[u8]) -> Result<Vec<Value>, String> {
    macro_rules! le {
        ($t:ty, $n:expr) => {
            raw.chunks_exact($n).map(|c| json!(<$t>::from_le_bytes(c.try_into().expect("chunk of the type's size")))).collect()
        };
    }
    Ok(match datatype {
        "BOOL" => raw.iter().map(|b| json!(*b != 0)).collect(),
        "INT8" => le!(i8, 1),
        "INT16" => le!(i16, 2),
        "INT32" => le!(i32, 4),
        "INT64" => le!(i64, 8),
        "UINT8" => le!(u8, 1),
        "UINT16" => le!(u16, 2),
        "UINT32" => le!(u32, 4),
        "UINT64" => le!(u64, 8),
        "FP32" => le!(f32, 4),
        "FP64" => le!(f64, 8),
        // The protocol's raw BYTES: each element a 4-byte little-endian length, then it.
        "BYTES" => {
            let mut out = Vec::new();
            let mut rest = raw;
            while rest.len() >= 4 {
                let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let Some(item) = rest.get(4..4 + n) else { return Err("raw BYTES output shorter than its lengths".into()) };
                out.push(json!(String::from_utf8_lossy(item)));
                rest = &rest[4 + n..];
            }
            out
        }
        other => return Err(format!("a {other} output has no JSON form here")),
    })
}

fn typed_json(c: &InferTensorContents) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    out.extend(c.bool_contents.iter().map(|v| json!(v)));
    out.extend(c.int_contents.iter().map(|v| json!(v)));
    out.extend(c.int64_contents.iter().map(|v| json!(v)));
    out.extend(c.uint_contents.iter().map(|v| json!(v)));
    out.extend(c.uint64_contents.iter().map(|v| json!(v)));
    out.extend(c.fp32_contents.iter().map(|v| json!(v)));
    out.extend(c.fp64_contents.iter().map(|v| json!(v)));
    out.extend(c.bytes_contents.iter().map(|v| json!(String::from_utf8_lossy(v))));
    out
}

/// The gRPC response as an `$inference_response` body (data flat, row-major); an error
/// when an output has no JSON form.
pub fn infer_response(r: &ModelInferResponse) -> Result<Value, String> {
    let mut outputs = Vec::with_capacity(r.outputs.len());
    for (i, o) in r.outputs.iter().enumerate() {
        let data = match (r.raw_output_contents.get(i), &o.contents) {
            (Some(raw), _) => raw_json(&o.datatype, raw).map_err(|e| format!("output {:?}: {e}", o.name))?,
            (None, Some(c)) => typed_json(c),
            (None, None) => Vec::new(),
        };
        outputs.push(
            json!({"name": o.name, "datatype": o.datatype, "shape": o.shape, "parameters": parameters_json(&o.parameters), "data": data}),
        );
    }
    Ok(json!({
        "model_name": r.model_name,
        "model_version": r.model_version,
        "id": r.id,
        "parameters": parameters_json(&r.parameters),
        "outputs": outputs,
    }))
}

/// A `$metadata_model_response` body.
pub fn model_metadata(m: &ModelMetadataResponse) -> Value {
    let tensors = |ts: &[proto::oip::model_metadata_response::TensorMetadata]| -> Vec<Value> {
        ts.iter().map(|t| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape})).collect()
    };
    json!({"name": m.name, "versions": m.versions, "platform": m.platform, "inputs": tensors(&m.inputs), "outputs": tensors(&m.outputs)})
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::oip::model_infer_response::InferOutputTensor;

    #[test]
    fn a_request_body_becomes_typed_contents_flat_or_nested() {
        let body = json!({"id": "7", "parameters": {"priority": 2}, "inputs": [
            {"name": "INPUT0", "shape": [2, 2], "datatype": "FP32", "data": [[1.0, 2.5], [3, 4]]},
            {"name": "MASK", "shape": [3], "datatype": "BOOL", "data": [true, false, true]},
            {"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ["hi"]}
        ], "outputs": [{"name": "OUTPUT0"}]});
        let r = infer_request("web", "", &body).unwrap();
        assert_eq!((r.model_name.as_str(), r.id.as_str()), ("web", "7"));
        assert_eq!(r.inputs[0].contents.as_ref().unwrap().fp32_contents, vec![1.0, 2.5, 3.0, 4.0]);
        assert_eq!(r.inputs[1].contents.as_ref().unwrap().bool_contents, vec![true, false, true]);
        assert_eq!(r.inputs[2].contents.as_ref().unwrap().bytes_contents, vec![b"hi".to_vec()]);
        assert_eq!(r.outputs[0].name, "OUTPUT0");
        assert_eq!(proto::open_inference::int_parameter(&r.parameters, "priority"), Some(2));
        // And the protocol's own check accepts what came out.
        assert_eq!(proto::open_inference::check(&r).unwrap(), 2);
    }

    #[test]
    fn a_malformed_body_is_refused_naming_the_field() {
        let input = |t: Value| json!({"inputs": [t]});
        let cases = [
            (json!([1]), "body"),
            (json!({}), "inputs"),
            (input(json!({"shape": [1], "datatype": "FP32", "data": [1]})), "inputs[0].name"),
            (input(json!({"name": "x", "shape": ["a"], "datatype": "FP32", "data": [1]})), "inputs[0].shape[0]"),
            (input(json!({"name": "x", "shape": [1], "datatype": "INT8", "data": [300]})), "inputs[0].data[0]"),
            (input(json!({"name": "x", "shape": [1], "datatype": "UINT32", "data": [-1]})), "inputs[0].data[0]"),
            (input(json!({"name": "x", "shape": [1], "datatype": "FP16", "data": [1]})), "inputs[0].data"),
            (input(json!({"name": "x", "shape": [1], "datatype": "FP31", "data": [1]})), "inputs[0].data"),
            (input(json!({"name": "x", "shape": [1], "datatype": "FP32", "data": [[[1]]]})), "inputs[0].data"),
            (input(json!({"name": "x", "shape": [1], "datatype": "FP32"})), "inputs[0].data"),
            (
                input(json!({"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": {"p": 1.5}})),
                "inputs[0].parameters.p",
            ),
        ];
        for (body, field) in cases {
            assert_eq!(infer_request("m", "", &body).unwrap_err().field, field, "{body}");
        }
    }

    #[test]
    fn a_response_becomes_json_from_raw_or_typed_outputs() {
        let out = |name: &str, datatype: &str, contents| InferOutputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: vec![2],
            contents,
            ..Default::default()
        };
        let raw = ModelInferResponse {
            model_name: "web".into(),
            id: "1".into(),
            outputs: vec![out("A", "FP32", None), out("B", "INT64", None)],
            raw_output_contents: vec![
                [1.5f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat().into(),
                [(-3i64).to_le_bytes(), 4i64.to_le_bytes()].concat().into(),
            ],
            ..Default::default()
        };
        let body = infer_response(&raw).unwrap();
        assert_eq!(body["outputs"][0]["data"], json!([1.5, 2.0]));
        assert_eq!(body["outputs"][1]["data"], json!([-3, 4]));
        assert_eq!((body["model_name"].as_str(), body["id"].as_str()), (Some("web"), Some("1")));
        let typed = ModelInferResponse {
            outputs: vec![out("A", "FP64", Some(InferTensorContents { fp64_contents: vec![0.5, 1.0], ..Default::default() }))],
            ..Default::default()
        };
        assert_eq!(infer_response(&typed).unwrap()["outputs"][0]["data"], json!([0.5, 1.0]));
        let half = ModelInferResponse {
            outputs: vec![out("H", "FP16", None)],
            raw_output_contents: vec![vec![0; 4].into()],
            ..Default::default()
        };
        assert!(infer_response(&half).unwrap_err().contains("FP16"));
    }
}
