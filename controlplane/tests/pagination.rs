//! Paged List (README, "Paging"): every resource exactly once and in name order across
//! pages of a small limit, pages cut by the 2 MiB byte budget, refused limits and continue
//! tokens naming their field, the client's `list` following all pages, and a tenant paging
//! through services seeing only its own.

mod common;

use std::sync::Arc;

use common::*;
use controlplane::api::{DEFAULT_LIMIT, MAX_LIMIT, PAGE_BYTES};
use controlplane::client::Client;
use controlplane::loops::LoopSettings;
use controlplane::security::certs;
use controlplane::security::{ClientCredentials, Principal, RateLimits, Security, TlsMaterial, Tokens};
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use serde_json::json;
use tonic::Code;

/// Writes `resources` with up to 32 writes in flight.
async fn put_all(client: &Client, resources: Vec<proto::Resource>) {
    futures::stream::iter(resources)
        .map(|r| client.put(r, proto::WriteMode::Create))
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .expect("writing the resources");
}

/// Reads every page of `kind` with `limit`, checking each page; returns the names in order
/// and the number of pages.
async fn page_through(client: &Client, kind: &str, tenant: &str, limit: u32) -> (Vec<String>, usize) {
    let mut names = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = client.list_page(kind, tenant, false, limit, &token).await.unwrap();
        pages += 1;
        assert!(!page.resources.is_empty() || pages == 1, "page {pages} is empty but a token led to it");
        assert!(page.resources.len() <= limit as usize, "page {pages} holds {} > {limit}", page.resources.len());
        assert!(page.encoded_len() <= PAGE_BYTES, "page {pages} is {} bytes > {PAGE_BYTES}", page.encoded_len());
        names.extend(page.resources.into_iter().map(|r| r.name));
        if page.continue_token.is_empty() {
            return (names, pages);
        }
        token = page.continue_token;
    }
}

fn field_of(err: &tonic::Status) -> &str {
    err.metadata().get(proto::meta::FIELD).map_or("", |v| v.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pages_of_a_small_limit_return_every_resource_once_in_order() {
    let cluster = TestCluster::start(3, fast_settings()).await;
    let client = cluster.client();
    // Names whose order differs from the order of writing.
    let mut expected: Vec<String> = (0..1200).map(|i| format!("t-{:04}", (i * 7919) % 1200)).collect();
    put_all(&client, expected.iter().map(|n| resource("Tenant", n, "", json!({"display_name": n}))).collect()).await;
    expected.sort();

    let (names, pages) = page_through(&client, "Tenant", "", 7).await;
    assert_eq!(names, expected, "each tenant exactly once, in name order");
    assert_eq!(pages, 1200usize.div_ceil(7));

    // The default page size, and the largest one.
    let first = client.list_page("Tenant", "", false, 0, "").await.unwrap();
    assert_eq!(first.resources.len(), DEFAULT_LIMIT as usize);
    assert!(!first.continue_token.is_empty());
    let first = client.list_page("Tenant", "", false, MAX_LIMIT, "").await.unwrap();
    assert_eq!(first.resources.len(), MAX_LIMIT as usize);
    // A token works at any controller: resume the listing at another node, from its own
    // (possibly stale) state.
    cluster.wait_applied(first.revision).await;
    let rest = cluster.client_of(2).list_page("Tenant", "", true, MAX_LIMIT, &first.continue_token).await.unwrap();
    assert_eq!(rest.resources.len(), 200);
    assert!(rest.continue_token.is_empty());
    assert_eq!(rest.resources[0].name, expected[1000]);

    // The client's list follows every page; its revision is the first page's.
    let all = client.list("Tenant", "", false).await.unwrap();
    assert_eq!(all.resources.iter().map(|r| r.name.clone()).collect::<Vec<_>>(), expected);
    assert!(all.continue_token.is_empty());
    assert!(all.revision >= first.revision);
    let small_pages = client.list_in_pages("Tenant", "", false, 100).await.unwrap();
    assert_eq!(small_pages.resources.len(), 1200);

    // A resource created between pages behind the position is not returned; one ahead is.
    let page = client.list_page("Tenant", "", false, 10, "").await.unwrap();
    let last = page.resources.last().unwrap().name.clone();
    put_all(&client, vec![resource("Tenant", "a-before", "", json!({})), resource("Tenant", "z-after", "", json!({}))]).await;
    let mut rest = Vec::new();
    let mut token = page.continue_token;
    while !token.is_empty() {
        let next = client.list_page("Tenant", "", false, MAX_LIMIT, &token).await.unwrap();
        rest.extend(next.resources.into_iter().map(|r| r.name));
        token = next.continue_token;
    }
    assert_eq!(rest.len(), 1200 - 10 + 1);
    assert!(rest.iter().all(|n| *n > last));
    assert!(rest.iter().any(|n| n == "z-after"));
    assert!(!rest.iter().any(|n| n == "a-before"));
}

/// A Node at the bounds a hostile agent could fill: 64 GPUs, 64 labels of 63/256 characters.
fn big_node(i: usize) -> proto::Resource {
    let name = format!("node-{i:03}");
    let gpus: Vec<_> = (0..64).map(|g| json!({"uuid": format!("GPU-{i:03}-{g:02}-{}", "0".repeat(24)), "model": "A100-80GB"})).collect();
    let labels: serde_json::Map<String, serde_json::Value> =
        (0..64).map(|l| (format!("label-{l:02}-{}", "k".repeat(54)), json!("v".repeat(256)))).collect();
    resource("Node", &name, "", json!({"address": format!("{name}:7000"), "instance_type": "gpu-64", "gpus": gpus, "labels": labels}))
}

/// An instance type of as many GPUs as a node may have, for `big_node`.
fn sixty_four_gpus() -> proto::Resource {
    resource(
        "InstanceType",
        "gpu-64",
        "",
        json!({"gpu_model": "A100-80GB", "gpu_count": 64, "price_per_hour": 300, "launch_latency_s": 60}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_byte_budget_cuts_pages_of_large_nodes() {
    let cluster = TestCluster::start(1, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    client.put(sixty_four_gpus(), proto::WriteMode::Create).await.unwrap();
    let one = big_node(0).encoded_len();
    assert!((20_000..64_000).contains(&one), "a node of {one} bytes");
    let nodes: Vec<_> = (0..200).map(big_node).collect();
    let total: usize = nodes.iter().map(|n| n.encoded_len()).sum();
    assert!(total > 2 * PAGE_BYTES, "the nodes ({total} bytes) must need more than two pages");
    put_all(&client, nodes).await;

    let first = client.list_page("Node", "", false, MAX_LIMIT, "").await.unwrap();
    assert!(first.encoded_len() <= PAGE_BYTES);
    assert!(first.resources.len() < 200, "the budget, not the limit, cut the page");
    // The page is full: one more node would have passed the budget.
    assert!(first.encoded_len() + first.resources[0].encoded_len() + 4 > PAGE_BYTES - 1024, "page of {} bytes", first.encoded_len());

    let (names, pages) = page_through(&client, "Node", "", MAX_LIMIT).await;
    assert!(pages >= 3, "{pages} pages");
    assert_eq!(names, (0..200).map(|i| format!("node-{i:03}")).collect::<Vec<_>>());
    assert_eq!(client.list("Node", "", false).await.unwrap().resources.len(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_limits_and_continue_tokens_are_refused_naming_the_field() {
    let cluster = TestCluster::start(1, fast_settings()).await;
    let client = cluster.client();
    seed(&client).await;
    put_all(&client, (0..5).map(|i| resource("Tenant", &format!("t{i}"), "", json!({}))).collect()).await;

    let err = client.list_page("Tenant", "", false, MAX_LIMIT + 1, "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(field_of(&err), "limit");
    assert!(err.message().contains("1001") && err.message().contains("1000"), "{}", err.message());

    for garbage in ["garbage", "7b7d", "00", &"ab".repeat(5000)] {
        let err = client.list_page("Tenant", "", false, 2, garbage).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert_eq!(field_of(&err), "continue_token");
        assert!(err.message().len() < 300, "the message does not echo a long token: {}", err.message());
    }

    // A token is bound to the kind and the tenant filter it was issued for.
    let token = client.list_page("Tenant", "", false, 2, "").await.unwrap().continue_token;
    assert!(!token.is_empty());
    let err = client.list_page("GpuModel", "", false, 2, &token).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(field_of(&err), "continue_token");
    assert!(err.message().contains("Tenant") && err.message().contains("GpuModel"), "{}", err.message());
    let err = client.list_page("Tenant", "acme", false, 2, &token).await.unwrap_err();
    assert_eq!((err.code(), field_of(&err)), (Code::InvalidArgument, "continue_token"));
    // The token still works for what it was issued for.
    assert_eq!(client.list_page("Tenant", "", false, 2, &token).await.unwrap().resources.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_paging_services_sees_only_its_own() {
    let pki = make_pki(&[1], &[]);
    let dir = pki.path().to_path_buf();
    let tokens =
        Tokens::default().with(Principal::Tenant("acme".into()), "token-acme").with(Principal::Tenant("globex".into()), "token-globex");
    let limits = RateLimits { tenant_rps: 10_000, tenant_burst: 10_000, ..RateLimits::default() };
    let security = Arc::new(move |id| Security {
        tls: Some(tls_of(&dir, &Principal::Controller(id))),
        tokens: tokens.clone(),
        limits: limits.clone(),
    });
    let cluster = TestCluster::start_with(1, fast_settings(), LoopSettings { enabled: false, ..LoopSettings::default() }, security).await;
    let credentials = |tls, token: Option<&str>| ClientCredentials { tls: Some(tls), token: token.map(str::to_string) };
    let admin =
        Client::with_credentials(cluster.endpoints(), credentials(tls_of(pki.path(), &Principal::Admin("ops".into())), None)).unwrap();
    let ca = || TlsMaterial::load(&pki.path().join(certs::CA_CERT), None, None).unwrap();
    let acme = Client::with_credentials(cluster.endpoints(), credentials(ca(), Some("token-acme"))).unwrap();

    seed(&admin).await;
    admin.put(resource("Tenant", "globex", "", json!({})), proto::WriteMode::Create).await.unwrap();
    // Interleaved names: every page of the listing skips the other tenant's services.
    let spec = json!({"model": "resnet50", "slo": {"latency_ms": 50.0, "request_rate": 10.0}});
    let services = (0..60).map(|i| {
        let tenant = if i % 3 == 0 { "acme" } else { "globex" };
        resource("Service", &format!("svc-{i:02}"), tenant, spec.clone())
    });
    put_all(&admin, services.collect()).await;
    let own: Vec<String> = (0..60).filter(|i| i % 3 == 0).map(|i| format!("svc-{i:02}")).collect();

    let (names, pages) = page_through(&acme, "Service", "", 4).await;
    assert_eq!(names, own);
    assert_eq!(pages, 5);
    let (names, _) = page_through(&acme, "Service", "acme", 3).await;
    assert_eq!(names, own);
    assert_eq!(acme.list("Service", "", false).await.unwrap().resources.len(), 20);
    // A token of acme's listing does not open another tenant's.
    let token = acme.list_page("Service", "", false, 4, "").await.unwrap().continue_token;
    let err = acme.list_page("Service", "globex", false, 4, &token).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // The admin pages through one tenant's services with the tenant filter.
    let (names, _) = page_through(&admin, "Service", "globex", 7).await;
    assert_eq!(names.len(), 40);
    assert!(!names.iter().any(|n| own.contains(n)));
}
