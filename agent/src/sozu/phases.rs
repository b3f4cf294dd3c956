//! A plan sent phase after phase. Operations of one phase are independent and are spread over
//! several connections, which sozu serves concurrently: a cold start of a thousand routes is bound
//! by round trips, not by work. Phases go strictly in order.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::plan::{depends_on, phase, Op, Outcome};

/// Why sending a request failed.
pub enum SendError {
    /// sozu refused this request; later ones may still go.
    Refused(String),
    /// The connection is gone; nothing more can be sent.
    Broken(String),
}

/// Sends `ops` through `send`, phase after phase. The operations of one phase are independent and
/// are spread over `lanes` connections (lane `i` of `send`), which sozu serves concurrently: a cold
/// start of a thousand routes is bound by round trips, not by work.
///
/// A refusal holds back only the requests that depend on the refused one (a route's frontends on
/// its certificate and its cluster, all in later phases), so one bad certificate does not keep
/// every other route from being served; a broken connection stops everything.
pub fn send_in_phases(
    ops: &[Op],
    lanes: usize,
    send: impl Fn(usize, &Op) -> Result<Option<u64>, SendError> + Sync,
) -> Vec<Outcome> {
    let lanes = lanes.max(1);
    let mut outcomes: Vec<Option<Outcome>> = vec![None; ops.len()];
    let mut refused: Vec<usize> = Vec::new();
    let mut broken: Option<String> = None;
    let mut start = 0;
    while start < ops.len() {
        let current = phase(&ops[start]);
        let end = ops[start..]
            .iter()
            .position(|op| phase(op) != current)
            .map_or(ops.len(), |n| start + n);
        let mut todo = Vec::new();
        for i in start..end {
            if let Some(reason) = &broken {
                outcomes[i] = Some(Outcome::NotSent(reason.clone()));
            } else if refused.iter().any(|&r| depends_on(&ops[i], &ops[r])) {
                outcomes[i] = Some(Outcome::Skipped);
            } else {
                todo.push(i);
            }
        }
        let stop = AtomicBool::new(false);
        let used = lanes.min(todo.len().max(1));
        let run_lane = |lane: usize| {
            let mut done = Vec::new();
            for &i in todo.iter().skip(lane).step_by(used) {
                if stop.load(Ordering::Relaxed) {
                    done.push((i, Outcome::NotSent("connection lost".into())));
                    continue;
                }
                let outcome = match send(lane, &ops[i]) {
                    Ok(None) => Outcome::Applied,
                    Ok(Some(draining)) => Outcome::Closing(draining),
                    Err(SendError::Refused(reason)) => Outcome::Refused(reason),
                    Err(SendError::Broken(reason)) => {
                        stop.store(true, Ordering::Relaxed);
                        Outcome::NotSent(reason)
                    }
                };
                done.push((i, outcome));
            }
            done
        };
        // One lane's worth (a rotation is one request) goes on this thread: starting and joining
        // a thread would be most of the agent's own share of the rotation.
        let results: Vec<(usize, Outcome)> = if used == 1 {
            run_lane(0)
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..used)
                    .map(|lane| {
                        let run_lane = &run_lane;
                        scope.spawn(move || run_lane(lane))
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_default())
                    .collect()
            })
        };
        for (i, outcome) in results {
            match &outcome {
                Outcome::Refused(_) => refused.push(i),
                Outcome::NotSent(reason) if broken.is_none() => broken = Some(reason.clone()),
                _ => {}
            }
            outcomes[i] = Some(outcome);
        }
        start = end;
    }
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or(Outcome::NotSent("not attempted".into())))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::plan::state::{Actual, Protocol};
    use crate::plan::tests::{cert, desired, workspace};
    use crate::plan::{apply, plan};

    #[test]
    fn a_refused_certificate_holds_back_only_its_own_host() {
        let ws = workspace(&[
            ("a.in.example.org", "/", "10.0.0.1:80"),
            ("b.in.example.org", "/", "10.0.0.2:80"),
        ]);
        let bad = cert("b.in.example.org", 2);
        let ops = plan(
            &Actual::default(),
            &desired(&ws, &[cert("a.in.example.org", 1), bad.clone()]),
        );
        let sent = std::sync::Mutex::new(Actual::default());
        let outcomes = send_in_phases(&ops, 1, |_, op| match op {
            Op::AddCertificate { certificate, .. } if *certificate == bad => {
                Err(SendError::Refused("KeyMismatch".into()))
            }
            op => {
                apply(&mut sent.lock().unwrap(), op);
                Ok(None)
            }
        });
        let hosts: BTreeSet<_> = sent
            .into_inner()
            .unwrap()
            .frontends
            .iter()
            .map(|f| (f.hostname.clone(), f.protocol))
            .collect();
        assert!(hosts.contains(&("a.in.example.org".to_owned(), Protocol::Https)));
        assert!(
            !hosts.contains(&("b.in.example.org".to_owned(), Protocol::Https)),
            "{hosts:?}"
        );
        assert_eq!(
            outcomes.iter().filter(|o| **o == Outcome::Skipped).count(),
            1
        );
        // A broken connection stops everything after it.
        let outcomes = send_in_phases(&ops, 1, |_, _| Err(SendError::Broken("EPIPE".into())));
        assert!(outcomes.iter().all(|o| matches!(o, Outcome::NotSent(_))));
    }

    #[test]
    fn phases_sent_over_several_lanes_converge_like_one_lane() {
        let routes: Vec<(String, String)> = (0..40)
            .map(|i| {
                (
                    format!("h{i}.in.example.org"),
                    format!("10.0.0.{}:80", i + 1),
                )
            })
            .collect();
        let spec: Vec<(&str, &str, &str)> = routes
            .iter()
            .map(|(h, u)| (h.as_str(), "/", u.as_str()))
            .collect();
        let certs: Vec<_> = routes
            .iter()
            .enumerate()
            .map(|(i, (h, _))| cert(h, i as u8))
            .collect();
        let ws = workspace(&spec);
        let want = desired(&ws, &certs);
        let ops = plan(&Actual::default(), &want);
        // Phases are contiguous in a plan.
        let phases: Vec<u32> = ops.iter().map(phase).collect();
        assert!(phases.windows(2).all(|w| w[0] <= w[1]), "{phases:?}");
        let sent = std::sync::Mutex::new(Actual::default());
        let seen_phase = std::sync::Mutex::new(0u32);
        let outcomes = send_in_phases(&ops, 4, |_, op| {
            let mut last = seen_phase.lock().unwrap();
            assert!(
                phase(op) >= *last,
                "a phase started before the previous one ended"
            );
            *last = phase(op);
            apply(&mut sent.lock().unwrap(), op);
            Ok(None)
        });
        assert!(outcomes.iter().all(|o| *o == Outcome::Applied));
        assert_eq!(plan(&sent.into_inner().unwrap(), &want), []);
    }
}
