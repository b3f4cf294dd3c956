//! Upstream name resolution through the system resolver (getaddrinfo): every A and AAAA address.
//! The loop re-resolves on a timer; a failed lookup keeps the last known addresses.

use std::net::IpAddr;

/// [`crate::reconcile::Resolve`] backed by the operating system's resolver.
pub struct SystemResolver;

impl crate::reconcile::Resolve for SystemResolver {
    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, String> {
        // The port is irrelevant to the lookup; getaddrinfo wants one.
        let addresses = tokio::net::lookup_host((name, 0))
            .await
            .map_err(|e| e.to_string())?;
        Ok(addresses.map(|a| a.ip()).collect())
    }
}
