use super::*;
use edgebeat_proto::{Header, LeaseRenewal, agent_message::Kind};

fn renewal(seq: u64) -> AgentMessage {
    AgentMessage {
        kind: Some(Kind::Lease(LeaseRenewal {
            header: Some(Header {
                seq,
                ..Default::default()
            }),
            lease_duration_seconds: 40,
            lease_state: Vec::new(),
            quiet: false,
            usage: None,
        })),
    }
}

#[tokio::test(start_paused = true)]
async fn send_gets_the_drivers_answer() {
    let (uplink, mut driver) = channel(4);
    let answerer = tokio::spawn(async move {
        let r = driver.requests.recv().await.unwrap();
        let seq = r.message.header().unwrap().seq;
        assert_eq!(seq, 7);
        r.reply.send(Ok(Answer::WRITTEN)).unwrap();
    });
    let answer = uplink
        .send(renewal(7), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(answer, Answer::WRITTEN);
    answerer.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn send_times_out_without_answer() {
    let (uplink, _driver) = channel(4);
    let err = uplink
        .send(renewal(1), Duration::from_secs(3))
        .await
        .unwrap_err();
    assert_eq!(err, UplinkError::Timeout(Duration::from_secs(3)));
}

#[tokio::test(start_paused = true)]
async fn requests_are_refused_not_queued_while_disconnected() {
    let (uplink, mut driver) = channel(4);
    let cancel = tokio_util::sync::CancellationToken::new();
    let waiter = tokio::spawn(async move {
        refuse_while_waiting(&mut driver.requests, Duration::from_secs(5), &cancel).await
    });
    let err = uplink
        .send(renewal(1), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err, UplinkError::NotConnected);
    assert!(waiter.await.unwrap(), "waited out the delay");
}

/// A closed driver answers what was queued and what comes later with `Closed` at once, not
/// after the callers' timeouts (paused time: any wait would show as `Timeout`).
#[tokio::test(start_paused = true)]
async fn a_closed_driver_answers_closed_at_once() {
    let (uplink, mut driver) = channel(4);
    let queued = {
        let uplink = uplink.clone();
        tokio::spawn(async move { uplink.send(renewal(1), Duration::from_secs(10)).await })
    };
    while driver.requests.is_empty() {
        tokio::task::yield_now().await;
    }
    driver.close();
    assert_eq!(queued.await.unwrap(), Err(UplinkError::Closed));
    let later = uplink.send(renewal(2), Duration::from_secs(10)).await;
    assert_eq!(later, Err(UplinkError::Closed));
}

#[test]
fn backoff_doubles_with_jitter_and_caps() {
    let delays: Vec<_> = reconnect_backoff(Duration::from_millis(200), Duration::from_secs(7))
        .take(12)
        .collect();
    assert_eq!(delays.len(), 12, "never gives up");
    assert!(delays[0] >= Duration::from_millis(200) && delays[0] <= Duration::from_millis(400));
    // Capped at max (plus at most the jitter of one max delay).
    assert!(delays.iter().all(|d| *d <= Duration::from_secs(14)));
    assert!(delays[11] >= Duration::from_secs(7));
}
