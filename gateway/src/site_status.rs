//! The loop of [`crate::sites`]: every [`TICK`], the site rule applied to the fleet the
//! replica's watch holds, and what it decides written to the apiserver (the
//! `SiteUnreachable` condition and the site's Events). The rule itself is I/O-free in
//! [`crate::sites`].

use parking_lot::Mutex;
use std::sync::Arc;

use edgebeat_proto::EventType;
use jiff::Timestamp;

use crate::apiserver::{Apiserver, answers};
use crate::bodies;
use crate::sites::{
    self, Action, Cause, REASON_REACHABLE, SiteTracker, TICK, condition_patch, event_name,
};
use crate::view::ApiserverView;

/// Follows the sites of the managed fleet in `view` every [`TICK`], and at once when `wake`
/// is notified (a bridge notification), writing through `api` (see the module docs); until
/// dropped. `now` reads the gateway clock.
pub async fn follow(
    view: Arc<ApiserverView>,
    api: Apiserver,
    tracker: Arc<Mutex<SiteTracker>>,
    wake: Arc<tokio::sync::Notify>,
    now: impl Fn() -> Timestamp + Send + 'static,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When this loop last took a partition back because the apiserver did not take its
    // Event: the sites are held for as long as after a recovery, then judged (and the Event
    // tried) again.
    let mut retracted: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = wake.notified() => {}
        }
        if !(view.nodes_watched() && view.leases_watched()) {
            // Without the fleet in view, silence cannot be told from not knowing.
            continue;
        }
        let now = now();
        let members = view.site_members();
        let health = api.write_health();
        let held = sites::held(health.failing, health.since_recovery, &members)
            || retracted.is_some_and(|at| at.elapsed() < sites::hold_after(&members));
        let actions = {
            let mut tracker = tracker.lock();
            if held != tracker.is_held() {
                tracing::info!(
                    held,
                    "{}",
                    if held {
                        "sites held as they are: the apiserver does not take this replica's Lease writes, so Lease ages say nothing of the sites"
                    } else {
                        "sites judged again: the apiserver has taken writes for two renew intervals"
                    }
                );
            }
            tracker.hold(held);
            if held {
                continue;
            }
            tracker.look(&members, now)
        };
        for action in actions {
            // Events are about the first node of the site by name.
            let about = match &action {
                Action::Partitioned { site, .. } | Action::Returned { site, .. } => members
                    .get(site)
                    .and_then(|m| m.iter().map(|m| m.node.clone()).min()),
                _ => None,
            };
            let written = write(&api, &view, &action, about.as_deref(), now).await;
            if let (Action::Partitioned { site, .. }, Written::Trouble) = (&action, written) {
                // The apiserver, not the site: take it back, hold, and write nothing more
                // of this look (judged from the same Leases).
                let mut tracker = tracker.lock();
                tracker.retract(site);
                tracker.hold(true);
                retracted = Some(tokio::time::Instant::now());
                tracing::info!(
                    site = &**site,
                    "a site's partition taken back: the apiserver did not take its Event (429, 5xx or no answer), so its nodes' Lease ages say nothing of the site; sites held as they are"
                );
                break;
            }
        }
    }
}

/// Whether an action was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// Recorded (or recorded already, by another replica).
    Yes,
    /// Not: the apiserver answered 429, 5xx or nothing.
    Trouble,
    /// Not, for another reason (a 403, a 422).
    Refused,
}

/// Records `action` (see the module docs); a patched Node's answer goes into `view`, so the
/// next look sees the condition written and does not write it again.
async fn write(
    api: &Apiserver,
    view: &ApiserverView,
    action: &Action,
    about: Option<&str>,
    now: Timestamp,
) -> Written {
    let result = send(api, view, action, about, now).await;
    outcome(api, action, result)
}

/// The apiserver call of `action`: an Event about the node `about` (none without one) for
/// a site, a status patch for a node.
///
/// Errors: the apiserver's.
async fn send(
    api: &Apiserver,
    view: &ApiserverView,
    action: &Action,
    about: Option<&str>,
    now: Timestamp,
) -> Result<(), kube::Error> {
    match action {
        Action::Partitioned { site, partition } => {
            let how = match partition.cause {
                Cause::Silent => "nodes went silent together",
                Cause::UplinkDown => "nodes behind a bridge that went down",
            };
            let message = format!(
                "Site {site} unreachable since {}: {} {how} ({})",
                bodies::whole_seconds(partition.since),
                partition.nodes.len(),
                partition.nodes.join(", ")
            );
            event(
                api,
                site,
                partition.cause.event_word(),
                partition.since,
                EventType::Warning,
                partition.cause.reason(),
                message,
                about,
                now,
            )
            .await
        }
        Action::Returned {
            site,
            partition,
            at,
        } => {
            let down = at.duration_since(partition.since);
            let message = format!(
                "Site {site} reachable again at {} after {}s unreachable",
                bodies::whole_seconds(*at),
                down.as_secs()
            );
            event(
                api,
                site,
                "reachable",
                partition.since,
                EventType::Normal,
                REASON_REACHABLE,
                message,
                about,
                now,
            )
            .await
        }
        Action::Unreachable {
            node,
            site,
            since,
            cause,
        } => {
            let why = match cause {
                Cause::Silent => "the node's site went silent with it",
                Cause::UplinkDown => "the site broker's bridge to the cluster is down",
            };
            let message = format!(
                "Site {site} unreachable since {}: {why}",
                bodies::whole_seconds(*since)
            );
            api.patch_node_status(
                node,
                condition_patch(true, cause.reason(), &message, *since),
            )
            .await
            .map(|written| view.observe_node(&written))
        }
        Action::Reachable { node, at } => api
            .patch_node_status(
                node,
                condition_patch(false, REASON_REACHABLE, "The node's site is reachable", *at),
            )
            .await
            .map(|written| view.observe_node(&written)),
    }
}

/// What became of `action` (`result`, the apiserver's answer), logged: a cut site's
/// warning whether or not its Event was written, apiserver trouble at debug level during
/// an outage.
fn outcome(api: &Apiserver, action: &Action, result: Result<(), kube::Error>) -> Written {
    match (result, action) {
        (Ok(()), Action::Partitioned { site, partition }) => {
            log_cut(site, partition);
            Written::Yes
        }
        (
            Ok(()),
            Action::Returned {
                site,
                partition,
                at,
            },
        ) => {
            tracing::info!(
                site = &**site,
                down_s = at.duration_since(partition.since).as_secs(),
                "site reachable again"
            );
            Written::Yes
        }
        (Ok(()), _) => Written::Yes,
        (Err(error), _) if crate::apiserver::is_trouble(&error) => {
            if api.in_outage() {
                tracing::debug!(?action, %error, "could not record a site's state");
            } else {
                tracing::warn!(?action, %error, "could not record a site's state");
            }
            Written::Trouble
        }
        (Err(error), _) => {
            if let Action::Partitioned { site, partition } = action {
                log_cut(site, partition);
            }
            tracing::warn!(?action, %error, "could not record a site's state");
            Written::Refused
        }
    }
}

/// The line of a partition that stands (its Event written, or refused for another reason
/// than the apiserver's trouble).
fn log_cut(site: &str, partition: &crate::sites::Partition) {
    tracing::warn!(
        site,
        nodes = partition.nodes.len(),
        since = %partition.since,
        cause = partition.cause.reason(),
        "site cut off"
    );
}

#[allow(clippy::too_many_arguments)]
async fn event(
    api: &Apiserver,
    site: &str,
    what: &str,
    since: Timestamp,
    type_: EventType,
    reason: &str,
    message: String,
    about: Option<&str>,
    now: Timestamp,
) -> Result<(), kube::Error> {
    let Some(node) = about else {
        return Ok(());
    };
    let mut event = bodies::node_event(node, type_, reason, message, now, 0);
    event.metadata.name = Some(event_name(site, what, since));
    event.source = Some(k8s_openapi::api::core::v1::EventSource {
        component: Some("edgebeat-gateway".into()),
        host: None,
    });
    event.reporting_component = Some("edgebeat-gateway".into());
    event.reporting_instance = None;
    match api.create_event(node, &event).await {
        // Another replica recorded it first.
        Err(e) if answers::is_already_exists(&e) => Ok(()),
        other => other.map(drop),
    }
}
