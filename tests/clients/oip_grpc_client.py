"""Drives a gpuplane service endpoint with NVIDIA's own client (tritonclient, gRPC): the
Open Inference Protocol as Triton's users speak it. Prints one JSON object of what it saw;
the Rust test asserts on it.

usage: oip_grpc_client.py HOST:PORT MODEL
"""
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

url, model = sys.argv[1], sys.argv[2]
client = grpcclient.InferenceServerClient(url=url)
seen = {
    "live": client.is_server_live(),
    "ready": client.is_server_ready(),
    "model_ready": client.is_model_ready(model),
}
metadata = client.get_model_metadata(model)
seen["metadata_name"] = metadata.name
seen["metadata_inputs"] = [i.name for i in metadata.inputs]

data = np.arange(8, dtype=np.float32).reshape(2, 4) * 1.5
tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
tensor.set_data_from_numpy(data)
result = client.infer(model, [tensor], request_id="req-1", outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
out = result.as_numpy("OUTPUT0")
seen["output_matches"] = bool(out is not None and out.shape == data.shape and np.array_equal(out, data))
seen["response_id"] = result.get_response().id
seen["response_model"] = result.get_response().model_name

try:
    client.infer(model + "-other", [tensor])
    seen["unknown_model"] = "accepted"
except InferenceServerException as e:
    seen["unknown_model"] = f"{e.status()} {e.message()}"
print(json.dumps(seen))
