//! Where DNS-01 TXT records are published: the workspace's `acme.dns01` provider. Adding a
//! provider means a module beside [`super::rfc2136`] and [`super::cloudflare`] with `present`
//! and `cleanup`, a variant here, and its settings in the workspace (`Dns01`).

use hickory_proto::rr::Name;

use super::cloudflare::Cloudflare;
use super::dns01::Dns01Error;
use super::rfc2136::Rfc2136;

/// Where TXT records are published.
pub enum Provider {
    Rfc2136(Box<Rfc2136>),
    Cloudflare(Box<Cloudflare>),
}

impl Provider {
    /// Publishes `value` at `name`, beside any other value there.
    pub async fn present(&self, name: &Name, value: &str) -> Result<(), Dns01Error> {
        match self {
            Provider::Rfc2136(p) => p.present(name, value).await,
            Provider::Cloudflare(p) => p.present(name, value).await,
        }
    }

    /// Removes exactly `value` from `name`.
    pub async fn cleanup(&self, name: &Name, value: &str) -> Result<(), Dns01Error> {
        match self {
            Provider::Rfc2136(p) => p.cleanup(name, value).await,
            Provider::Cloudflare(p) => p.cleanup(name, value).await,
        }
    }
}
