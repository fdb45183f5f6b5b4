"""Drives a gpuplane service endpoint with tritonclient over HTTP/REST (JSON tensors: the
binary-data extension is not served). Prints one JSON object of what it saw.

usage: oip_http_client.py HOST:PORT MODEL
"""
import json
import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

url, model = sys.argv[1], sys.argv[2]
client = httpclient.InferenceServerClient(url=url)
seen = {
    "live": client.is_server_live(),
    "ready": client.is_server_ready(),
    "model_ready": client.is_model_ready(model),
    "metadata_name": client.get_model_metadata(model)["name"],
}
data = np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5
tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
tensor.set_data_from_numpy(data, binary_data=False)
result = client.infer(model, [tensor], request_id="req-2", outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
out = result.as_numpy("OUTPUT0")
seen["output_matches"] = bool(out is not None and out.shape == data.shape and np.array_equal(out, data))
seen["response_id"] = result.get_response()["id"]
try:
    client.infer(model + "-other", [tensor])
    seen["unknown_model"] = "accepted"
except InferenceServerException as e:
    seen["unknown_model"] = f"{e.status()} {e.message()}"
print(json.dumps(seen))
