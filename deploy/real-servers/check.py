"""Drives real Triton and real MLServer once, to prove deploy/real-servers/install.sh worked.

Run by check.sh with the real-servers virtualenv's python:

    deploy/real-servers/check.sh [--triton-mode explicit|none|both] [--serial] [--json FILE]

It writes the two fixtures into a temporary directory, starts the standalone tritonserver (through
$ROOT/bin/tritonserver) and `mlserver start` on free loopback ports, waits for
/v2/models/<m>/ready, checks one request over gRPC and one over HTTP to each with tritonclient
(exact outputs), probes the raw gRPC RPCs (ServerLive, ServerReady, ModelReady, ModelMetadata,
ModelInfer with raw and with typed contents, an unknown model) and REST routes, measures 200
sequential gRPC requests, scrapes each metrics endpoint, and stops both servers, always (finally,
and on SIGINT/SIGTERM/SIGHUP). Exit 0 only when every hard check passed.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from google.protobuf import json_format, text_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import mlserver_model  # noqa: E402
import triton_model  # noqa: E402

FACTS = {}
FAILURES = []
PASSED = []
SERVERS = []


def log(msg=""):
    print(msg, flush=True)


def hard(cond, what):
    if cond:
        PASSED.append(what)
        log(f"  ok    {what}")
    else:
        FAILURES.append(what)
        log(f"  FAIL  {what}")
    return cond


def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http(method, url, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


class Server:
    def __init__(self, label, cmd, cwd, env, log_path, model, http_port, grpc_port, metrics_port):
        self.label, self.cmd, self.cwd, self.env = label, cmd, cwd, env
        self.log_path, self.model = log_path, model
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.proc = None
        self.stopped = False
        self.started = None
        self.ready_s = None

    @property
    def http_base(self):
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self):
        return f"127.0.0.1:{self.grpc_port}"

    def start(self):
        log(f"[{self.label}] start: {' '.join(self.cmd)}")
        self.logf = open(self.log_path, "wb")
        self.started = time.monotonic()
        # A session of its own, so stop() can end the server and its children (Triton's python
        # stubs) by this process group's id.
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env, stdout=self.logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        SERVERS.append(self)

    def wait_ready(self, timeout=180):
        url = f"{self.http_base}/v2/models/{self.model}/ready"
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode} before ready;"
                                   f" log {self.log_path}:\n{self.tail()}")
            try:
                status, _ = http("GET", url, timeout=2)
                if status == 200:
                    self.ready_s = time.monotonic() - self.started
                    log(f"[{self.label}] ready after {self.ready_s:.2f} s")
                    return self.ready_s
            except (urllib.error.URLError, ConnectionError, socket.timeout, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.label} not ready in {timeout} s; log {self.log_path}:\n"
                           f"{self.tail()}")

    def tail(self, n=40):
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        if self in SERVERS:
            SERVERS.remove(self)
        if self.proc is None or self.stopped:
            return
        self.stopped = True
        t0 = time.monotonic()
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        if self._group_alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        log(f"[{self.label}] stopped (exit {self.proc.returncode}) in"
            f" {time.monotonic() - t0:.2f} s")
        self.logf.close()

    def _group_alive(self):
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False


def stop_all():
    while SERVERS:
        s = SERVERS.pop()
        try:
            s.stop()
        except Exception as e:  # keep stopping the others
            log(f"[{s.label}] stop failed: {e!r}")


def on_signal(signum, _frame):
    log(f"check: signal {signum}: stopping the servers")
    raise SystemExit(128 + signum)


def pb_line(msg):
    return text_format.MessageToString(msg, as_one_line=True)


def decode_output(resp, i, np_dtype):
    """The i-th output of a ModelInferResponse as numpy, from raw or typed contents."""
    out = resp.outputs[i]
    if len(resp.raw_output_contents) > i:
        return np.frombuffer(resp.raw_output_contents[i], dtype=np_dtype).reshape(out.shape), "raw"
    field = {np.float32: "fp32_contents", np.float64: "fp64_contents"}[np_dtype]
    return np.array(getattr(out.contents, field), dtype=np_dtype).reshape(out.shape), "typed"


def probe(server, facts, *, input_name, datatype, np_dtype, x, expect, output_name, tol,
          http_binary):
    m = server.model
    log(f"[{server.label}] checks")

    # --- tritonclient over gRPC ---
    c = tgrpc.InferenceServerClient(url=server.grpc_url)
    inp = tgrpc.InferInput(input_name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    res = c.infer(m, [inp])
    got = res.as_numpy(output_name)
    hard(got is not None and got.shape == expect.shape and np.allclose(got, expect, atol=tol, rtol=0),
         f"{server.label} gRPC (tritonclient) {output_name} = {expect.tolist()}, got"
         f" {None if got is None else got.tolist()}")
    resp = res.get_response()
    facts["grpc_response_tritonclient"] = {
        "raw_output_contents": len(resp.raw_output_contents),
        "outputs": [json_format.MessageToDict(o) for o in resp.outputs],
        "model_name": resp.model_name, "model_version": resp.model_version, "id": resp.id,
    }
    log(f"  info  tritonclient sends raw_input_contents; the response had"
        f" {len(resp.raw_output_contents)} raw_output_contents;"
        f" outputs[0] = {pb_line(resp.outputs[0])[:200]}")

    # --- raw gRPC stub ---
    ch = grpc.insecure_channel(server.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
    r = stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=5)
    hard(r.live, f"{server.label} gRPC ServerLive -> live: {r.live}")
    r = stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=5)
    hard(r.ready, f"{server.label} gRPC ServerReady -> ready: {r.ready}")
    r = stub.ModelReady(service_pb2.ModelReadyRequest(name=m), timeout=5)
    hard(r.ready, f"{server.label} gRPC ModelReady(name={m!r}) -> ready: {r.ready}")
    md = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=m), timeout=5)
    facts["grpc_model_metadata"] = json_format.MessageToDict(md, preserving_proto_field_name=True)
    log(f"  info  gRPC ModelMetadata: {pb_line(md)}")
    try:
        sm = stub.ServerMetadata(service_pb2.ServerMetadataRequest(), timeout=5)
        facts["grpc_server_metadata"] = json_format.MessageToDict(sm, preserving_proto_field_name=True)
        log(f"  info  gRPC ServerMetadata: {pb_line(sm)[:300]}")
    except grpc.RpcError as e:
        facts["grpc_server_metadata"] = f"{e.code().name}: {e.details()}"

    # ModelInfer with typed contents (no raw_input_contents).
    req = service_pb2.ModelInferRequest(model_name=m, id="typed-1")
    t = req.inputs.add(name=input_name, datatype=datatype, shape=list(x.shape))
    field = {np.float32: "fp32_contents", np.float64: "fp64_contents"}[np_dtype]
    getattr(t.contents, field).extend(x.flatten().tolist())
    try:
        resp = stub.ModelInfer(req, timeout=10)
        got, how = decode_output(resp, 0, np_dtype)
        hard(got.shape == expect.shape and np.allclose(got, expect, atol=tol, rtol=0),
             f"{server.label} raw gRPC ModelInfer, typed {field} in -> {how} contents out,"
             f" {got.tolist()}")
        facts["grpc_typed_in"] = {"answered_with": how, "id_echoed": resp.id,
                                  "outputs": [json_format.MessageToDict(o) for o in resp.outputs]}
    except grpc.RpcError as e:
        facts["grpc_typed_in"] = f"{e.code().name}: {e.details()}"
        log(f"  info  typed-contents ModelInfer refused: {e.code().name}: {e.details()}")

    # ModelInfer with raw_input_contents (what tritonclient sends), decoded by hand.
    req = service_pb2.ModelInferRequest(model_name=m, id="raw-1")
    req.inputs.add(name=input_name, datatype=datatype, shape=list(x.shape))
    req.raw_input_contents.append(x.astype(np_dtype).tobytes())
    resp = stub.ModelInfer(req, timeout=10)
    got, how = decode_output(resp, 0, np_dtype)
    hard(got.shape == expect.shape and np.allclose(got, expect, atol=tol, rtol=0),
         f"{server.label} raw gRPC ModelInfer, raw_input_contents in -> {how} contents out,"
         f" {got.tolist()}")
    facts["grpc_raw_in"] = {"answered_with": how, "id_echoed": resp.id}

    # Unknown model over gRPC.
    unknown = {}
    for rpc, mk in (("ModelReady", lambda: stub.ModelReady(service_pb2.ModelReadyRequest(name="nope"), timeout=5)),
                    ("ModelMetadata", lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope"), timeout=5)),
                    ("ModelInfer", lambda: stub.ModelInfer(service_pb2.ModelInferRequest(model_name="nope", inputs=[req.inputs[0]], raw_input_contents=list(req.raw_input_contents)), timeout=5))):
        try:
            r = mk()
            unknown[rpc] = f"OK {pb_line(r)}"
        except grpc.RpcError as e:
            unknown[rpc] = f"{e.code().name}: {e.details()}"
        log(f"  info  gRPC {rpc}(name='nope') -> {unknown[rpc]}")
    facts["grpc_unknown_model"] = unknown
    ch.close()

    # --- tritonclient over HTTP ---
    hc = thttp.InferenceServerClient(url=f"127.0.0.1:{server.http_port}")
    attempts = [True, False] if http_binary else [False]
    for binary in attempts:
        hi = thttp.InferInput(input_name, list(x.shape), datatype)
        hi.set_data_from_numpy(x, binary_data=binary)
        outs = [thttp.InferRequestedOutput(output_name, binary_data=binary)]
        try:
            hres = hc.infer(m, [hi], outputs=outs)
            got = hres.as_numpy(output_name)
            hard(got is not None and got.shape == expect.shape
                 and np.allclose(got, expect, atol=tol, rtol=0),
                 f"{server.label} HTTP (tritonclient, binary_data={binary}) {output_name} ="
                 f" {None if got is None else got.tolist()}")
            facts[f"http_tritonclient_binary_{binary}"] = "ok"
        except Exception as e:
            facts[f"http_tritonclient_binary_{binary}"] = f"refused: {e}"
            log(f"  info  HTTP tritonclient binary_data={binary} refused: {str(e)[:200]}")
            if not binary:
                hard(False, f"{server.label} HTTP (tritonclient, JSON) request")
    hc.close()

    # --- REST routes ---
    body = {"inputs": [{"name": input_name, "datatype": datatype, "shape": list(x.shape),
                        "data": x.flatten().tolist()}]}
    routes = {}
    for method, path, b in (("GET", "/v2/health/live", None), ("GET", "/v2/health/ready", None),
                            ("GET", "/v2", None), ("GET", f"/v2/models/{m}", None),
                            ("GET", f"/v2/models/{m}/ready", None),
                            ("POST", f"/v2/models/{m}/infer", body),
                            ("POST", "/v2/repository/index", {}),
                            ("GET", "/v2/models/nope", None), ("GET", "/v2/models/nope/ready", None),
                            ("POST", "/v2/models/nope/infer", body)):
        try:
            status, text = http(method, server.http_base + path, b)
        except Exception as e:
            status, text = None, repr(e)
        routes[f"{method} {path}"] = {"status": status, "body": text[:300]}
        log(f"  info  {method} {path} -> {status} {text[:160]}")
    facts["rest"] = routes
    hard(routes[f"POST /v2/models/{m}/infer"]["status"] == 200, f"{server.label} REST infer 200")

    # --- latency: 200 sequential gRPC requests ---
    for label, fn in (("tritonclient", lambda: c.infer(m, [inp])),
                      ("raw stub", None)):
        if fn is None:
            ch = grpc.insecure_channel(server.grpc_url)
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            fn = lambda: stub.ModelInfer(req, timeout=10)  # noqa: E731
        for _ in range(10):
            fn()
        lat = []
        for _ in range(200):
            t0 = time.perf_counter()
            fn()
            lat.append((time.perf_counter() - t0) * 1000)
        lat.sort()
        q = {"p50_ms": round(statistics.median(lat), 3), "p90_ms": round(lat[179], 3),
             "p99_ms": round(lat[197], 3), "max_ms": round(lat[-1], 3)}
        facts[f"latency_{label.replace(' ', '_')}"] = q
        log(f"  info  200 sequential gRPC ModelInfer ({label}): p50 {q['p50_ms']} ms,"
            f" p90 {q['p90_ms']} ms, p99 {q['p99_ms']} ms, max {q['max_ms']} ms")
    c.close()

    # --- metrics ---
    status, text = http("GET", f"http://127.0.0.1:{server.metrics_port}/metrics")
    hard(status == 200, f"{server.label} metrics endpoint :{server.metrics_port}/metrics -> {status}")
    names = sorted({ln.split("{")[0].split(" ")[0] for ln in text.splitlines()
                    if ln and not ln.startswith("#")})
    keys = ("infer", "request", "queue", "batch", "exec")
    inference = [n for n in names if any(k in n for k in keys)]
    facts["metric_names_inference"] = inference
    facts["metric_samples"] = [ln for ln in text.splitlines()
                               if ln and not ln.startswith("#") and m in ln
                               and any(k in ln.split("{")[0] for k in keys)][:40]
    log(f"  info  inference metrics: {', '.join(inference)}")
    for ln in facts["metric_samples"][:12]:
        log(f"          {ln}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.environ.get("GPUPLANE_REAL_SERVERS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpuplane",
        "real-servers"))
    ap.add_argument("--triton-mode", choices=["explicit", "none", "both"], default="both",
                    help="explicit: --model-control-mode=explicit --load-model=double;"
                         " none: the plain repository (loads everything at start)")
    ap.add_argument("--serial", action="store_true",
                    help="start the servers one after the other (ready times alone)")
    ap.add_argument("--json", help="write what was seen to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)

    venv_bin = os.path.join(a.root, "venv", "bin")
    wrapper = os.path.join(a.root, "bin", "tritonserver")
    env = dict(os.environ)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    work = tempfile.mkdtemp(prefix="gpuplane-real-servers-")
    log(f"check: root {a.root}, work dir {work}")

    modes = ["explicit", "none"] if a.triton_mode == "both" else [a.triton_mode]
    try:
        repo = os.path.join(work, "triton-repo")
        triton_model.write_repo(repo, "double")
        hp, gp, mp = free_ports(3)
        mdir = os.path.join(work, "mlserver")
        mlserver_model.write_model(mdir, "lin", hp, gp, mp)
        mls = Server("mlserver", [os.path.join(venv_bin, "mlserver"), "start", mdir], mdir, env,
                     os.path.join(work, "mlserver.log"), "lin", hp, gp, mp)

        def triton(mode):
            hp, gp, mp = free_ports(3)
            cmd = [wrapper, f"--model-repository={repo}", f"--http-port={hp}",
                   f"--grpc-port={gp}", f"--metrics-port={mp}", "--http-address=127.0.0.1",
                   "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                   "--exit-timeout-secs=10"]
            if mode == "explicit":
                cmd += ["--model-control-mode=explicit", "--load-model=double"]
            return Server(f"triton[{mode}]", cmd, work, env,
                          os.path.join(work, f"triton-{mode}.log"), "double", hp, gp, mp)

        x32 = np.array([[1.0, 2.0, 3.0, 4.5]], dtype=np.float32)
        x64 = np.array([[1.0, 2.0], [2.0, 1.0], [0.5, -1.25]], dtype=np.float64)
        y64 = np.array([[mlserver_model.expected(*r)] for r in x64.tolist()], dtype=np.float64)

        def check_triton(t):
            FACTS[t.label] = f = {"command": t.cmd, "ready_s": round(t.ready_s, 2)}
            probe(t, f, input_name="INPUT0", datatype="FP32", np_dtype=np.float32, x=x32,
                  expect=2 * x32, output_name="OUTPUT0", tol=0.0, http_binary=True)

        def check_mlserver():
            FACTS["mlserver"] = f = {"command": mls.cmd, "ready_s": round(mls.ready_s, 2),
                                     "settings": json.load(open(os.path.join(mdir, "settings.json")))}
            # MLServer's sklearn runtime takes the first input whatever its name; the output of
            # predict() is named "predict".
            probe(mls, f, input_name="input-0", datatype="FP64", np_dtype=np.float64, x=x64,
                  expect=y64, output_name="predict", tol=1e-9, http_binary=True)

        first = triton(modes[0])
        if a.serial:
            first.start(); first.wait_ready()
            check_triton(first)
            first.stop()
            mls.start(); mls.wait_ready()
        else:
            first.start(); mls.start()
            first.wait_ready(); mls.wait_ready()
            check_triton(first)
        check_mlserver()
        mls.stop()
        first.stop()
        for mode in modes[1:]:
            t = triton(mode)
            t.start()
            t.wait_ready()
            check_triton(t)
            t.stop()
    except Exception as e:
        FAILURES.append(f"exception: {e!r}")
        log(f"check: ERROR {e}")
        for s in SERVERS:
            log(f"--- last lines of {s.label} log ({s.log_path}) ---\n{s.tail()}")
    finally:
        stop_all()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(FACTS, f, indent=2, default=str)
        if not a.keep and not FAILURES:
            import shutil
            shutil.rmtree(work, ignore_errors=True)

    log("")
    for k, v in FACTS.items():
        lat = v.get("latency_tritonclient", {})
        log(f"summary: {k}: ready {v.get('ready_s')} s after start; gRPC p50"
            f" {lat.get('p50_ms')} ms (tritonclient), {v.get('latency_raw_stub', {}).get('p50_ms')}"
            f" ms (raw stub)")
    log(f"check: {len(PASSED)} passed, {len(FAILURES)} failed")
    for f in FAILURES:
        log(f"check: FAILED: {f}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
