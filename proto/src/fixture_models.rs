//! The requests and answers of the fixture models `deploy/real-servers/fixtures/` writes:
//! Triton's python-backend `double` (OUTPUT0 = 2 · INPUT0) and MLServer's scikit-learn `lin`
//! (y = 3·x0 − 2·x1 + 1). Shared by the tests and `router-bench`, which drive the real
//! servers and check every answer's values, not only its status.

use crate::oip::model_infer_request::InferInputTensor;
use crate::oip::{ModelInferRequest, ModelInferResponse};
use crate::open_inference::{fp32_output, fp64_output};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixtureModel {
    /// Triton's `double`: FP32 `[1, 4]` in, twice it out.
    TritonDouble,
    /// MLServer's `lin`: FP64 `[1, 2]` in, `[[3·x0 − 2·x1 + 1]]` out.
    MlserverLin,
}

/// Triton's `double` answers exactly twice this.
const DOUBLE_INPUT: [f32; 4] = [1.0, 2.0, 3.0, 4.5];
/// `lin` answers 5 (not 0, which an empty answer could fake).
const LIN_INPUT: [f64; 2] = [2.0, 1.0];

impl FixtureModel {
    /// The name the server serves the model under.
    pub fn model(self) -> &'static str {
        match self {
            FixtureModel::TritonDouble => "double",
            FixtureModel::MlserverLin => "lin",
        }
    }

    /// One sample as raw little-endian contents (what tritonclient sends) for `model_name`
    /// (the model's own name direct, the service's through a gpuplane endpoint).
    pub fn request(self, model_name: &str) -> ModelInferRequest {
        let (input, datatype, shape, raw): (&str, &str, Vec<i64>, Vec<u8>) = match self {
            FixtureModel::TritonDouble => ("INPUT0", "FP32", vec![1, 4], DOUBLE_INPUT.iter().flat_map(|v| v.to_le_bytes()).collect()),
            FixtureModel::MlserverLin => ("input-0", "FP64", vec![1, 2], LIN_INPUT.iter().flat_map(|v| v.to_le_bytes()).collect()),
        };
        ModelInferRequest {
            model_name: model_name.into(),
            inputs: vec![InferInputTensor { name: input.into(), datatype: datatype.into(), shape, ..Default::default() }],
            raw_input_contents: vec![raw.into()],
            ..Default::default()
        }
    }

    /// Whether `response` holds the model's answer to [`FixtureModel::request`].
    pub fn check(self, response: &ModelInferResponse) -> Result<(), String> {
        match self {
            FixtureModel::TritonDouble => {
                let got = fp32_output(response, 0).ok_or("no OUTPUT0")?;
                let want: Vec<f32> = DOUBLE_INPUT.iter().map(|v| 2.0 * v).collect();
                if got == want {
                    Ok(())
                } else {
                    Err(format!("OUTPUT0 {got:?}, expected {want:?}"))
                }
            }
            FixtureModel::MlserverLin => {
                let got = fp64_output(response, 0).ok_or("no predict output")?;
                let [x0, x1] = LIN_INPUT;
                let want = 3.0 * x0 - 2.0 * x1 + 1.0;
                match got[..] {
                    [y] if (y - want).abs() < 1e-9 => Ok(()),
                    _ => Err(format!("predict {got:?}, expected [{want}]")),
                }
            }
        }
    }
}
