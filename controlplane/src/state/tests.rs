use super::*;
use crate::resources::*;

fn put(id: &str, name: &str, tenant: &str, spec: Spec, mode: WriteMode, expected_version: u64) -> Request {
    Request {
        request_id: id.into(),
        command: Command::Put { name: name.into(), tenant: tenant.into(), spec, mode, expected_version },
        trace_parent: None,
    }
}

fn gpu_model() -> Spec {
    Spec::GpuModel(GpuModelSpec {
        sm_count: 108,
        memory_gib: 80.0,
        mig: None,
        mps: true,
        idle_power_w: None,
        max_power_w: None,
        max_frequency_mhz: None,
        pcie_gbps: None,
        igniter: None,
    })
}

fn instance_type(gpu: &str) -> Spec {
    Spec::InstanceType(InstanceTypeSpec {
        gpu_model: gpu.into(),
        gpu_count: 8,
        price_per_hour: 32.0,
        launch_latency_s: 120.0,
        cpu_cores: 96,
        memory_gib: 1152.0,
    })
}

fn service(model: &str, latency_ms: f64) -> Spec {
    Spec::Service(ServiceSpec {
        model: model.into(),
        slo: Slo { latency_ms, percentile: 99.0, request_rate: Some(100.0), autoscaling: None },
        allowed_gpu_models: vec![],
        allowed_instance_types: vec![],
        strategy: None,
        batch_distribution: None,
    })
}

fn profile(model: &str, gpu: &str) -> Spec {
    Spec::ModelProfile(ModelProfileSpec { model: model.into(), gpu_model: gpu.into(), points: vec![], igniter: Default::default() })
}

/// A state with a tenant, a GPU model, and a profile for `resnet50`.
fn seeded() -> (ClusterState, u64) {
    let mut s = ClusterState::default();
    let mut i = 0;
    for req in [
        put("t", "acme", "", Spec::Tenant(TenantSpec::default()), WriteMode::Create, 0),
        put("g", "A100-80GB", "", gpu_model(), WriteMode::Create, 0),
        put("p", "resnet50-a100", "", profile("resnet50", "A100-80GB"), WriteMode::Create, 0),
    ] {
        i += 1;
        s.apply(i, &req).0.unwrap();
    }
    (s, i)
}

#[test]
fn create_update_delete_bump_versions_and_revisions() {
    let (mut s, _) = seeded();
    let created = s.apply(10, &put("a", "svc1", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    assert_eq!(created.resource.resource_version, 1);
    assert_eq!(created.resource.create_revision, 10);
    let updated = s.apply(11, &put("b", "svc1", "acme", service("resnet50", 40.0), WriteMode::Update, 1)).0.unwrap();
    assert_eq!(updated.resource.resource_version, 2);
    assert_eq!(updated.resource.mod_revision, 11);
    assert_eq!(updated.resource.create_revision, 10);
    let (deleted, event) = s.apply(
        12,
        &Request {
            request_id: "c".into(),
            command: Command::Delete { kind: Kind::Service, name: "svc1".into(), expected_version: 2 },
            trace_parent: None,
        },
    );
    assert_eq!(deleted.unwrap().resource.resource_version, 2);
    assert_eq!(event.unwrap().change_type, ChangeType::Deleted);
    assert!(s.get(Kind::Service, "svc1").is_none());
    assert_eq!(s.revision(), 12);
}

#[test]
fn retried_request_id_applies_once() {
    let (mut s, _) = seeded();
    let req = put("same-id", "svc1", "acme", service("resnet50", 50.0), WriteMode::Upsert, 0);
    let (first, ev1) = s.apply(10, &req);
    let (second, ev2) = s.apply(11, &req);
    assert!(ev1.is_some());
    assert!(ev2.is_none(), "a duplicate must not produce a change");
    let (first, second) = (first.unwrap(), second.unwrap());
    assert!(!first.deduplicated && second.deduplicated);
    assert_eq!(second.resource.resource_version, 1, "applied once");
    assert_eq!(s.get(Kind::Service, "svc1").unwrap().resource_version, 1);
    // A refused request is remembered too: the retry gets the same refusal.
    let bad = put("bad-id", "svc2", "acme", service("unknown-model", 50.0), WriteMode::Create, 0);
    let e1 = s.apply(12, &bad).0.unwrap_err();
    let e2 = s.apply(13, &bad).0.unwrap_err();
    assert_eq!(e1, e2);
}

#[test]
fn stale_version_is_refused_and_changes_nothing() {
    let (mut s, _) = seeded();
    s.apply(10, &put("a", "svc1", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(11, &put("b", "svc1", "acme", service("resnet50", 45.0), WriteMode::Update, 1)).0.unwrap();
    let before = s.clone();
    let err = s.apply(12, &put("c", "svc1", "acme", service("resnet50", 30.0), WriteMode::Update, 1)).0.unwrap_err();
    assert_eq!(err.code, ErrorCode::FailedPrecondition);
    assert_eq!(err.field, "resource_version");
    assert_eq!(s.get(Kind::Service, "svc1"), before.get(Kind::Service, "svc1"));
}

#[test]
fn duplicate_create_and_missing_update_are_refused() {
    let (mut s, _) = seeded();
    let err = s.apply(10, &put("a", "acme", "", Spec::Tenant(TenantSpec::default()), WriteMode::Create, 0)).0.unwrap_err();
    assert_eq!((err.code, err.field.as_str()), (ErrorCode::AlreadyExists, "name"));
    let err = s.apply(11, &put("b", "nope", "acme", service("resnet50", 5.0), WriteMode::Update, 0)).0.unwrap_err();
    assert_eq!((err.code, err.field.as_str()), (ErrorCode::NotFound, "name"));
}

#[test]
fn references_must_exist() {
    let (s, _) = seeded();
    let cases = [
        (put("1", "s", "acme", service("bert", 50.0), WriteMode::Create, 0), ErrorCode::NotFound, "spec.model"),
        (put("2", "s", "ghost", service("resnet50", 50.0), WriteMode::Create, 0), ErrorCode::NotFound, "tenant"),
        (put("3", "s", "", service("resnet50", 50.0), WriteMode::Create, 0), ErrorCode::InvalidArgument, "tenant"),
        (put("4", "p4", "", instance_type("H100-80GB"), WriteMode::Create, 0), ErrorCode::NotFound, "spec.gpu_model"),
        (put("5", "m", "", profile("bert", "T4"), WriteMode::Create, 0), ErrorCode::NotFound, "spec.gpu_model"),
        (put("6", "g", "acme", gpu_model(), WriteMode::Create, 0), ErrorCode::InvalidArgument, "tenant"),
    ];
    for (req, code, field) in cases {
        let err = s.check(&req).unwrap_err();
        assert_eq!((err.code, err.field.as_str()), (code, field), "{req:?}: {err}");
        let mut copy = s.clone();
        assert!(copy.apply(99, &req).0.is_err());
        assert_eq!(copy.len(), s.len());
    }
    let mut svc = service("resnet50", 50.0);
    if let Spec::Service(sv) = &mut svc {
        sv.allowed_gpu_models = vec!["A100-80GB".into(), "V100".into()];
    }
    let err = s.check(&put("7", "s", "acme", svc, WriteMode::Create, 0)).unwrap_err();
    assert_eq!(err.field, "spec.allowed_gpu_models[1]");
}

#[test]
fn referenced_resources_cannot_be_deleted() {
    let (mut s, _) = seeded();
    let del = |kind, name: &str| Request {
        request_id: uuid::Uuid::new_v4().to_string(),
        command: Command::Delete { kind, name: name.into(), expected_version: 0 },
        trace_parent: None,
    };
    let err = s.apply(10, &del(Kind::GpuModel, "A100-80GB")).0.unwrap_err();
    assert_eq!(err.code, ErrorCode::FailedPrecondition);
    assert!(err.reason.contains("ModelProfile \"resnet50-a100\""), "{}", err.reason);
    s.apply(11, &del(Kind::ModelProfile, "resnet50-a100")).0.unwrap();
    s.apply(12, &del(Kind::GpuModel, "A100-80GB")).0.unwrap();
}

#[test]
fn status_update_keeps_spec() {
    let (mut s, _) = seeded();
    let req = Request {
        request_id: "st".into(),
        command: Command::PutStatus {
            kind: Kind::GpuModel,
            name: "A100-80GB".into(),
            status: serde_json::json!({"seen": 3}),
            expected_version: 1,
        },
        trace_parent: None,
    };
    let out = s.apply(10, &req).0.unwrap();
    assert_eq!(out.resource.resource_version, 2);
    assert_eq!(out.resource.spec, gpu_model());
    assert_eq!(out.resource.status["seen"], 3);
}

#[test]
fn dedup_window_is_bounded() {
    let (mut s, mut i) = seeded();
    for n in 0..(DEDUP_WINDOW + 10) {
        i += 1;
        let req = Request {
            request_id: format!("r{n}"),
            command: Command::PutStatus { kind: Kind::Tenant, name: "acme".into(), status: serde_json::json!(n), expected_version: 0 },
            trace_parent: None,
        };
        s.apply(i, &req).0.unwrap();
    }
    assert!(s.applied_outcome("r0").is_none());
    assert!(s.applied_outcome(&format!("r{}", DEDUP_WINDOW + 9)).is_some());
    assert_eq!(s.applied_requests.len(), DEDUP_WINDOW);
}
