use super::*;
use crate::ingress::TransportKind;
use edgebeat_proto::{Header, LeaseRenewal, Register, StatusReport, agent_message::Kind};

struct Unanswered;
impl Reply for Unanswered {
    fn send(self: Box<Self>, _: Option<Answer>) -> Sending {
        Box::pin(std::future::ready(()))
    }
    fn send_now(self: Box<Self>, _: Option<Answer>) {}
}

fn letter(kind: MessageKind, boot: u8, seq: u64, identified: bool) -> Letter {
    let header = Some(Header {
        node_name: "edge-1".into(),
        boot_id: vec![boot; 16],
        seq,
        ..Header::default()
    });
    let kind = match kind {
        MessageKind::Register => Kind::Register(Register {
            header,
            ..Register::default()
        }),
        MessageKind::Status => Kind::Status(StatusReport {
            header,
            ..StatusReport::default()
        }),
        MessageKind::Lease => Kind::Lease(LeaseRenewal {
            header,
            ..LeaseRenewal::default()
        }),
    };
    let mut peer = Peer::unidentified(TransportKind::Mqtt, None);
    if identified {
        peer.identity = Some("edge-1".parse().expect("a node name"));
    }
    Letter::new(peer, AgentMessage { kind: Some(kind) }, Unanswered)
}

fn seq(letter: &Letter) -> u64 {
    letter.message.header().map_or(0, |h| h.seq)
}

fn post(mailbox: &mut Mailbox, letter: Letter) -> Result<Posted, RejectReason> {
    mailbox.post(letter, 8).map_err(|(why, _)| why)
}

/// The letters' turns until none is left: a sequence number, negative when superseded.
fn drain(mailbox: &mut Mailbox) -> Vec<i64> {
    std::iter::from_fn(|| mailbox.next_turn())
        .map(|turn| match turn {
            Turn::Handle(l) => seq(&l).cast_signed(),
            Turn::Superseded(l) => -seq(&l).cast_signed(),
        })
        .collect()
}

/// Only an identified heartbeat of the same kind and boot with a higher sequence number
/// supersedes a waiting one; a copy of the newest is refused before it waits.
#[test]
fn only_a_newer_heartbeat_of_the_same_boot_supersedes() {
    use MessageKind::{Lease, Register, Status};
    let mut mailbox = Mailbox::default();
    // Being handled: nothing waits, so nothing can be superseded.
    assert!(
        post(&mut mailbox, letter(Lease, 1, 10, true))
            .unwrap()
            .start
    );
    assert!(matches!(mailbox.next_turn(), Some(Turn::Handle(l)) if seq(&l) == 10));
    // A copy (the same or a lower sequence number of the boot) is refused.
    assert_eq!(
        post(&mut mailbox, letter(Lease, 1, 10, true)).unwrap_err(),
        RejectReason::Replayed
    );
    assert_eq!(
        post(&mut mailbox, letter(Lease, 1, 5, true)).unwrap_err(),
        RejectReason::Replayed
    );
    // A backlog of three: the first two are superseded by the newest as it arrives.
    let a = post(&mut mailbox, letter(Lease, 1, 20, true)).unwrap();
    assert_eq!(
        a,
        Posted {
            start: false,
            superseded: 0,
            dropped: 0,
        },
        "being handled: the handler reaches it"
    );
    assert_eq!(
        post(&mut mailbox, letter(Lease, 1, 30, true))
            .unwrap()
            .superseded,
        1
    );
    assert_eq!(
        post(&mut mailbox, letter(Lease, 1, 40, true))
            .unwrap()
            .superseded,
        1
    );
    // A Register is never superseded; status reports apart from renewals.
    assert_eq!(
        post(&mut mailbox, letter(Register, 1, 41, true))
            .unwrap()
            .superseded,
        0
    );
    assert_eq!(
        post(&mut mailbox, letter(Status, 1, 42, true))
            .unwrap()
            .superseded,
        0
    );
    assert_eq!(
        post(&mut mailbox, letter(Lease, 1, 43, true))
            .unwrap()
            .superseded,
        1
    );
    assert_eq!(
        drain(&mut mailbox),
        [-20, -30, -40, 41, 42, 43],
        "in arrival order, superseded ones marked"
    );
    // After a reboot (lower sequence numbers) the new boot takes over.
    assert!(post(&mut mailbox, letter(Lease, 2, 1, true)).unwrap().start);
    assert_eq!(
        post(&mut mailbox, letter(Lease, 2, 2, true))
            .unwrap()
            .superseded,
        1
    );
    // A heartbeat of an older boot behind one of the current boot supersedes nothing and
    // is no copy (admission refuses the old boot).
    assert_eq!(
        post(&mut mailbox, letter(Lease, 1, 99, true))
            .unwrap()
            .superseded,
        0
    );
    assert_eq!(drain(&mut mailbox), [-1, 2, 99]);
}

/// Unidentified letters (anyone may have sent them) neither supersede nor are superseded,
/// nor refused as copies: they cost the node nothing, and the gateway's admission judges
/// them.
#[test]
fn unidentified_letters_take_no_part_in_superseding() {
    use MessageKind::Lease;
    let mut mailbox = Mailbox::default();
    post(&mut mailbox, letter(Lease, 1, 10, true)).unwrap();
    let forged = post(&mut mailbox, letter(Lease, 1, 99, false)).unwrap();
    assert_eq!(forged.superseded, 0, "a forged renewal costs nothing");
    let again = post(&mut mailbox, letter(Lease, 1, 99, false)).unwrap();
    assert_eq!(again.superseded, 0, "no copy rule without identity");
    assert_eq!(
        post(&mut mailbox, letter(Lease, 1, 11, true))
            .unwrap()
            .superseded,
        1
    );
    assert_eq!(drain(&mut mailbox), [-10, 99, 99, 11]);
}

/// One letter handled and `capacity` waiting; beyond that letters are refused, and a
/// mailbox whose handler stopped abnormally starts again with its next letter.
#[test]
fn a_full_mailbox_refuses_and_a_stopped_one_starts_again() {
    use MessageKind::Register;
    let mut mailbox = Mailbox::default();
    assert!(!mailbox.is_busy());
    assert!(
        mailbox
            .post(letter(Register, 1, 1, false), 2)
            .unwrap()
            .start
    );
    assert!(mailbox.is_busy());
    assert!(mailbox.next_turn().is_some());
    for seq in 2..=3 {
        assert!(
            !mailbox
                .post(letter(Register, 1, seq, false), 2)
                .unwrap()
                .start
        );
    }
    let (why, refused) = mailbox.post(letter(Register, 1, 4, false), 2).unwrap_err();
    assert_eq!(why, RejectReason::QueueFull);
    assert_eq!(seq(&refused), 4, "the refused letter is given back");
    assert_eq!(mailbox.len(), 2);
    // The handler panicked: the next post starts handling again, waiting letters first.
    mailbox.stopped();
    assert!(
        mailbox
            .post(letter(Register, 1, 5, false), 2)
            .unwrap()
            .start
    );
    assert_eq!(drain(&mut mailbox), [2, 3, 5]);
    assert!(!mailbox.is_busy() && mailbox.is_empty());
}

/// A full mailbox still takes a heartbeat that supersedes a waiting one (after a backlog the
/// newest is written), refuses anything else without marking a thing, and keeps at most
/// `capacity` superseded letters waiting for their answer.
#[test]
fn a_newer_heartbeat_has_room_in_a_full_mailbox() {
    use MessageKind::{Lease, Register, Status};
    let mut mailbox = Mailbox::default();
    post_to(&mut mailbox, letter(Register, 1, 1, true));
    assert!(mailbox.next_turn().is_some(), "being handled");
    post_to(&mut mailbox, letter(Lease, 1, 2, true));
    post_to(&mut mailbox, letter(Status, 1, 3, true));
    let full = mailbox.post(letter(Register, 1, 4, true), 2).unwrap_err().0;
    assert_eq!(full, RejectReason::QueueFull);
    let newer = post_to(&mut mailbox, letter(Lease, 1, 5, true));
    assert_eq!((newer.superseded, newer.dropped), (1, 0));
    // Each newer renewal supersedes the last; two superseded ones wait at most.
    for seq in 6..=8 {
        let posted = post_to(&mut mailbox, letter(Lease, 1, seq, true));
        assert_eq!(posted.superseded, 1);
        assert_eq!(posted.dropped, usize::from(seq > 6), "seq {seq}");
    }
    assert_eq!(
        mailbox.post(letter(Status, 1, 9, false), 2).unwrap_err().0,
        RejectReason::QueueFull,
        "an unidentified status report supersedes nothing"
    );
    assert_eq!(drain(&mut mailbox), [3, -6, -7, 8]);
}

fn post_to(mailbox: &mut Mailbox, letter: Letter) -> Posted {
    mailbox.post(letter, 2).map_err(|(why, _)| why).unwrap()
}
