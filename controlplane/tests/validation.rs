//! Bad input over gRPC: each case gets the right code and field path, and nothing reaches
//! the Raft log.

mod common;

use common::*;
use proto::WriteMode;
use serde_json::json;

struct Case {
    what: &'static str,
    resource: proto::Resource,
    mode: WriteMode,
    code: tonic::Code,
    field: &'static str,
}

fn svc_spec(model: &str, slo: serde_json::Value) -> serde_json::Value {
    json!({"model": model, "slo": slo})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_refused_with_code_and_field_and_commits_nothing() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    client.put(service("existing", 10.0, 50.0), WriteMode::Create).await.unwrap();
    let mut stale = service("existing", 20.0, 50.0);
    stale.resource_version = 7;

    let cases = vec![
        Case {
            what: "negative rate",
            resource: resource("Service", "s", "acme", svc_spec("resnet50", json!({"latency_ms": 50, "request_rate": -3}))),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "spec.slo.request_rate",
        },
        Case {
            what: "zero rate",
            resource: resource("Service", "s", "acme", svc_spec("resnet50", json!({"latency_ms": 50, "request_rate": 0}))),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "spec.slo.request_rate",
        },
        Case {
            what: "zero latency",
            resource: resource("Service", "s", "acme", svc_spec("resnet50", json!({"latency_ms": 0, "request_rate": 5}))),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "spec.slo.latency_ms",
        },
        Case {
            what: "absurd latency",
            resource: resource("Service", "s", "acme", svc_spec("resnet50", json!({"latency_ms": 3.6e6, "request_rate": 5}))),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "spec.slo.latency_ms",
        },
        Case {
            what: "unknown model",
            resource: resource("Service", "s", "acme", svc_spec("llama-70b", json!({"latency_ms": 50, "request_rate": 5}))),
            mode: WriteMode::Create,
            code: tonic::Code::NotFound,
            field: "spec.model",
        },
        Case {
            what: "unknown GPU model",
            resource: resource("ModelProfile", "bert-h100", "", json!({"model": "bert", "gpu_model": "H100-80GB", "points": []})),
            mode: WriteMode::Create,
            code: tonic::Code::NotFound,
            field: "spec.gpu_model",
        },
        Case {
            what: "unknown instance type",
            resource: resource(
                "Service",
                "s",
                "acme",
                json!({"model": "resnet50", "slo": {"latency_ms": 50, "request_rate": 5}, "allowed_instance_types": ["p9.huge"]}),
            ),
            mode: WriteMode::Create,
            code: tonic::Code::NotFound,
            field: "spec.allowed_instance_types[0]",
        },
        Case {
            what: "unknown instance type on a node",
            resource: resource("Node", "host-1", "", json!({"address": "10.0.0.1:7500", "instance_type": "p9.huge"})),
            mode: WriteMode::Create,
            code: tonic::Code::NotFound,
            field: "spec.instance_type",
        },
        Case {
            what: "duplicate name",
            resource: service("existing", 10.0, 50.0),
            mode: WriteMode::Create,
            code: tonic::Code::AlreadyExists,
            field: "name",
        },
        Case {
            what: "stale resource_version",
            resource: stale,
            mode: WriteMode::Update,
            code: tonic::Code::FailedPrecondition,
            field: "resource_version",
        },
        Case {
            what: "unknown field",
            resource: resource(
                "Service",
                "s",
                "acme",
                json!({"model": "resnet50", "slo": {"latency_ms": 50, "request_rate": 5}, "replicas": 3}),
            ),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "spec.replicas",
        },
        Case {
            what: "iGniter coefficients without the figures Eq. 3 and 9 need",
            resource: resource(
                "GpuModel",
                "T4-16GB",
                "",
                json!({"sm_count": 40, "memory_gib": 16, "idle_power_w": 10, "max_power_w": 70, "max_frequency_mhz": 1590,
                       "igniter": {"alpha_f": -1.0, "alpha_sch": 0.005, "beta_sch": -0.01}}),
            ),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "spec.pcie_gbps",
        },
        Case {
            what: "iGniter frequency rising with power",
            resource: resource(
                "GpuModel",
                "T4-16GB",
                "",
                json!({"sm_count": 40, "memory_gib": 16, "idle_power_w": 10, "max_power_w": 70, "max_frequency_mhz": 1590,
                       "pcie_gbps": 16, "igniter": {"alpha_f": 2.0, "alpha_sch": 0.005, "beta_sch": -0.01}}),
            ),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "spec.igniter.alpha_f",
        },
        Case {
            what: "iGniter Eq. 11 denominator not positive",
            resource: resource(
                "ModelProfile",
                "resnet50-a100-igniter",
                "",
                json!({"model": "resnet50", "gpu_model": "A100-80GB", "igniter": {
                    "d_load_bytes": 150528, "d_feedback_bytes": 4096, "n_kernels": 0, "k_sch_ms": 0,
                    "k": [0.4, 105.0, -58.0, -5.0, 63.0], "alpha_power": 0, "beta_power": 0,
                    "alpha_cacheutil": 0, "beta_cacheutil": 0, "alpha_cache": 0}}),
            ),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "spec.igniter.k[3]",
        },
        Case {
            what: "malformed spec",
            resource: proto::Resource {
                kind: "Service".into(),
                name: "s".into(),
                tenant: "acme".into(),
                spec_json: "{\"model\": ".into(),
                ..Default::default()
            },
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "spec",
        },
        Case {
            what: "unknown kind",
            resource: resource("Pod", "p", "", json!({})),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "kind",
        },
        Case {
            what: "bad name",
            resource: service("no spaces allowed", 10.0, 50.0),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "name",
        },
        Case {
            what: "missing tenant",
            resource: resource("Service", "s", "", svc_spec("resnet50", json!({"latency_ms": 50, "request_rate": 5}))),
            mode: WriteMode::Create,
            code: tonic::Code::InvalidArgument,
            field: "tenant",
        },
        Case {
            what: "update of a missing resource",
            resource: service("missing", 10.0, 50.0),
            mode: WriteMode::Update,
            code: tonic::Code::NotFound,
            field: "name",
        },
    ];

    let leader = cluster.wait_leader().await;
    let before = cluster.node(leader).controller.status();
    let services_before = client.list("Service", "", false).await.unwrap().resources;
    for case in cases {
        // Through a follower too: forwarding must carry the error back unchanged.
        for target in [
            client.put(case.resource.clone(), case.mode).await,
            cluster.client_of(leader % 3 + 1).put(case.resource.clone(), case.mode).await,
        ] {
            let err = target.expect_err(case.what);
            assert_eq!(err.code(), case.code, "{}: {}", case.what, err.message());
            let field = err.metadata().get(proto::meta::FIELD).map(|v| v.to_str().unwrap().to_string());
            assert_eq!(field.as_deref(), Some(case.field), "{}: {}", case.what, err.message());
        }
    }
    let after = cluster.node(leader).controller.status();
    assert_eq!(before.last_log_index, after.last_log_index, "refused input must not reach the log");
    assert_eq!(services_before, client.list("Service", "", false).await.unwrap().resources);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_of_referenced_or_missing_resource_is_refused() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    let err = client.delete("GpuModel", "A100-80GB", 0).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("still referenced"), "{}", err.message());
    let err = client.delete("Service", "ghost", 0).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = client.delete("Tenant", "acme", 99).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(err.metadata().get(proto::meta::FIELD).unwrap(), "resource_version");
}
