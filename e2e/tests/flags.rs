//! Flags that change what crosses between processes, each proved on real control planes: the
//! principal's `--keepalive-min-interval` (an agent connection pinging too often gets GOAWAY
//! `too_many_pings`, a well-behaved one keeps its connection), `--allowed-namespaces` (only
//! Applications in matching hub namespaces reach agents) and `--label-selector` (only matching
//! Applications reach agents; one that stops matching is removed from the spoke, one that starts
//! matching arrives). Destination-based mapping has its own file, `destination_mapping.rs`.

use std::time::Duration;

use e2e::fleet::{Fleet, FleetAgent};
use e2e::gateway::{agent_identity, application, client_tls, text, tls_connect, Pki};
use e2e::raw_agent::LonePrincipal;
use e2e::{shared_planes, wait_until};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(30);
/// How long an Application that must not arrive is given to arrive anyway, after one created
/// with it did arrive (so the link is proven live).
const GRACE: Duration = Duration::from_secs(3);

async fn get_json(api: &Api<DynamicObject>, name: &str) -> Result<Option<Value>, kube::Error> {
    Ok(api
        .get_opt(name)
        .await?
        .map(|o| serde_json::to_value(o).expect("object serialises")))
}

async fn wait_present(api: &Api<DynamicObject>, name: &str, what: &str) -> anyhow::Result<Value> {
    wait_until(what, WAIT, || async { get_json(api, name).await }).await
}

async fn wait_gone(api: &Api<DynamicObject>, name: &str, what: &str) -> anyhow::Result<()> {
    wait_until(what, WAIT, || async {
        Ok::<_, kube::Error>(get_json(api, name).await?.is_none().then_some(()))
    })
    .await
}

async fn assert_stays_absent(api: &Api<DynamicObject>, name: &str, why: &str) {
    tokio::time::sleep(GRACE).await;
    assert!(
        get_json(api, name).await.expect("spoke readable").is_none(),
        "{name} reached the spoke although {why}"
    );
}

// ---- --keepalive-min-interval ------------------------------------------------------------------

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend([kind, flags, 0, 0, 0, 0]);
    f.extend(payload);
    f
}

/// What the principal answered to one PING.
#[derive(Debug, PartialEq)]
enum Answer {
    /// PING ACK.
    Ack,
    /// GOAWAY with (error code, debug data).
    GoAway(u32, String),
    /// The connection closed without either.
    Closed,
}

/// An HTTP/2 connection to the principal's gRPC port, as an agent's, speaking raw frames so the
/// test controls exactly when PINGs go out.
struct RawH2(tokio_rustls::client::TlsStream<tokio::net::TcpStream>);

impl RawH2 {
    async fn open(pki: &Pki, agent: &str, address: &str) -> anyhow::Result<RawH2> {
        pki.issue_agent(agent)?;
        let (cert, key) = agent_identity(pki, agent)?;
        let tls = client_tls(pki, Some((&cert, &key)), &[b"h2"])?;
        let mut stream = tls_connect(address, std::sync::Arc::new(tls)).await?;
        let mut opening = PREFACE.to_vec();
        opening.extend(frame(0x4, 0, &[]));
        stream.write_all(&opening).await?;
        Ok(RawH2(stream))
    }

    /// Sends a PING and reads frames until its ACK, a GOAWAY or the end of the connection.
    async fn ping(&mut self) -> anyhow::Result<Answer> {
        self.0.write_all(&frame(PING, 0, b"e2e-ping")).await?;
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let mut header = [0u8; 9];
                if self.0.read_exact(&mut header).await.is_err() {
                    return Ok(Answer::Closed);
                }
                let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
                let mut payload = vec![0u8; len];
                if self.0.read_exact(&mut payload).await.is_err() {
                    return Ok(Answer::Closed);
                }
                match header[3] {
                    PING if header[4] & 1 == 1 && payload == b"e2e-ping" => return Ok(Answer::Ack),
                    GOAWAY => {
                        let code = u32::from_be_bytes(payload[4..8].try_into()?);
                        let debug = String::from_utf8_lossy(&payload[8..]).into_owned();
                        return Ok(Answer::GoAway(code, debug));
                    }
                    _ => {}
                }
            }
        })
        .await?
    }
}

#[tokio::test]
async fn keepalive_min_interval_sends_goaway_to_agents_pinging_too_often() -> anyhow::Result<()> {
    let lone = LonePrincipal::start("flags_keepalive", &["--keepalive-min-interval=1s"]).await?;
    let address = lone.principal.address();

    // Pinging every 20ms: the first ping is free, three early ones in a row end the connection,
    // with grpc-go's GOAWAY (a Go agent backs off its keepalive on reading it).
    let mut flood = RawH2::open(&lone.pki, &lone.ctx.unique("flood"), &address).await?;
    let mut answers = Vec::new();
    for _ in 0..6 {
        let answer = flood.ping().await?;
        let done = answer != Answer::Ack;
        answers.push(answer);
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        answers,
        [
            Answer::Ack,
            Answer::Ack,
            Answer::Ack,
            Answer::GoAway(ENHANCE_YOUR_CALM, "too_many_pings".into())
        ],
        "{}",
        lone.principal.process.log_tail(20)
    );
    let mut rest = Vec::new();
    let closed =
        tokio::time::timeout(Duration::from_secs(10), flood.0.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(_)) | Ok(Err(_))),
        "the principal kept the connection open after its GOAWAY"
    );

    // Pinging no more often than the minimum keeps the connection.
    let mut polite = RawH2::open(&lone.pki, &lone.ctx.unique("polite"), &address).await?;
    for i in 0..5 {
        assert_eq!(polite.ping().await?, Answer::Ack, "spaced ping {i}");
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    Ok(())
}

#[tokio::test]
async fn without_keepalive_min_interval_pings_are_not_policed() -> anyhow::Result<()> {
    let lone = LonePrincipal::start("flags_keepalive_off", &[]).await?;
    let mut flood = RawH2::open(
        &lone.pki,
        &lone.ctx.unique("flood"),
        &lone.principal.address(),
    )
    .await?;
    for i in 0..20 {
        assert_eq!(flood.ping().await?, Answer::Ack, "ping {i}");
    }
    Ok(())
}

// ---- --allowed-namespaces ----------------------------------------------------------------------

#[tokio::test]
async fn principal_allowed_namespaces_limit_which_hub_namespaces_reach_agents() -> anyhow::Result<()>
{
    let planes = shared_planes().await;
    // Agents are named `<prefix>-<suffix>`: only the first one's hub namespace matches.
    let fleet = Fleet::start_with(
        "flags_allowed_ns",
        planes,
        &["--allowed-namespaces=served-*,other-?"],
        &[
            FleetAgent::managed("served"),
            FleetAgent::managed("unserved"),
        ],
    )
    .await?;
    let (served_hub, unserved_hub) = (
        fleet.hub_apps(planes, 0).await?,
        fleet.hub_apps(planes, 1).await?,
    );
    let (served_spoke, unserved_spoke) = (
        fleet.spoke_apps(planes, 0).await?,
        fleet.spoke_apps(planes, 1).await?,
    );

    unserved_hub
        .create(
            &PostParams::default(),
            &application("outside", &fleet.agents[1].name, "v1"),
        )
        .await?;
    served_hub
        .create(
            &PostParams::default(),
            &application("inside", &fleet.agents[0].name, "v1"),
        )
        .await?;
    let copy = wait_present(
        &served_spoke,
        "inside",
        "the allowed namespace's app on its spoke",
    )
    .await?;
    assert_eq!(text(&copy, "/spec/source/targetRevision"), "v1");
    assert_stays_absent(
        &unserved_spoke,
        "outside",
        "its hub namespace is not in --allowed-namespaces",
    )
    .await;
    Ok(())
}

// ---- --label-selector --------------------------------------------------------------------------

#[tokio::test]
async fn principal_label_selector_limits_which_applications_reach_agents() -> anyhow::Result<()> {
    label_selector_scenario("flags_label_selector", &[]).await
}

/// With the embedded operator on, the hub's one Application watch selects every Application (the
/// pull model reads them all) and the principal narrows what reaches agents itself: the same
/// scenario must hold.
#[tokio::test]
async fn principal_label_selector_holds_when_the_operator_shares_the_application_watch(
) -> anyhow::Result<()> {
    label_selector_scenario("flags_label_selector_shared", &["--enable-operator=true"]).await
}

/// Only Applications labelled `agent-sync=yes` reach the agent; gaining and losing the label
/// brings and removes them (the principal started with `extra` flags too).
async fn label_selector_scenario(name: &str, extra: &[&str]) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let mut flags = vec!["--label-selector=agent-sync=yes"];
    flags.extend_from_slice(extra);
    let fleet = Fleet::start_with(name, planes, &flags, &[FleetAgent::managed("agent1")]).await?;
    let hub = fleet.hub_apps(planes, 0).await?;
    let spoke = fleet.spoke_apps(planes, 0).await?;
    let agent = &fleet.agents[0].name;

    let mut labelled = application("labelled", agent, "v1");
    labelled.metadata.labels = Some([("agent-sync".to_string(), "yes".to_string())].into());
    hub.create(
        &PostParams::default(),
        &application("unlabelled", agent, "v1"),
    )
    .await?;
    hub.create(&PostParams::default(), &labelled).await?;
    wait_present(&spoke, "labelled", "the matching app on the spoke").await?;
    assert_stays_absent(&spoke, "unlabelled", "it does not match --label-selector").await;

    // Starting to match brings it; ceasing to match takes it away from the spoke (the hub keeps it).
    let set = |v: Option<&str>| json!({"metadata": {"labels": {"agent-sync": v}}});
    hub.patch(
        "unlabelled",
        &PatchParams::default(),
        &Patch::Merge(&set(Some("yes"))),
    )
    .await?;
    wait_present(&spoke, "unlabelled", "the app labelled later on the spoke").await?;
    hub.patch(
        "labelled",
        &PatchParams::default(),
        &Patch::Merge(&set(None)),
    )
    .await?;
    wait_gone(
        &spoke,
        "labelled",
        "the app whose label was removed gone from the spoke",
    )
    .await?;
    assert!(
        get_json(&hub, "labelled").await?.is_some(),
        "the hub keeps it"
    );
    Ok(())
}
