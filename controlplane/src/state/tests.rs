use super::*;
use crate::resources::*;

pub(crate) fn put(id: &str, name: &str, tenant: &str, spec: Spec, mode: WriteMode, expected_version: u64) -> Request {
    Request {
        request_id: id.into(),
        command: Command::Put { name: name.into(), tenant: tenant.into(), spec, mode, expected_version },
        trace_parent: None,
    }
}

pub(crate) fn gpu_model() -> Spec {
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
        max_instances: None,
    })
}

pub(crate) fn service(model: &str, latency_ms: f64) -> Spec {
    Spec::Service(ServiceSpec {
        model: model.into(),
        slo: Slo { latency_ms, percentile: 99.0, request_rate: Some(100.0), autoscaling: None },
        allowed_gpu_models: vec![],
        allowed_instance_types: vec![],
        strategy: None,
        batch_distribution: None,
        priority: 0,
        inference_tokens: vec![],
        runtime: None,
        model_uri: None,
    })
}

fn profile(model: &str, gpu: &str) -> Spec {
    Spec::ModelProfile(ModelProfileSpec { model: model.into(), gpu_model: gpu.into(), points: vec![], igniter: Default::default() })
}

/// A state with a tenant, a GPU model, and a profile for `resnet50`.
pub(crate) fn seeded() -> (ClusterState, u64) {
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
    // A version starts at the creating entry's index and counts the entries that change it.
    assert_eq!(created.resource.resource_version, 10);
    assert_eq!(created.resource.create_revision, 10);
    let updated = s.apply(11, &put("b", "svc1", "acme", service("resnet50", 40.0), WriteMode::Update, 10)).0.unwrap();
    assert_eq!(updated.resource.resource_version, 11);
    assert_eq!(updated.resource.mod_revision, 11);
    assert_eq!(updated.resource.create_revision, 10);
    let (deleted, events) = s.apply(
        12,
        &Request {
            request_id: "c".into(),
            command: Command::Delete { kind: Kind::Service, name: "svc1".into(), expected_version: 11 },
            trace_parent: None,
        },
    );
    assert_eq!(deleted.unwrap().resource.resource_version, 11);
    assert_eq!(events.iter().map(|e| e.change_type).collect::<Vec<_>>(), [ChangeType::Deleted]);
    assert!(s.get(Kind::Service, "svc1").is_none());
    assert_eq!(s.revision(), 12);
}

#[test]
fn a_stale_compare_and_set_never_matches_a_resource_deleted_and_created_again() {
    let (mut s, _) = seeded();
    let first = s.apply(10, &put("a", "svc1", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    let del = Request {
        request_id: "b".into(),
        command: Command::Delete { kind: Kind::Service, name: "svc1".into(), expected_version: 0 },
        trace_parent: None,
    };
    s.apply(11, &del).0.unwrap();
    let again = s.apply(12, &put("c", "svc1", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    assert_ne!(again.resource.resource_version, first.resource.resource_version);
    // A writer that read the first svc1 is refused on the second (ABA).
    let stale = put("d", "svc1", "acme", service("resnet50", 10.0), WriteMode::Update, first.resource.resource_version);
    let err = s.apply(13, &stale).0.unwrap_err();
    assert_eq!((err.code, err.field.as_str()), (ErrorCode::FailedPrecondition, "resource_version"));
}

#[test]
fn retried_request_id_applies_once() {
    let (mut s, _) = seeded();
    let req = put("same-id", "svc1", "acme", service("resnet50", 50.0), WriteMode::Upsert, 0);
    let (first, ev1) = s.apply(10, &req);
    let (second, ev2) = s.apply(11, &req);
    assert_eq!(ev1.len(), 1);
    assert!(ev2.is_empty(), "a duplicate must not produce a change");
    let (first, second) = (first.unwrap(), second.unwrap());
    assert!(!first.deduplicated && second.deduplicated);
    assert_eq!(second.resource.resource_version, 10, "applied once");
    assert_eq!(s.get(Kind::Service, "svc1").unwrap().resource_version, 10);
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
    s.apply(11, &put("b", "svc1", "acme", service("resnet50", 45.0), WriteMode::Update, 10)).0.unwrap();
    let before = s.clone();
    let err = s.apply(12, &put("c", "svc1", "acme", service("resnet50", 30.0), WriteMode::Update, 10)).0.unwrap_err();
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
    let version = s.get(Kind::GpuModel, "A100-80GB").unwrap().resource_version;
    let req = Request {
        request_id: "st".into(),
        command: Command::PutStatus {
            kind: Kind::GpuModel,
            name: "A100-80GB".into(),
            status: serde_json::json!({"seen": 3}).into(),
            expected_version: version,
        },
        trace_parent: None,
    };
    let out = s.apply(10, &req).0.unwrap();
    assert_eq!(out.resource.resource_version, version + 1);
    assert_eq!(out.resource.spec, gpu_model());
    assert_eq!(out.resource.status.field("seen"), Some(serde_json::json!(3)));
}

#[test]
fn put_statuses_writes_each_existing_resource_skips_the_missing_and_refuses_out_of_bounds() {
    use crate::resources::limits::MAX_STATUSES_PER_ENTRY;
    let (mut s, _) = seeded();
    let statuses = |names: &[&str]| Request {
        request_id: String::new(),
        command: Command::PutStatuses {
            kind: Kind::Tenant,
            statuses: names.iter().map(|n| StatusPut { name: n.to_string(), status: serde_json::json!({"seen": n}).into() }).collect(),
        },
        trace_parent: None,
    };
    let before = s.get(Kind::Tenant, "acme").unwrap().resource_version;
    let (out, events) = s.apply(10, &statuses(&["gone", "acme"]));
    let out = out.unwrap();
    assert_eq!(out.batch.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), vec!["acme"], "the missing one is skipped");
    assert_eq!(events.len(), 1);
    let acme = s.get(Kind::Tenant, "acme").unwrap();
    assert_eq!((acme.status.field("seen"), acme.resource_version, acme.mod_revision), (Some(serde_json::json!("acme")), before + 1, 10));

    let none = s.apply(11, &statuses(&["gone", "also-gone"])).0.unwrap_err();
    assert_eq!((none.code, none.field.as_str()), (ErrorCode::NotFound, "statuses"));
    for names in [vec![], vec!["acme"; MAX_STATUSES_PER_ENTRY + 1]] {
        let request = statuses(&names);
        let err = s.check(&request).unwrap_err();
        assert_eq!(err.field, "statuses", "{err:?}");
        assert!(err.reason.contains(&format!("{} statuses", names.len())), "{}", err.reason);
        assert!(s.apply(12, &request).0.is_err());
    }
    assert_eq!(s.get(Kind::Tenant, "acme").unwrap().resource_version, before + 1, "refused entries change nothing");
    // At the bound: accepted.
    let full = statuses(&vec!["acme"; MAX_STATUSES_PER_ENTRY]);
    assert!(s.check(&full).is_ok());
    assert_eq!(s.apply(13, &full).0.unwrap().batch.len(), MAX_STATUSES_PER_ENTRY);
}

#[test]
fn an_applied_status_is_shared_by_the_state_and_its_event_not_copied() {
    // Applies run under the state lock that every report's check waits for: a Node's status
    // is a few KB, and copying it per event held the lock ~100 ms for an entry of 64
    // statuses at 10,000 hosts.
    let (mut s, _) = seeded();
    let status = crate::resources::StatusJson::from(serde_json::json!({"gpus": [{"workloads": [{"service": "web"}]}]}));
    let request = Request {
        request_id: String::new(),
        command: Command::PutStatuses { kind: Kind::Tenant, statuses: vec![StatusPut { name: "acme".into(), status: status.clone() }] },
        trace_parent: None,
    };
    let (out, events) = s.apply(10, &request);
    out.unwrap();
    let stored = &s.get(Kind::Tenant, "acme").unwrap().status;
    assert!(stored.is_shared_with(&status), "the state holds the request's status");
    assert!(events[0].resource.status.is_shared_with(&status), "so does the change event");
}

#[test]
fn dedup_window_is_bounded() {
    let (mut s, mut i) = seeded();
    for n in 0..(DEDUP_WINDOW + 10) {
        i += 1;
        let req = Request {
            request_id: format!("r{n}"),
            command: Command::PutStatus {
                kind: Kind::Tenant,
                name: "acme".into(),
                status: serde_json::json!(n).into(),
                expected_version: 0,
            },
            trace_parent: None,
        };
        s.apply(i, &req).0.unwrap();
    }
    assert!(s.applied_outcome("r0").is_none());
    assert!(s.applied_outcome(&format!("r{}", DEDUP_WINDOW + 9)).is_some());
    assert_eq!(s.applied_requests.len(), DEDUP_WINDOW);
}

pub(crate) fn plan(gpus: &[(&str, &str, &str, u32)]) -> Spec {
    Spec::Plan(PlanSpec {
        strategy: "t".into(),
        gpus: gpus.iter().map(|&(node, uuid, service, batch)| crate::resources::test_gpu(node, uuid, service, batch)).collect(),
        ..PlanSpec::default()
    })
}

fn versions(s: &ClusterState, nodes: &[&str]) -> Vec<u64> {
    nodes.iter().map(|n| s.desired().version(n)).collect()
}

#[test]
fn a_plan_change_gives_a_new_desired_version_to_the_nodes_it_changes_and_no_other() {
    let (mut s, _) = seeded();
    s.apply(10, &put("s1", "web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(11, &put("s2", "api", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    let first = plan(&[("n1", "G1", "web", 8), ("n2", "G2", "api", 8), ("n3", "G3", "web", 8)]);
    s.apply(20, &put("p1", "current", "", first, WriteMode::Upsert, 0)).0.unwrap();
    assert_eq!(versions(&s, &["n1", "n2", "n3", "n4"]), vec![20, 20, 20, 0]);
    assert_eq!(s.take_touched_nodes().into_iter().collect::<Vec<_>>(), vec!["n1", "n2", "n3"]);

    // n2's batch changes, n3's work moves to n4: n1 keeps its version and is not touched.
    let second = plan(&[("n1", "G1", "web", 8), ("n2", "G2", "api", 16), ("n4", "G4", "web", 8)]);
    s.apply(21, &put("p2", "current", "", second, WriteMode::Upsert, 0)).0.unwrap();
    assert_eq!(versions(&s, &["n1", "n2", "n3", "n4"]), vec![20, 21, 21, 21]);
    assert_eq!(s.take_touched_nodes().into_iter().collect::<Vec<_>>(), vec!["n2", "n3", "n4"]);
    assert_eq!(s.desired().assignments("n3").count(), 0, "n3's work is gone");
    assert_eq!(s.desired().assignments("n2").next().map(|(_, g)| g.workloads[0].batch), Some(16));

    // A status write on a Service changes nothing agents are told; its SLO does, on its nodes only.
    let status = Request {
        request_id: "st".into(),
        command: Command::PutStatus {
            kind: Kind::Service,
            name: "web".into(),
            status: serde_json::json!({"x": 1}).into(),
            expected_version: 0,
        },
        trace_parent: None,
    };
    s.apply(22, &status).0.unwrap();
    assert!(s.take_touched_nodes().is_empty());
    s.apply(23, &put("s3", "web", "acme", service("resnet50", 40.0), WriteMode::Update, 0)).0.unwrap();
    assert_eq!(versions(&s, &["n1", "n2", "n3", "n4"]), vec![23, 21, 21, 23]);
    assert_eq!(s.take_touched_nodes().into_iter().collect::<Vec<_>>(), vec!["n1", "n4"]);

    // Deleting the plan empties every node it placed work on, each at a new version.
    let delete = Request {
        request_id: "d".into(),
        command: Command::Delete { kind: Kind::Plan, name: "current".into(), expected_version: 0 },
        trace_parent: None,
    };
    s.apply(24, &delete).0.unwrap();
    assert_eq!(versions(&s, &["n1", "n2", "n3", "n4"]), vec![24, 24, 21, 24]);
    assert_eq!(s.desired().assignments("n1").count(), 0);
}

#[test]
fn a_change_of_a_services_callers_reaches_its_nodes_and_only_them() {
    let (mut s, _) = seeded();
    s.apply(10, &put("s1", "web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(11, &put("s2", "api", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(20, &put("p1", "current", "", plan(&[("n1", "G1", "web", 8), ("n2", "G2", "api", 8)]), WriteMode::Upsert, 0)).0.unwrap();
    s.take_touched_nodes();
    let with_tokens = |tokens: &[&str]| {
        let Spec::Service(mut spec) = service("resnet50", 50.0) else { unreachable!() };
        spec.inference_tokens = tokens.iter().map(|t| crate::security::hash_token(t)).collect();
        Spec::Service(spec)
    };
    // Listing a caller, then revoking it: each is a new version of web's node, never api's.
    s.apply(21, &put("t1", "web", "acme", with_tokens(&["a", "b"]), WriteMode::Update, 0)).0.unwrap();
    assert_eq!(versions(&s, &["n1", "n2"]), vec![21, 20]);
    s.apply(22, &put("t2", "web", "acme", with_tokens(&["a"]), WriteMode::Update, 0)).0.unwrap();
    assert_eq!(versions(&s, &["n1", "n2"]), vec![22, 20]);
    assert_eq!(s.take_touched_nodes().into_iter().collect::<Vec<_>>(), vec!["n1"]);
    let desired = crate::agents::desired_state(&s, "n1");
    assert_eq!(desired.gpus[0].workloads[0].inference_tokens, vec![crate::security::hash_token("a")]);
}

fn runtime(program: &str) -> Spec {
    Spec::ServingRuntime(ServingRuntimeSpec {
        protocol: RuntimeProtocol::OpenInferenceGrpc,
        program: program.into(),
        args: vec!["--grpc-port={port}".into(), "--model-repository={model_uri}".into()],
        env: Default::default(),
        metrics_path: None,
        cold_start_s: 8.0,
        model_control: ModelControl::Launch,
    })
}

fn served_by(runtime: Option<&str>, model_uri: Option<&str>) -> Spec {
    let Spec::Service(mut spec) = service("resnet50", 50.0) else { unreachable!() };
    spec.runtime = runtime.map(String::from);
    spec.model_uri = model_uri.map(String::from);
    Spec::Service(spec)
}

#[test]
fn a_services_runtime_must_exist_is_fixed_while_used_cannot_go_and_reaches_its_nodes() {
    let (mut s, _) = seeded();
    let err = s.check(&put("s0", "web", "acme", served_by(Some("triton"), None), WriteMode::Create, 0)).unwrap_err();
    assert_eq!((err.code, err.field.as_str()), (ErrorCode::NotFound, "spec.runtime"), "{err}");
    s.apply(10, &put("r1", "triton", "", runtime("tritonserver"), WriteMode::Create, 0)).0.unwrap();
    // Not used yet: it may change.
    s.apply(11, &put("r2", "triton", "", runtime("/opt/tritonserver"), WriteMode::Update, 0)).0.unwrap();
    s.apply(12, &put("s1", "web", "acme", served_by(Some("triton"), Some("/models")), WriteMode::Create, 0)).0.unwrap();
    s.apply(13, &put("p1", "current", "", plan(&[("n1", "G1", "web", 8)]), WriteMode::Upsert, 0)).0.unwrap();
    let desired = crate::agents::desired_state(&s, "n1");
    let w = &desired.gpus[0].workloads[0];
    assert_eq!((w.runtime.as_str(), w.model_uri.as_str()), ("triton", "/models"));
    assert_eq!(desired.runtimes.len(), 1);
    assert_eq!(desired.runtimes[0].name, "triton");
    assert!(desired.runtimes[0].spec_json.contains("/opt/tritonserver"), "{}", desired.runtimes[0].spec_json);
    // Used: it cannot change (an identical write passes) nor go.
    let err = s.check(&put("r3", "triton", "", runtime("tritonserver-2"), WriteMode::Update, 0)).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailedPrecondition);
    assert!(err.reason.contains("in use by Service \"web\""), "{}", err.reason);
    s.check(&put("r4", "triton", "", runtime("/opt/tritonserver"), WriteMode::Update, 0)).unwrap();
    let del = Request {
        request_id: "d1".into(),
        command: Command::Delete { kind: Kind::ServingRuntime, name: "triton".into(), expected_version: 0 },
        trace_parent: None,
    };
    let err = s.check(&del).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailedPrecondition);
    // Moving the service to another model location is a new version of its node.
    s.take_touched_nodes();
    s.apply(14, &put("s2", "web", "acme", served_by(Some("triton"), Some("/models-v2")), WriteMode::Update, 0)).0.unwrap();
    assert_eq!(versions(&s, &["n1"]), vec![14]);
    // Once no service names it, it can go.
    s.apply(15, &put("s3", "web", "acme", served_by(None, None), WriteMode::Update, 0)).0.unwrap();
    assert!(crate::agents::desired_state(&s, "n1").runtimes.is_empty());
    s.apply(16, &del).0.unwrap();
}

#[test]
fn a_change_to_one_plan_keeps_what_another_plan_places_on_the_same_node() {
    let (mut s, _) = seeded();
    s.apply(10, &put("s1", "web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(11, &put("s2", "api", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(20, &put("p1", "mps", "", plan(&[("n1", "G1", "web", 8)]), WriteMode::Upsert, 0)).0.unwrap();
    s.apply(21, &put("p2", "mig", "", plan(&[("n1", "G2", "api", 4)]), WriteMode::Upsert, 0)).0.unwrap();
    let held = |c: &ClusterState| {
        c.desired().assignments("n1").map(|(p, g)| (p.to_string(), g.gpu_uuid.clone(), g.workloads[0].batch)).collect::<Vec<_>>()
    };
    let before = s.clone();
    s.apply(22, &put("p3", "mps", "", plan(&[("n1", "G1", "web", 2)]), WriteMode::Upsert, 0)).0.unwrap();
    assert_eq!(held(&s), [("mig".to_string(), "G2".to_string(), 4), ("mps".to_string(), "G1".to_string(), 2)]);
    assert_eq!(
        held(&before),
        [("mig".to_string(), "G2".to_string(), 4), ("mps".to_string(), "G1".to_string(), 8)],
        "a copy taken before is unchanged"
    );
    let delete = Request {
        request_id: "d".into(),
        command: Command::Delete { kind: Kind::Plan, name: "mps".into(), expected_version: 0 },
        trace_parent: None,
    };
    s.apply(23, &delete).0.unwrap();
    assert_eq!(held(&s), [("mig".to_string(), "G2".to_string(), 4)]);
    assert_eq!(versions(&s, &["n1"]), vec![23]);
}

#[test]
fn the_desired_index_survives_a_snapshot_round_trip() {
    let (mut s, _) = seeded();
    s.apply(10, &put("s1", "web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(20, &put("p1", "current", "", plan(&[("n1", "G1", "web", 8), ("n2", "G2", "web", 8)]), WriteMode::Upsert, 0)).0.unwrap();
    s.apply(21, &put("p2", "current", "", plan(&[("n1", "G1", "web", 8), ("n2", "G2", "web", 4)]), WriteMode::Upsert, 0)).0.unwrap();
    let restored: ClusterState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(restored, s);
    assert_eq!(versions(&restored, &["n1", "n2"]), vec![20, 21]);
    let held = |c: &ClusterState| c.desired().assignments("n2").map(|(p, g)| (p.to_string(), g.clone())).collect::<Vec<_>>();
    assert_eq!(held(&restored), held(&s));
    // A change after the restore moves the same nodes as on a replica that never restored.
    let mut replica = s.clone();
    let mut restored = restored;
    let third = plan(&[("n1", "G1", "web", 2), ("n2", "G2", "web", 4)]);
    for c in [&mut replica, &mut restored] {
        c.take_touched_nodes();
        c.apply(30, &put("p3", "current", "", third.clone(), WriteMode::Upsert, 0)).0.unwrap();
    }
    assert_eq!(restored.take_touched_nodes(), replica.take_touched_nodes());
    assert_eq!(versions(&restored, &["n1", "n2"]), vec![30, 21]);
}

fn patch_request(id: &str, patch: PlanPatch, expected_version: u64) -> Request {
    Request { request_id: id.into(), command: Command::PatchPlan { name: "current".into(), patch, expected_version }, trace_parent: None }
}

#[test]
fn a_plan_patch_changes_only_what_it_names_and_only_on_the_version_it_was_computed_from() {
    let (mut s, _) = seeded();
    s.apply(10, &put("s1", "web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    let base = plan(&[("n2", "G2", "web", 8), ("n1", "G1", "web", 8), ("n3", "G3", "web", 8)]);
    let stored = s.apply(20, &put("p1", "current", "", base, WriteMode::Create, 0)).0.unwrap().resource;
    let Spec::Plan(current) = &stored.spec else { panic!("a plan") };
    assert_eq!(current.gpus.iter().map(|g| g.node.as_str()).collect::<Vec<_>>(), vec!["n1", "n2", "n3"], "stored in node order");
    s.take_touched_nodes();

    let Spec::Plan(mut next) = plan(&[("n1", "G1", "web", 8), ("n2", "G2", "web", 32), ("n3", "G3", "web", 8)]) else { unreachable!() };
    next.normalise();
    let patch = current.diff(&next);
    assert_eq!(patch.set_gpus.len(), 1);
    // Computed from a version the plan is not at (7): refused, and nothing changes.
    let stale = s.apply(21, &patch_request("q0", patch.clone(), 7)).0.unwrap_err();
    assert_eq!((stale.code, stale.field.as_str()), (ErrorCode::FailedPrecondition, "resource_version"));
    let patched = s.apply(22, &patch_request("q1", patch, 20)).0.unwrap().resource;
    let Spec::Plan(now) = &patched.spec else { panic!("a plan") };
    assert_eq!(*now, next);
    assert_eq!(patched.resource_version, 21, "one entry, one version more");
    assert_eq!(s.take_touched_nodes().into_iter().collect::<Vec<_>>(), vec!["n2"]);
    assert_eq!(versions(&s, &["n1", "n2", "n3"]), vec![20, 22, 20]);

    // A patch is checked like a plan, naming the field in the patch.
    let mut bad = PlanPatch { strategy: "t".into(), ..PlanPatch::default() };
    let Spec::Plan(with_bad_batch) = plan(&[("n1", "G1", "web", 0)]) else { unreachable!() };
    bad.set_gpus = with_bad_batch.gpus.iter().cloned().collect();
    let err = s.apply(23, &patch_request("q2", bad, 0)).0.unwrap_err();
    assert_eq!(err.field, "patch.set_gpus[0].workloads[0].batch");
    // And a patch needs a plan to patch.
    let missing = Request {
        request_id: "q3".into(),
        command: Command::PatchPlan { name: "other".into(), patch: PlanPatch::default(), expected_version: 0 },
        trace_parent: None,
    };
    assert_eq!(s.apply(24, &missing).0.unwrap_err().code, ErrorCode::NotFound);
}

#[test]
fn a_plan_that_names_one_gpu_twice_is_refused() {
    let (mut s, _) = seeded();
    s.apply(10, &put("s1", "web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    let twice = plan(&[("n1", "G1", "web", 8), ("n1", "G1", "web", 4)]);
    let err = s.apply(11, &put("p1", "current", "", twice, WriteMode::Create, 0)).0.unwrap_err();
    assert_eq!(err.field, "spec.gpus[1].gpu_uuid");
}

#[test]
fn a_plan_patch_is_bounded_like_a_plan() {
    use crate::resources::limits::MAX_PLAN_GPUS;
    let (mut s, _) = seeded();
    s.apply(10, &put("s1", "web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(11, &put("p1", "current", "", plan(&[("n1", "G1", "web", 8)]), WriteMode::Create, 0)).0.unwrap();
    let gpu = crate::resources::test_gpu("n1", "G", "web", 8);
    // A patch that could make the plan (one GPU now) just reach the bound passes the size
    // checks (its entries are still checked: these name one GPU many times); one more GPU is
    // refused before any entry is looked at.
    let at_bound = PlanPatch { strategy: "t".into(), set_gpus: vec![gpu.clone(); MAX_PLAN_GPUS - 1], ..PlanPatch::default() };
    let err = s.apply(12, &patch_request("b0", at_bound, 0)).0.unwrap_err();
    assert_eq!(err.field, "patch.set_gpus[1].gpu_uuid", "{err:?}");
    let over = PlanPatch { strategy: "t".into(), set_gpus: vec![gpu; MAX_PLAN_GPUS], ..PlanPatch::default() };
    let err = s.apply(13, &patch_request("b1", over, 0)).0.unwrap_err();
    assert_eq!(err.field, "patch.set_gpus", "{err:?}");
    let removals =
        PlanPatch { strategy: "t".into(), remove_gpus: vec![("n1".into(), "G".into()); MAX_PLAN_GPUS + 1], ..PlanPatch::default() };
    assert_eq!(s.apply(14, &patch_request("b2", removals, 0)).0.unwrap_err().field, "patch.remove_gpus");
}

fn batch(id: &str, puts: Vec<Request>) -> Request {
    Request { request_id: id.into(), command: Command::Batch { puts: puts.into_iter().map(|r| r.command).collect() }, trace_parent: None }
}

#[test]
fn a_batch_applies_every_put_in_order_as_one_entry() {
    let (mut s, _) = seeded();
    s.apply(10, &put("t-beta", "beta", "", Spec::Tenant(Default::default()), WriteMode::Create, 0)).0.unwrap();
    let puts = vec![
        put("", "svc1", "acme", service("resnet50", 50.0), WriteMode::Create, 0),
        // Sees the put before it: an update of the service the batch just created.
        put("", "svc1", "acme", service("resnet50", 40.0), WriteMode::Update, 11),
        put("", "svc2", "beta", service("resnet50", 30.0), WriteMode::Upsert, 0),
    ];
    let (outcome, events) = s.apply(11, &batch("b1", puts));
    let outcome = outcome.unwrap();
    let written: Vec<_> = outcome.batch.iter().map(|b| (b.name.as_str(), b.resource_version)).collect();
    // One entry, one version: the batch is applied whole, so no one saw svc1 between.
    assert_eq!(written, [("svc1", 11), ("svc1", 11), ("svc2", 11)]);
    assert_eq!(outcome.resource.name, "svc2");
    assert_eq!(
        events.iter().map(|e| (e.change_type, e.revision)).collect::<Vec<_>>(),
        [(ChangeType::Added, 11), (ChangeType::Modified, 11), (ChangeType::Added, 11)]
    );
    let Spec::Service(svc1) = &s.get(Kind::Service, "svc1").unwrap().spec else { panic!("a service") };
    assert_eq!(svc1.slo.latency_ms, 40.0);
    // Retried: the recorded outcome, nothing applied twice.
    let (again, events) = s.apply(12, &batch("b1", vec![put("", "svc3", "acme", service("resnet50", 50.0), WriteMode::Create, 0)]));
    assert!(again.unwrap().deduplicated && events.is_empty());
    assert!(s.get(Kind::Service, "svc3").is_none());
}

#[test]
fn a_batch_with_one_refused_put_changes_nothing_and_names_the_put() {
    let (mut s, _) = seeded();
    let before = s.clone();
    let puts = vec![
        put("", "svc1", "acme", service("resnet50", 50.0), WriteMode::Create, 0),
        put("", "svc2", "acme", service("unknown-model", 50.0), WriteMode::Create, 0),
    ];
    let request = batch("b2", puts);
    let refused = s.check(&request).unwrap_err();
    assert!(refused.field.starts_with("puts[1]."), "the refusal names the put: {refused:?}");
    let (outcome, events) = s.apply(10, &request);
    assert_eq!(outcome.unwrap_err(), refused);
    assert!(events.is_empty());
    assert!(s.get(Kind::Service, "svc1").is_none(), "the first put is not applied alone");
    assert_eq!(s.list(Kind::Service).count(), before.list(Kind::Service).count());
}

#[test]
fn a_batch_is_bounded_and_holds_puts_of_resources_other_than_plans_only() {
    let (s, _) = seeded();
    let svc = || put("", "svc1", "acme", service("resnet50", 50.0), WriteMode::Upsert, 0);
    let field = |r: Request| s.check(&r).map_err(|e| e.field).expect_err(&format!("{:?} is refused", r.request_id));
    assert_eq!(field(batch("empty", vec![])), "puts");
    assert_eq!(field(batch("long", (0..=crate::resources::limits::MAX_BATCH_PUTS).map(|_| svc()).collect())), "puts");
    let delete = Request {
        request_id: String::new(),
        command: Command::Delete { kind: Kind::Service, name: "svc1".into(), expected_version: 0 },
        trace_parent: None,
    };
    assert_eq!(field(batch("delete", vec![svc(), delete])), "puts[1]");
    let plan = put("", "current", "", Spec::Plan(Default::default()), WriteMode::Upsert, 0);
    assert_eq!(field(batch("plan", vec![plan])), "puts[0].kind");
    assert!(s.check(&batch("ok", (0..crate::resources::limits::MAX_BATCH_PUTS).map(|_| svc()).collect())).is_ok());
}

#[test]
fn a_resources_only_copy_holds_the_resources_then_and_none_of_the_later_changes() {
    let (mut s, i) = seeded();
    s.apply(i + 1, &put("a", "svc1", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    let copy = s.resources_only();
    s.apply(i + 2, &put("b", "svc2", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    assert_eq!(copy.count(Kind::Service), 1);
    assert_eq!(copy.get(Kind::Service, "svc1"), s.get(Kind::Service, "svc1"));
    assert_eq!((copy.revision(), s.count(Kind::Service)), (i + 1, 2));
    assert!(copy.applied_outcome("a").is_none(), "request records are not copied");
}

#[test]
fn requests_sharing_an_entry_apply_in_order_each_seeing_the_ones_before() {
    let (mut s, _) = seeded();
    let mut written = EntryWrites::default();
    // A tenant and a service of it, in one entry: the service sees the tenant.
    let tenant = put("e1", "beta", "", Spec::Tenant(TenantSpec::default()), WriteMode::Create, 0);
    let svc = put("e2", "svc-b", "beta", service("resnet50", 50.0), WriteMode::Create, 0);
    let (a, ev_a) = s.apply_in_entry(20, &tenant, &mut written);
    let (b, ev_b) = s.apply_in_entry(20, &svc, &mut written);
    assert_eq!(a.unwrap().resource.mod_revision, 20);
    assert_eq!(b.unwrap().resource.mod_revision, 20, "both carry the entry's index");
    assert_eq!((ev_a.len(), ev_b.len()), (1, 1));
    // Each keeps its own outcome: a refused one beside them changes nothing and is remembered.
    let bad = put("e3", "svc-c", "nobody", service("resnet50", 50.0), WriteMode::Create, 0);
    let (refused, ev) = s.apply_in_entry(20, &bad, &mut written);
    assert!(refused.is_err() && ev.is_empty());
    assert_eq!(s.applied_outcome("e3").cloned(), Some(refused));
}

#[test]
fn a_second_write_of_one_resource_in_an_entry_is_refused_and_its_retry_applies() {
    let (mut s, _) = seeded();
    let mut written = EntryWrites::default();
    let first = put("w1", "svc1", "acme", service("resnet50", 50.0), WriteMode::Upsert, 0);
    s.apply_in_entry(30, &first, &mut written).0.unwrap();
    // The same Service inside a batch of puts, in the same entry.
    let again = Request {
        request_id: "w2".into(),
        command: Command::Batch { puts: vec![put("x", "svc1", "acme", service("resnet50", 40.0), WriteMode::Upsert, 0).command] },
        trace_parent: None,
    };
    let (refused, events) = s.apply_in_entry(30, &again, &mut written);
    let e = refused.unwrap_err();
    assert_eq!(e.code, ErrorCode::FailedPrecondition);
    assert!(e.reason.contains(r#"Service "svc1" was written by an earlier request of the same log entry"#), "{e}");
    assert!(events.is_empty());
    assert_eq!(s.get(Kind::Service, "svc1").unwrap().resource_version, 30, "unchanged");
    // Not remembered: the same request in an entry of its own is applied.
    assert!(s.applied_outcome("w2").is_none());
    let (retried, _) = s.apply(31, &again);
    assert_eq!(retried.unwrap().resource.resource_version, 31);
}

#[test]
fn an_entry_holds_one_to_the_bound_of_requests() {
    use crate::resources::limits::MAX_REQUESTS_PER_ENTRY;
    let one = put("p", "svc1", "acme", service("resnet50", 50.0), WriteMode::Upsert, 0);
    assert!(Proposal::one(one.clone()).unwrap().check().is_ok());
    assert!(Proposal::new(vec![one.clone(); MAX_REQUESTS_PER_ENTRY]).unwrap().check().is_ok());
    let e = Proposal::new(vec![one; MAX_REQUESTS_PER_ENTRY + 1]).unwrap().check().unwrap_err();
    assert_eq!(e.field, "requests");
    assert!(e.reason.contains("257 requests in one log entry; an entry holds 1 to 256"), "{e}");
    assert!(Proposal::new(vec![]).unwrap().check().is_err());
}

#[test]
fn a_proposal_is_encoded_as_its_fields_and_decodes_to_the_same_requests() {
    let status = Request {
        request_id: "st".into(),
        command: Command::PutStatus {
            kind: Kind::Node,
            name: "n1".into(),
            status: serde_json::json!({"gpus": [1.5, "a\"b"]}).into(),
            expected_version: 0,
        },
        trace_parent: Some("00-x".into()),
    };
    let requests = vec![put("p", "svc1", "acme", service("resnet50", 50.0), WriteMode::Upsert, 0), status];
    let made = Proposal::new(requests.clone()).unwrap();
    let text = serde_json::to_string(&made).unwrap();
    // What the log and the peers held before a proposal kept its JSON (a derived encoding of
    // its one field): the same text.
    #[derive(serde::Serialize)]
    struct Derived<'a> {
        requests: &'a [Request],
    }
    assert_eq!(text, serde_json::to_string(&Derived { requests: &requests }).unwrap());
    let read: Proposal = serde_json::from_str(&text).unwrap();
    assert_eq!(read, made);
    assert_eq!(read.requests(), &requests[..]);
    assert_eq!(serde_json::to_string(&read).unwrap(), text, "written again as it was read");
    // Inside an entry (as the log stores it and peers send it), whitespace and all.
    let entry = serde_json::json!({"log_id": 1, "payload": {"Normal": serde_json::from_str::<serde_json::Value>(&text).unwrap()}});
    let pretty = serde_json::to_string_pretty(&entry).unwrap();
    #[derive(serde::Deserialize)]
    struct Entry {
        payload: std::collections::BTreeMap<String, Proposal>,
    }
    let decoded: Entry = serde_json::from_str(&pretty).unwrap();
    assert_eq!(decoded.payload["Normal"], made);
    // A malformed request is an error, not a proposal.
    let bad = r#"{"requests": [{"request_id": "a"}]}"#;
    let e = serde_json::from_str::<Proposal>(bad).unwrap_err().to_string();
    assert!(e.contains("missing field `command`"), "{e}");
}

#[test]
fn the_catalogue_holds_what_planning_a_service_alone_reads_and_no_services() {
    let (mut s, i) = seeded();
    s.apply(i + 1, &put("a", "svc1", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    let catalogue = s.catalogue_only();
    assert!(catalogue.get(Kind::Service, "svc1").is_none());
    for (kind, name) in [(Kind::Tenant, "acme"), (Kind::GpuModel, "A100-80GB"), (Kind::ModelProfile, "resnet50-a100")] {
        assert_eq!(catalogue.get(kind, name), s.get(kind, name), "{kind:?} {name}");
    }
    // A service put on it is the only one there.
    let what_if = catalogue.resources_with("svc2", "acme", service("resnet50", 40.0));
    assert_eq!(what_if.list(Kind::Service).map(|r| r.name.as_str()).collect::<Vec<_>>(), ["svc2"]);
    assert!(s.get(Kind::Service, "svc2").is_none(), "the state is not changed");
}

fn node(address: &str, instance_type: &str, uuids: &[&str]) -> Spec {
    Spec::Node(NodeSpec {
        address: address.into(),
        instance_type: instance_type.into(),
        gpus: uuids.iter().map(|u| NodeGpu { uuid: u.to_string(), model: "A100-80GB".into(), mig_enabled: true }).collect(),
        labels: Default::default(),
    })
}

/// `seeded` with instance types of 8 and 1 GPUs, and Node h1 owning GPUs u1 and u2.
fn with_node() -> ClusterState {
    let (mut s, i) = seeded();
    s.apply(i + 1, &put("it8", "p4d", "", instance_type("A100-80GB"), WriteMode::Create, 0)).0.unwrap();
    let Spec::InstanceType(mut one) = instance_type("A100-80GB") else { unreachable!() };
    one.gpu_count = 1;
    s.apply(i + 2, &put("it1", "g1", "", Spec::InstanceType(one), WriteMode::Create, 0)).0.unwrap();
    s.apply(i + 3, &put("h1", "h1", "", node("h1:9000", "p4d", &["u1", "u2"]), WriteMode::NodeRegistration, 0)).0.unwrap();
    s
}

#[test]
fn a_gpu_belongs_to_the_first_node_that_registers_it() {
    let mut s = with_node();
    let before = s.clone();
    // Another node claiming u2: refused, whoever writes it, and nothing changes.
    for (i, mode) in [WriteMode::NodeRegistration, WriteMode::Upsert].into_iter().enumerate() {
        let claim = put(&format!("h2-{i}"), "h2", "", node("h2:9000", "p4d", &["u3", "u2"]), mode, 0);
        assert!(s.check(&claim).is_err());
        let err = s.apply(20 + i as u64, &claim).0.unwrap_err();
        assert_eq!((err.code, err.field.as_str()), (ErrorCode::AlreadyExists, "spec.gpus[1].uuid"), "{err}");
        assert!(!err.reason.contains("h1"), "names the owner: {err}");
    }
    assert_eq!(s.get(Kind::Node, "h2"), None);
    assert_eq!(s.resources, before.resources);
    // In a batch too.
    let batch = batch("b", vec![put("", "h2", "", node("h2:9000", "p4d", &["u2"]), WriteMode::Upsert, 0)]);
    assert_eq!(s.apply(30, &batch).0.unwrap_err().field, "puts[0].spec.gpus[0].uuid");
    // The owner may list it again, and drop it; then it is free.
    s.apply(31, &put("h1b", "h1", "", node("h1:9000", "p4d", &["u1", "u2"]), WriteMode::NodeRegistration, 0)).0.unwrap();
    s.apply(32, &put("h1c", "h1", "", node("h1:9000", "p4d", &["u1"]), WriteMode::NodeRegistration, 0)).0.unwrap();
    s.apply(33, &put("h2", "h2", "", node("h2:9000", "p4d", &["u2"]), WriteMode::NodeRegistration, 0)).0.unwrap();
    assert_eq!(s.gpu_owners().owner("u2"), Some("h2"));
    // A deleted node frees its GPUs.
    let del = Request {
        request_id: "d".into(),
        command: Command::Delete { kind: Kind::Node, name: "h1".into(), expected_version: 0 },
        trace_parent: None,
    };
    s.apply(34, &del).0.unwrap();
    assert_eq!(s.gpu_owners().owner("u1"), None);
    // The index is rebuilt from a snapshot as it was.
    let restored: ClusterState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(restored.gpu_owners(), s.gpu_owners());
}

#[test]
fn a_nodes_registration_keeps_its_address_and_instance_type_and_its_gpus_fit_the_type() {
    let mut s = with_node();
    for (id, spec, field) in
        [("moved", node("victim:9000", "p4d", &["u1"]), "spec.address"), ("bigger", node("h1:9000", "g1", &["u1"]), "spec.instance_type")]
    {
        let err = s.apply(20, &put(id, "h1", "", spec, WriteMode::NodeRegistration, 0)).0.unwrap_err();
        assert_eq!((err.code, err.field.as_str()), (ErrorCode::FailedPrecondition, field), "{err}");
    }
    // An admin's write may move it.
    s.apply(21, &put("admin", "h1", "", node("h1-new:9000", "p4d", &["u1"]), WriteMode::Upsert, 0)).0.unwrap();
    // No more GPUs than the instance type has, at registration or by an admin.
    let many: Vec<String> = (0..9).map(|i| format!("m{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for mode in [WriteMode::NodeRegistration, WriteMode::Upsert] {
        let err = s.apply(22, &put("many", "h3", "", node("h3:9000", "p4d", &many), mode, 0)).0.unwrap_err();
        assert_eq!(err.field, "spec.gpus", "{err}");
        assert!(err.reason.contains("lists 9 GPUs; instance type \"p4d\" has 8"), "{err}");
    }
    let err = s.apply(23, &put("two", "h4", "", node("h4:9000", "g1", &["a", "b"]), WriteMode::NodeRegistration, 0)).0.unwrap_err();
    assert_eq!(err.field, "spec.gpus");
    // A registration mode is for Nodes only.
    let err = s.apply(24, &put("svc", "svc1", "acme", service("resnet50", 50.0), WriteMode::NodeRegistration, 0)).0.unwrap_err();
    assert_eq!(err.field, "mode");
}

#[test]
fn a_service_may_not_take_another_tenants_name_or_a_look_alike() {
    let (mut s, i) = seeded();
    s.apply(i + 1, &put("t-globex", "globex", "", Spec::Tenant(Default::default()), WriteMode::Create, 0)).0.unwrap();
    let before = s.clone();
    for name in ["globex-web", "Globex-Web", "gIobex-web", "gl0bex.web", "globex"] {
        let err = s.apply(20, &put(name, name, "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap_err();
        assert_eq!((err.code, err.field.as_str()), (ErrorCode::InvalidArgument, "name"), "{name}: {err}");
        assert!(!err.reason.contains("tenant \"globex\""), "{err}");
    }
    assert_eq!(s.resources, before.resources);
    // The owner takes its own; a prefix that only starts alike is no one's.
    s.apply(21, &put("own", "globex-web", "globex", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(22, &put("other", "globexy-web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    s.apply(23, &put("mine", "acme-web", "acme", service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap();
    // Look-alikes of an existing service are refused, in its tenant and outside it.
    for (name, tenant) in [("acme-Web", "acme"), ("acme_web", "acme"), ("globexy-weB", "globex")] {
        let err = s.apply(24, &put(name, name, tenant, service("resnet50", 50.0), WriteMode::Create, 0)).0.unwrap_err();
        assert_eq!((err.code, err.field.as_str()), (ErrorCode::AlreadyExists, "name"), "{name}: {err}");
    }
    assert!(!s
        .apply(25, &put("x", "globexy-weB", "globex", service("resnet50", 50.0), WriteMode::Create, 0))
        .0
        .unwrap_err()
        .reason
        .contains("\"globexy-web\""));
    assert_eq!(super::admission::name_skeleton("gIobex-Web"), super::admission::name_skeleton("globex_web"));
    assert_eq!(super::admission::name_skeleton("acrne-web"), super::admission::name_skeleton("acme-web"));
}
