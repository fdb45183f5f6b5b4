"""Sends one request with NVIDIA's own client (tritonclient, gRPC or HTTP) to a gpuplane
service endpoint that a real server serves, and checks the model's answer: `double`
(Triton's python-backend fixture, OUTPUT0 = 2 * INPUT0) or `lin` (MLServer's scikit-learn
fixture, y = 3*x0 - 2*x1 + 1). Prints one JSON object of what it saw.

usage: oip_model_client.py grpc|http HOST:PORT SERVICE double|lin
"""
import json
import sys

import numpy as np

protocol, url, service, model = sys.argv[1:5]
if protocol == "grpc":
    import tritonclient.grpc as client_lib
else:
    import tritonclient.http as client_lib

client = client_lib.InferenceServerClient(url=url)
seen = {"live": client.is_server_live(), "ready": client.is_server_ready(), "model_ready": client.is_model_ready(service)}

if model == "double":
    data = np.array([[1.0, 2.0, 3.0, 4.5], [-1.0, 0.0, 0.25, 8.0]], dtype=np.float32)
    name, datatype, output, expected = "INPUT0", "FP32", "OUTPUT0", 2 * data
else:
    data = np.array([[1.0, 2.0], [2.0, 1.0], [0.5, -1.25]], dtype=np.float64)
    name, datatype, output = "input-0", "FP64", "predict"
    expected = (3 * data[:, 0] - 2 * data[:, 1] + 1).reshape(-1, 1)

tensor = client_lib.InferInput(name, list(data.shape), datatype)
# MLServer refuses the binary tensor extension over HTTP: plain JSON for both.
if protocol == "http":
    tensor.set_data_from_numpy(data, binary_data=False)
    requested = [client_lib.InferRequestedOutput(output, binary_data=False)]
else:
    tensor.set_data_from_numpy(data)
    requested = [client_lib.InferRequestedOutput(output)]
result = client.infer(service, [tensor], outputs=requested)
out = result.as_numpy(output)
seen["output"] = None if out is None else out.tolist()
seen["expected"] = expected.tolist()
seen["output_matches"] = bool(out is not None and out.shape == expected.shape and np.allclose(out, expected, atol=1e-6))
print(json.dumps(seen))
