//! A connection's view of its port's link, from the asynchronous events
//! (ibv_get_async_event(3): `IBV_EVENT_PORT_ERR`, `IBV_EVENT_PORT_ACTIVE`).
//! A port that goes down does not break a connection by itself: its queue
//! pairs stay in RTS and retry, so a link that flaps back within their
//! retries loses nothing (as NCCL, which logs port events and keeps its
//! connections). One that stays down fails them with retry exceeded; the
//! connection's error then says the port went down and did not come back.

use std::time::Instant;

use crate::verbs::AsyncEvent;

/// Whether (and since when) the connection's port is down.
#[derive(Debug, Default)]
pub(crate) struct LinkWatch {
    down_since: Option<(u8, Instant)>,
}

impl LinkWatch {
    /// Takes a non-fatal event of the connection to `peer` on `device`.
    pub(crate) fn on_event(&mut self, ev: &AsyncEvent, device: &str, peer: usize) {
        match *ev {
            AsyncEvent::PortErr { port } => {
                tracing::warn!(
                    device,
                    peer,
                    "RDMA {ev}; the connection's queue pairs keep retrying until the link \
                     comes back or their retries run out"
                );
                self.down_since.get_or_insert((port, Instant::now()));
            }
            AsyncEvent::PortActive { port } => {
                if let Some((_, since)) = self.down_since.take() {
                    tracing::warn!(
                        device,
                        peer,
                        "RDMA port {port} is back after {:.3} s down; the connection goes on",
                        since.elapsed().as_secs_f64()
                    );
                }
            }
            _ => tracing::debug!(device, peer, "rdma async event: {ev}"),
        }
    }

    /// `detail` of a failure, with the port named where it is down.
    pub(crate) fn annotate(&self, detail: String) -> String {
        match self.down_since {
            Some((port, since)) => format!(
                "{detail} (port {port} went down (IBV_EVENT_PORT_ERR) {:.1} s before and has \
                 not come back: check the cable, the switch port and `ibstat`)",
                since.elapsed().as_secs_f64()
            ),
            None => detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_a_port_that_is_down_and_not_one_that_came_back() {
        let mut w = LinkWatch::default();
        assert_eq!(w.annotate("x".into()), "x");
        w.on_event(&AsyncEvent::PortErr { port: 1 }, "mlx5_0:1", 3);
        assert!(w.annotate("x".into()).contains("port 1 went down"));
        w.on_event(&AsyncEvent::PortActive { port: 1 }, "mlx5_0:1", 3);
        assert_eq!(w.annotate("x".into()), "x");
    }
}
