//! The gateway's answer to one agent message as a type: [`Answer`] is what an [`Ack`] may
//! say, and nothing it may not.
//!
//! On the wire an [`Ack`] is a code and six flags, so it can hold states no gateway means
//! (a refused `Register` that is also "registered", a Lease state on a RETRY, a node that is
//! both written and not found). The gateway builds an [`Answer`] and encodes it with
//! [`Answer::into_ack`]; the agent decodes every `Ack` with `Answer::try_from`, which
//! refuses those states with an [`AckError`] naming the contradiction. Each variant is
//! exactly one wire shape, so `try_from(into_ack(a)) == a` (see the tests), except a
//! [`Answer::Renewed`] with an empty Lease state, which is the shape of
//! [`Answer::Written`] and reads back as it.
//!
//! Older agents read the same bytes: the flags keep their meaning, and a RETRY with
//! `node_not_found` stays a RETRY for an agent that predates the flag. Two shapes no gateway
//! has sent are refused where an older agent made something of them: `boot_tags` without
//! `compact_headers` (read as whole headers before), and flags on a code that cannot carry
//! them.

use crate::{Ack, AckCode};

/// What quiet messages' headers may leave out, as the gateway said when it accepted
/// `Register` (`Ack.compact_headers`, `Ack.boot_tags`): a gateway property, so an MQTT
/// session resumed on a new broker connection keeps it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeaderForm {
    /// Whole headers: not registered, or a gateway that predates compact headers.
    #[default]
    Full,
    /// `Ack.compact_headers`: gRPC sends [`crate::AgentMessage::compact_header`], MQTT
    /// [`crate::AgentMessage::compact_header_for_topic`].
    Compact,
    /// `Ack.compact_headers` and `Ack.boot_tags`: as [`HeaderForm::Compact`], and MQTT also
    /// names the boot by tag ([`crate::AgentMessage::tag_boot`]) unless a gateway replica
    /// asked for the boot ID ([`Answer::SendBootId`]). gRPC leaves the boot out altogether.
    CompactBootTag,
}

/// The gateway's answer to one agent message, without the `seq` it answers (that is the
/// [`Ack`]'s, [`Answer::into_ack`]).
///
/// `resend_status` on the written variants is `Ack.resend_status`: the apiserver's copy of
/// the node differs from what the agent last reported (the node lifecycle controller set
/// its conditions `Unknown`), so the agent sends a whole `StatusReport` now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `ACK_CODE_OK`: written to the apiserver, or nothing needed writing.
    Written {
        /// See [`Answer`].
        resend_status: bool,
    },
    /// `ACK_CODE_OK` with `Ack.registered`: `Register` accepted; the agent may renew its
    /// Lease, and its quiet messages' headers may take `headers`' form.
    Registered {
        /// What quiet messages may leave out from now on.
        headers: HeaderForm,
        /// See [`Answer`].
        resend_status: bool,
        /// `Ack.certificate_due`: by the gateway's clock the node's certificate is due for
        /// rotation; the agent requests a new one.
        certificate_due: bool,
    },
    /// `ACK_CODE_OK` with `Ack.lease_state`: the Lease renewal was written; the agent echoes
    /// `lease_state` (opaque bytes, non-empty) in its next `LeaseRenewal.lease_state`. An
    /// empty state is [`Answer::Written`].
    Renewed {
        /// The state to echo.
        lease_state: Vec<u8>,
        /// See [`Answer`].
        resend_status: bool,
    },
    /// `ACK_CODE_RETRY`: not written now (apiserver error, rate limit, replica full); the
    /// agent retries with a fresh message. `reason` is short text for logs.
    Retry {
        /// Why, for logs.
        reason: String,
    },
    /// `ACK_CODE_RETRY` with `Ack.resend_status`: not written because the apiserver's
    /// status differs from the one the message assumed (an unchanged `StatusReport`); the
    /// agent sends the whole status instead.
    ResendStatus {
        /// Why, for logs.
        reason: String,
    },
    /// `ACK_CODE_RETRY` with `Ack.send_boot_id`: the message named its boot by
    /// `Header.boot_tag` and this gateway replica does not hold that boot; the agent's next
    /// messages carry `Header.boot_id`.
    SendBootId {
        /// Why, for logs.
        reason: String,
    },
    /// `ACK_CODE_RETRY` with `Ack.send_certificate` (only in a signed answer): this gateway
    /// replica holds no current verified certificate for the node; the agent publishes its
    /// certificate chain again, then retries.
    SendCertificate {
        /// Why, for logs.
        reason: String,
    },
    /// `ACK_CODE_RETRY` with `Ack.node_not_found`: the Node this agent registered was
    /// deleted (`kubectl delete node`); as kubelet, which registers once per process, the
    /// agent stops sending until restarted. The wire code is RETRY so that an agent that
    /// predates the flag keeps retrying rather than giving up for good.
    NodeNotFound {
        /// Why, for logs.
        reason: String,
    },
    /// `ACK_CODE_REJECTED`: refused for good (malformed, not authorized, stale or
    /// replayed); not to be resent as is.
    Rejected {
        /// Why, for logs.
        reason: String,
    },
}

/// An [`Ack`] that is no [`Answer`]: the contradiction it holds, e.g. `"a flag on a
/// REJECTED"`. The agent drops such an ack, logs it, and retries the request it answered
/// (`UplinkError::BadAck` in `edgebeat-transports`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("contradictory ack: {0}")]
pub struct AckError(pub &'static str);

impl Answer {
    /// A plain [`Answer::Written`] (no status wanted).
    pub const WRITTEN: Self = Self::Written {
        resend_status: false,
    };

    /// The answer to a heartbeat of `kind` that a newer one of its node, waiting behind
    /// it, superseded ([`crate::BootSeq::supersedes`]): only the newest is written, so a
    /// backlog (a slow apiserver, a link coming back) costs one write per node, not one per
    /// message. The gateway's slots and the MQTT ingress's queues both answer with it.
    pub fn superseded(kind: crate::MessageKind) -> Self {
        Self::Rejected {
            reason: format!(
                "superseded: a newer {} from this node is waiting",
                kind.as_str()
            ),
        }
    }

    /// The wire code of this answer.
    pub fn code(&self) -> AckCode {
        match self {
            Self::Written { .. } | Self::Registered { .. } | Self::Renewed { .. } => AckCode::Ok,
            Self::Retry { .. }
            | Self::ResendStatus { .. }
            | Self::SendBootId { .. }
            | Self::SendCertificate { .. }
            | Self::NodeNotFound { .. } => AckCode::Retry,
            Self::Rejected { .. } => AckCode::Rejected,
        }
    }

    /// Whether the message was written (or needed no write): code OK.
    pub fn is_written(&self) -> bool {
        self.code() == AckCode::Ok
    }

    /// Why it was not written (empty for the written variants).
    pub fn reason(&self) -> &str {
        match self {
            Self::Written { .. } | Self::Registered { .. } | Self::Renewed { .. } => "",
            Self::Retry { reason }
            | Self::ResendStatus { reason }
            | Self::SendBootId { reason }
            | Self::SendCertificate { reason }
            | Self::NodeNotFound { reason }
            | Self::Rejected { reason } => reason,
        }
    }

    /// Whether the gateway asks for a whole `StatusReport` (`Ack.resend_status`).
    pub fn asks_for_status(&self) -> bool {
        match self {
            Self::Written { resend_status }
            | Self::Registered { resend_status, .. }
            | Self::Renewed { resend_status, .. } => *resend_status,
            Self::ResendStatus { .. } => true,
            _ => false,
        }
    }

    /// Asks for a whole `StatusReport` besides what this answer says, where the wire can
    /// carry both (a written answer); other answers stay as they are.
    pub fn and_resend_status(mut self) -> Self {
        if let Self::Written { resend_status }
        | Self::Registered { resend_status, .. }
        | Self::Renewed { resend_status, .. } = &mut self
        {
            *resend_status = true;
        }
        self
    }

    /// Whether this answer says more than "written": not written, or asking for a status
    /// report, or accepting a `Register`. A quiet message
    /// ([`crate::AgentMessage::is_quiet`]) is answered only with news; every transport
    /// applies the rule through [`crate::answer_needed`].
    pub fn is_news(&self) -> bool {
        match self {
            Self::Written { resend_status } | Self::Renewed { resend_status, .. } => *resend_status,
            _ => true,
        }
    }

    /// The wire form answering the message with `Header.seq` `seq`.
    pub fn into_ack(self, seq: u64) -> Ack {
        let code = self.code();
        let mut ack = Ack {
            seq,
            code: code.into(),
            resend_status: self.asks_for_status(),
            ..Ack::default()
        };
        match self {
            Self::Written { .. } => {}
            Self::Registered {
                headers,
                certificate_due,
                ..
            } => {
                ack.certificate_due = certificate_due;
                ack.registered = true;
                ack.compact_headers = headers != HeaderForm::Full;
                ack.boot_tags = headers == HeaderForm::CompactBootTag;
            }
            Self::Renewed { lease_state, .. } => ack.lease_state = lease_state,
            Self::Retry { reason } | Self::ResendStatus { reason } | Self::Rejected { reason } => {
                ack.reason = reason;
            }
            Self::SendBootId { reason } => {
                ack.send_boot_id = true;
                ack.reason = reason;
            }
            Self::SendCertificate { reason } => {
                ack.send_certificate = true;
                ack.reason = reason;
            }
            Self::NodeNotFound { reason } => {
                ack.node_not_found = true;
                ack.reason = reason;
            }
        }
        ack
    }
}

impl TryFrom<Ack> for Answer {
    type Error = AckError;

    /// Reads an [`Ack`] (read its `seq` first). Errors: [`AckError`] for an unknown code and
    /// for every flag the code cannot carry: `registered`, `compact_headers`, `boot_tags` or
    /// `lease_state` on anything but OK, `boot_tags` without `compact_headers`, headers
    /// without `registered`, a Lease state on a `Register`'s answer, `send_boot_id`,
    /// `send_certificate` or `node_not_found` on anything but RETRY, two RETRY flags
    /// together, any flag on a REJECTED. `reason` is kept only where the answer has one.
    /// `node_name` and `boot_tag` say whom the ack answers, not what: they are the
    /// transport's to check (signed answers), and not read here.
    fn try_from(ack: Ack) -> Result<Self, AckError> {
        let code = AckCode::try_from(ack.code).map_err(|_| AckError("unknown code"))?;
        let ok_only = ack.registered
            || ack.compact_headers
            || ack.boot_tags
            || ack.certificate_due
            || !ack.lease_state.is_empty();
        let retry_flags = u8::from(ack.resend_status)
            + u8::from(ack.send_boot_id)
            + u8::from(ack.send_certificate)
            + u8::from(ack.node_not_found);
        match code {
            AckCode::Unspecified => Err(AckError("code unspecified")),
            AckCode::Ok => {
                if ack.send_boot_id || ack.send_certificate || ack.node_not_found {
                    return Err(AckError(
                        "send_boot_id, send_certificate or node_not_found on an OK",
                    ));
                }
                if ack.boot_tags && !ack.compact_headers {
                    return Err(AckError("boot_tags without compact_headers"));
                }
                let resend_status = ack.resend_status;
                if ack.registered {
                    if !ack.lease_state.is_empty() {
                        return Err(AckError("a Lease state on a Register's answer"));
                    }
                    let headers = match (ack.compact_headers, ack.boot_tags) {
                        (false, _) => HeaderForm::Full,
                        (true, false) => HeaderForm::Compact,
                        (true, true) => HeaderForm::CompactBootTag,
                    };
                    return Ok(Self::Registered {
                        headers,
                        resend_status,
                        certificate_due: ack.certificate_due,
                    });
                }
                if ack.certificate_due {
                    return Err(AckError("certificate_due without registered"));
                }
                if ack.compact_headers {
                    return Err(AckError("compact_headers without registered"));
                }
                if ack.lease_state.is_empty() {
                    Ok(Self::Written { resend_status })
                } else {
                    Ok(Self::Renewed {
                        lease_state: ack.lease_state,
                        resend_status,
                    })
                }
            }
            AckCode::Retry => {
                if ok_only {
                    return Err(AckError("registered, headers or a Lease state on a RETRY"));
                }
                if retry_flags > 1 {
                    return Err(AckError(
                        "more than one of resend_status, send_boot_id, send_certificate, node_not_found",
                    ));
                }
                let reason = ack.reason;
                Ok(if ack.resend_status {
                    Self::ResendStatus { reason }
                } else if ack.send_boot_id {
                    Self::SendBootId { reason }
                } else if ack.send_certificate {
                    Self::SendCertificate { reason }
                } else if ack.node_not_found {
                    Self::NodeNotFound { reason }
                } else {
                    Self::Retry { reason }
                })
            }
            AckCode::Rejected => {
                if ok_only || retry_flags > 0 {
                    return Err(AckError("a flag on a REJECTED"));
                }
                Ok(Self::Rejected { reason: ack.reason })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_answer() -> Vec<Answer> {
        let reason = || "why".to_owned();
        let mut all = Vec::new();
        for resend_status in [false, true] {
            all.push(Answer::Written { resend_status });
            for headers in [
                HeaderForm::Full,
                HeaderForm::Compact,
                HeaderForm::CompactBootTag,
            ] {
                for certificate_due in [false, true] {
                    all.push(Answer::Registered {
                        headers,
                        resend_status,
                        certificate_due,
                    });
                }
            }
            all.push(Answer::Renewed {
                lease_state: vec![1, 2, 3],
                resend_status,
            });
        }
        all.extend([
            Answer::Retry { reason: reason() },
            Answer::ResendStatus { reason: reason() },
            Answer::SendBootId { reason: reason() },
            Answer::SendCertificate { reason: reason() },
            Answer::NodeNotFound { reason: reason() },
            Answer::Rejected { reason: reason() },
        ]);
        all
    }

    #[test]
    fn every_answer_is_one_wire_shape_and_reads_back_as_itself() {
        let all = every_answer();
        let acks: Vec<Ack> = all.iter().map(|a| a.clone().into_ack(7)).collect();
        for (answer, ack) in all.iter().zip(&acks) {
            assert_eq!(ack.seq, 7);
            assert_eq!(Answer::try_from(ack.clone()).as_ref(), Ok(answer));
        }
        for (i, a) in acks.iter().enumerate() {
            for b in &acks[i + 1..] {
                assert_ne!(a, b, "two answers share a wire shape");
            }
        }
    }

    #[test]
    fn contradictory_acks_are_refused_naming_the_contradiction() {
        let ok = Ack {
            code: AckCode::Ok.into(),
            ..Ack::default()
        };
        let retry = Ack {
            code: AckCode::Retry.into(),
            ..Ack::default()
        };
        let rejected = Ack {
            code: AckCode::Rejected.into(),
            ..Ack::default()
        };
        let cases = [
            (Ack::default(), "code unspecified"),
            (
                Ack {
                    code: 9,
                    ..Ack::default()
                },
                "unknown code",
            ),
            (
                Ack {
                    registered: true,
                    ..retry.clone()
                },
                "RETRY",
            ),
            (
                Ack {
                    lease_state: vec![1],
                    ..retry.clone()
                },
                "RETRY",
            ),
            (
                Ack {
                    node_not_found: true,
                    ..ok.clone()
                },
                "on an OK",
            ),
            (
                Ack {
                    send_boot_id: true,
                    ..ok.clone()
                },
                "on an OK",
            ),
            (
                Ack {
                    send_certificate: true,
                    ..ok.clone()
                },
                "on an OK",
            ),
            (
                Ack {
                    send_certificate: true,
                    send_boot_id: true,
                    ..retry.clone()
                },
                "more than one",
            ),
            (
                Ack {
                    registered: true,
                    boot_tags: true,
                    ..ok.clone()
                },
                "boot_tags without compact_headers",
            ),
            (
                Ack {
                    compact_headers: true,
                    ..ok.clone()
                },
                "without registered",
            ),
            (
                Ack {
                    registered: true,
                    lease_state: vec![1],
                    ..ok.clone()
                },
                "Register's answer",
            ),
            (
                Ack {
                    send_boot_id: true,
                    node_not_found: true,
                    ..retry
                },
                "more than one",
            ),
            (
                Ack {
                    resend_status: true,
                    ..rejected
                },
                "REJECTED",
            ),
        ];
        for (ack, names) in cases {
            let err = Answer::try_from(ack.clone()).expect_err(&format!("{ack:?}"));
            assert!(err.to_string().contains(names), "{ack:?}: {err}");
        }
    }

    #[test]
    fn only_written_answers_without_a_status_request_are_no_news() {
        for answer in every_answer() {
            let quiet_ok = matches!(
                answer,
                Answer::Written {
                    resend_status: false
                } | Answer::Renewed {
                    resend_status: false,
                    ..
                }
            );
            assert_eq!(answer.is_news(), !quiet_ok, "{answer:?}");
        }
        assert!(Answer::WRITTEN.and_resend_status().asks_for_status());
        let refused = Answer::Retry { reason: "x".into() };
        assert_eq!(refused.clone().and_resend_status(), refused);
    }
}
