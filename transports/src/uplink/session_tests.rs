use super::*;
use edgebeat_proto::AckCode;

fn registered(seq: u64) -> Ack {
    Answer::Registered {
        headers: HeaderForm::Full,
        resend_status: false,
        certificate_due: false,
    }
    .into_ack(seq)
}

fn retry(seq: u64) -> Ack {
    Answer::Retry {
        reason: "later".into(),
    }
    .into_ack(seq)
}

#[test]
fn register_ack_raises_registered_and_others_answer_requests() {
    let (uplink, driver) = channel(4);
    let mut s = Session::new();
    s.register_sent(Some(10));
    assert_eq!(s.on_ack(registered(10), &driver), AfterAck::Nothing);
    assert!(*uplink.registered().borrow());
    let (tx, mut rx) = oneshot::channel();
    s.track(11, tx, false);
    let renewed = Answer::Renewed {
        lease_state: vec![4],
        resend_status: false,
    };
    assert_eq!(
        s.on_ack(renewed.clone().into_ack(11), &driver),
        AfterAck::Nothing
    );
    assert_eq!(rx.try_recv().unwrap(), Ok(renewed));
    // A contradictory ack fails its request and changes nothing else.
    let (tx, mut rx) = oneshot::channel();
    s.track(12, tx, false);
    let contradictory = Ack {
        seq: 12,
        code: AckCode::Retry.into(),
        registered: true,
        ..Default::default()
    };
    assert_eq!(s.on_ack(contradictory, &driver), AfterAck::Nothing);
    assert!(matches!(
        rx.try_recv().unwrap(),
        Err(UplinkError::BadAck(e)) if e.0.contains("RETRY")
    ));
    assert!(*uplink.registered().borrow());
}

#[test]
fn the_header_form_is_what_register_was_accepted_with_and_boot_id_requests_last() {
    let (_uplink, driver) = channel(4);
    let mut s = Session::new();
    assert_eq!(s.header_form(), HeaderForm::Full);
    s.register_sent(Some(1));
    let accepted = Answer::Registered {
        headers: HeaderForm::CompactBootTag,
        resend_status: false,
        certificate_due: false,
    };
    s.on_ack(accepted.into_ack(1), &driver);
    assert_eq!(s.header_form(), HeaderForm::CompactBootTag);
    assert!(!s.take_boot_id_request());
    // A replica that does not hold the boot asks for it: the next BOOT_ID_MESSAGES
    // messages carry it, then tags again.
    let (tx, _rx) = oneshot::channel();
    s.track(2, tx, true);
    let ask = Answer::SendBootId {
        reason: "unknown boot".into(),
    };
    s.on_ack(ask.clone().into_ack(2), &driver);
    for _ in 0..BOOT_ID_MESSAGES {
        assert!(s.take_boot_id_request());
    }
    assert!(!s.take_boot_id_request());
    // An unsolicited request changes nothing.
    s.on_ack(ask.into_ack(99), &driver);
    assert!(!s.take_boot_id_request());
    assert_eq!(
        Session::resumed(HeaderForm::CompactBootTag).header_form(),
        HeaderForm::CompactBootTag
    );
}

#[test]
fn refused_registration_backs_off_and_acceptance_completes_it() {
    let (uplink, driver) = channel(4);
    let mut s = Session::new();
    s.register_sent(Some(1));
    let refused = retry(1);
    match s.on_ack(refused.clone(), &driver) {
        AfterAck::RegisterAfter(d) => {
            assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(200))
        }
        other => panic!("{other:?}"),
    }
    // A second answer to the same Register (a replay) changes nothing.
    assert_eq!(s.on_ack(refused.clone(), &driver), AfterAck::Nothing);
    s.register_sent(Some(1));
    match s.on_ack(refused, &driver) {
        AfterAck::RegisterAfter(d) => assert!(d >= Duration::from_millis(200)),
        other => panic!("{other:?}"),
    }
    assert_eq!(*uplink.registration().borrow(), NodeRegistration::Pending);
    // A contradictory answer to Register is a refusal: backed off, not registered.
    s.register_sent(Some(1));
    let contradictory = Ack {
        seq: 1,
        code: AckCode::Rejected.into(),
        registered: true,
        ..Default::default()
    };
    assert!(matches!(
        s.on_ack(contradictory, &driver),
        AfterAck::RegisterAfter(_)
    ));
    assert!(!*uplink.registered().borrow());
    s.register_sent(Some(1));
    s.on_ack(registered(1), &driver);
    assert_eq!(*uplink.registration().borrow(), NodeRegistration::Completed);
    // A new connection's session is not registered, but the process stays Completed.
    let mut next = Session::new();
    next.close(&driver);
    assert!(!*uplink.registered().borrow());
    assert_eq!(*uplink.registration().borrow(), NodeRegistration::Completed);
}

fn gone(seq: u64) -> Ack {
    Answer::NodeNotFound {
        reason: "deleted".into(),
    }
    .into_ack(seq)
}

/// `node_not_found` ends the registration of the process for good, but only when it
/// answers a request of this session and the process had registered (answers the
/// transport authenticates).
#[test]
fn node_not_found_is_final_and_only_for_own_requests_after_registration() {
    let (uplink, driver) = channel(4);
    let mut s = Session::new().with_authenticated_answers(true);
    // Before any registration (an older gateway's answer to a first Register, or a
    // forgery): an ordinary refusal, retried with backoff.
    s.register_sent(Some(1));
    assert!(matches!(
        s.on_ack(gone(1), &driver),
        AfterAck::RegisterAfter(_)
    ));
    assert_eq!(*uplink.registration().borrow(), NodeRegistration::Pending);
    s.register_sent(Some(2));
    s.on_ack(registered(2), &driver);
    // Not an answer to anything this session awaits: ignored.
    assert_eq!(s.on_ack(gone(7), &driver), AfterAck::Nothing);
    assert!(s.registered());
    assert_eq!(*uplink.registration().borrow(), NodeRegistration::Completed);
    let (tx, mut rx) = oneshot::channel();
    s.track(8, tx, false);
    assert_eq!(s.on_ack(gone(8), &driver), AfterAck::Nothing);
    assert!(
        matches!(rx.try_recv().unwrap(), Ok(Answer::NodeNotFound { .. })),
        "the caller still gets its answer"
    );
    assert!(!s.registered());
    assert!(!*uplink.registered().borrow());
    assert_eq!(
        *uplink.registration().borrow(),
        NodeRegistration::NodeNotFound
    );
    // A later accepted Register (an older gateway) does not undo it.
    s.register_sent(Some(9));
    s.on_ack(registered(9), &driver);
    assert_eq!(
        *uplink.registration().borrow(),
        NodeRegistration::NodeNotFound
    );
}

/// The answer to a new connection's Register (`registration_completed`) can say the
/// Node is gone too.
#[test]
fn a_reconnect_register_answered_node_not_found_ends_the_registration() {
    let (uplink, driver) = channel(4);
    driver
        .registration
        .send_replace(NodeRegistration::Completed);
    let mut s = Session::new().with_authenticated_answers(true);
    s.register_sent(Some(3));
    let answer = Answer::NodeNotFound {
        reason: "deleted".into(),
    };
    assert_eq!(
        s.on_ack(answer.into_ack(3), &driver),
        AfterAck::Nothing,
        "no retry"
    );
    assert_eq!(
        *uplink.registration().borrow(),
        NodeRegistration::NodeNotFound
    );
}

/// Over a path that does not authenticate the gateway's answers (plain MQTT, plaintext
/// gRPC), one `node_not_found` never stops the agent: it takes
/// [`NODE_NOT_FOUND_CONFIRMATIONS`] in a row, each answering another request, and a written
/// answer in between starts the count over. Until then each is retried as a refusal.
#[test]
fn unauthenticated_node_not_found_needs_confirming() {
    let (uplink, driver) = channel(4);
    let mut s = Session::new();
    s.register_sent(Some(1));
    s.on_ack(registered(1), &driver);
    let mut seq = 10;
    let mut answer_to = |s: &mut Session, ack: fn(u64) -> Ack| {
        seq += 1;
        let (tx, mut rx) = oneshot::channel();
        s.track(seq, tx, false);
        s.on_ack(ack(seq), &driver);
        rx.try_recv().unwrap().unwrap()
    };
    for _ in 1..NODE_NOT_FOUND_CONFIRMATIONS {
        assert!(matches!(answer_to(&mut s, gone), Answer::Retry { .. }));
    }
    assert!(matches!(answer_to(&mut s, retry), Answer::Retry { .. }));
    let written = |seq| Answer::WRITTEN.into_ack(seq);
    assert!(answer_to(&mut s, written).is_written());
    assert_eq!(*uplink.registration().borrow(), NodeRegistration::Completed);
    for _ in 1..NODE_NOT_FOUND_CONFIRMATIONS {
        assert!(matches!(answer_to(&mut s, gone), Answer::Retry { .. }));
    }
    assert!(matches!(
        answer_to(&mut s, gone),
        Answer::NodeNotFound { .. }
    ));
    assert_eq!(
        *uplink.registration().borrow(),
        NodeRegistration::NodeNotFound
    );
}

#[test]
fn unanswered_requests_are_counted_when_forgotten() {
    let mut s = Session::new();
    let (tx, rx) = oneshot::channel();
    assert_eq!(s.track(1, tx, false), 0);
    drop(rx);
    let (tx, rx) = oneshot::channel();
    assert_eq!(s.track(2, tx, true), 1);
    // A quiet request whose caller stopped waiting heard nothing: it was written.
    drop(rx);
    let (tx, _rx) = oneshot::channel();
    assert_eq!(s.track(3, tx, false), 0);
}

#[test]
fn close_fails_pending_requests() {
    let (uplink, driver) = channel(4);
    let mut s = Session::new();
    let (tx, mut rx) = oneshot::channel();
    s.track(5, tx, false);
    s.close(&driver);
    assert_eq!(rx.try_recv().unwrap(), Err(UplinkError::Disconnected));
    assert!(!*uplink.registered().borrow());
}
