//! DNS-01 through Cloudflare's v4 API with an API token (Zone:DNS:Edit), using only its documented
//! endpoints:
//!
//! - `GET /zones?name=<zone>`: the zone's id, trying the record's name and then each parent until
//!   one is a zone of the account (the token's view decides, not a guess at the zone cut);
//! - `POST /zones/{zone_id}/dns_records`: the TXT record;
//! - `GET /zones/{zone_id}/dns_records?type=TXT&name=<name>&content=<value>` and
//!   `DELETE /zones/{zone_id}/dns_records/{id}`: removal of exactly the value added.
//!
//! Every answer is wrapped as `{ success, errors: [{ code, message }], result }`. The token is read
//! from its file for each call and only ever sent in the `Authorization` header, over HTTPS
//! verified against the platform's roots ([`super::http`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use hickory_proto::rr::Name;
use instant_acme::BodyWrapper;
use serde::Deserialize;

use super::dns01::Dns01Error;
use super::http::{self as https, Https};

/// Cloudflare's API root.
pub const API: &str = "https://api.cloudflare.com/client/v4";
/// TTL of a challenge record, seconds (Cloudflare's minimum for a non-automatic TTL).
const CHALLENGE_TTL: u32 = 120;
/// One API call's deadline.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Cloudflare {
    api: String,
    token_file: PathBuf,
    http: Https,
    /// Zone ids by zone name, found once.
    zones: Mutex<HashMap<String, String>>,
}

#[derive(Deserialize)]
struct Envelope<T> {
    success: bool,
    #[serde(default)]
    errors: Vec<ApiError>,
    result: Option<T>,
}

#[derive(Deserialize)]
struct ApiError {
    code: i64,
    message: String,
}

#[derive(Deserialize)]
struct Item {
    id: String,
    #[serde(default)]
    name: String,
}

impl Cloudflare {
    /// `api` is [`API`] but for tests against a stand-in of the same endpoints; `http` is the
    /// client that reaches it.
    pub fn new(api: String, token_file: PathBuf, http: Https) -> Cloudflare {
        Cloudflare {
            api: api.trim_end_matches('/').to_owned(),
            token_file,
            http,
            zones: Mutex::new(HashMap::new()),
        }
    }

    pub async fn present(&self, name: &Name, value: &str) -> Result<(), Dns01Error> {
        let record = bare(name);
        let zone = self.zone_id(&record).await?;
        let body = serde_json::json!({
            "type": "TXT",
            "name": record,
            "content": value,
            "ttl": CHALLENGE_TTL,
        });
        let _: Item = self
            .call(
                "POST",
                &format!("/zones/{zone}/dns_records"),
                &[],
                Some(body),
            )
            .await?;
        Ok(())
    }

    pub async fn cleanup(&self, name: &Name, value: &str) -> Result<(), Dns01Error> {
        let record = bare(name);
        let zone = self.zone_id(&record).await?;
        let found: Vec<Item> = self
            .call(
                "GET",
                &format!("/zones/{zone}/dns_records"),
                &[("type", "TXT"), ("name", &record), ("content", value)],
                None,
            )
            .await?;
        for item in found {
            let _: serde_json::Value = self
                .call(
                    "DELETE",
                    &format!("/zones/{zone}/dns_records/{}", item.id),
                    &[],
                    None,
                )
                .await?;
        }
        Ok(())
    }

    /// The id of the closest enclosing zone of `record` in the account.
    async fn zone_id(&self, record: &str) -> Result<String, Dns01Error> {
        let labels: Vec<&str> = record.split('.').collect();
        // From the record's parent up to a two-label name: a zone is never a bare TLD.
        for start in 1..labels.len().saturating_sub(1) {
            let candidate = labels[start..].join(".");
            if let Some(id) = self.cached(&candidate) {
                return Ok(id);
            }
            let zones: Vec<Item> = self
                .call("GET", "/zones", &[("name", &candidate)], None)
                .await?;
            if let Some(zone) = zones
                .into_iter()
                .find(|z| z.name.is_empty() || z.name == candidate)
            {
                self.zones
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(candidate, zone.id.clone());
                return Ok(zone.id);
            }
        }
        Err(Dns01Error::Cloudflare {
            what: format!("finding the zone of {record}"),
            reason: "no enclosing zone is visible to the API token".into(),
        })
    }

    fn cached(&self, zone: &str) -> Option<String> {
        self.zones
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(zone)
            .cloned()
    }

    async fn call<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        method: &'static str,
        path: &str,
        query: &[(&str, &str)],
        body: Option<serde_json::Value>,
    ) -> Result<T, Dns01Error> {
        let what = format!("{method} {path}");
        let fail = {
            let what = what.clone();
            move |reason: String| Dns01Error::Cloudflare {
                what: what.clone(),
                reason,
            }
        };
        let token = super::secret::read(&self.token_file)?;
        let mut url = format!("{}{path}", self.api);
        if !query.is_empty() {
            url.push('?');
            url.push_str(&encode_query(query));
        }
        let mut request = http::Request::builder().method(method).uri(&url).header(
            http::header::AUTHORIZATION,
            format!("Bearer {}", token.expose()),
        );
        let body = match body {
            Some(body) => {
                request = request.header(http::header::CONTENT_TYPE, "application/json");
                BodyWrapper::from(body.to_string().into_bytes())
            }
            None => BodyWrapper::<Bytes>::default(),
        };
        let request = request.body(body).map_err(|e| fail(e.to_string()))?;
        let response = https::exchange(&self.http, request, CALL_TIMEOUT)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = response.status().as_u16();
        let text = String::from_utf8_lossy(response.body());
        let envelope: Envelope<T> = serde_json::from_str(&text)
            .map_err(|e| fail(format!("HTTP {status}, not an API answer ({e})")))?;
        if !envelope.success {
            let errors: Vec<String> = envelope
                .errors
                .iter()
                .map(|e| format!("{} (code {})", e.message, e.code))
                .collect();
            return Err(fail(format!("HTTP {status}: {}", errors.join("; "))));
        }
        envelope
            .result
            .ok_or_else(|| fail(format!("HTTP {status}: an answer without a result")))
    }
}

/// `k=v&…`, as a form's query (`application/x-www-form-urlencoded`).
fn encode_query(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// The record's name without its final dot, as Cloudflare writes names.
fn bare(name: &Name) -> String {
    name.to_ascii().trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acme::http::{client, Roots};

    async fn https_server(answer: &'static str) -> (std::net::SocketAddr, String) {
        crate::acme::http::tests::tls_server(crate::acme::http::tests::Behaviour::Answer(answer))
            .await
    }

    /// The provider's API is HTTPS: a call to an `https://` root goes through TLS, verified
    /// against the roots given, and never fails for want of a TLS stack.
    #[tokio::test]
    async fn an_https_api_root_is_reached_over_verified_tls() {
        let (address, ca) = https_server(
            r#"{"success":true,"errors":[],"result":[{"id":"zone0001","name":"example.org"}]}"#,
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let (ca_file, token_file) = (dir.path().join("ca.pem"), dir.path().join("token"));
        std::fs::write(&ca_file, ca).unwrap();
        std::fs::write(&token_file, "t0ken\n").unwrap();
        let api = format!("https://{address}/client/v4");

        let trusted = Cloudflare::new(
            api.clone(),
            token_file.clone(),
            client(Roots::Bundle(&ca_file)).unwrap(),
        );
        assert_eq!(
            trusted.zone_id("_acme-challenge.a.example.org").await,
            Ok("zone0001".to_owned())
        );

        // Not trusting the server's CA, the call fails on its certificate: TLS ran.
        let untrusted = Cloudflare::new(api, token_file, client(Roots::Platform).unwrap());
        let error = untrusted
            .zone_id("_acme-challenge.a.example.org")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("certificate") && !error.to_lowercase().contains("tls required"),
            "{error}"
        );
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(
            encode_query(&[("name", "_acme-challenge.a.b"), ("content", "a+b/c=")]),
            "name=_acme-challenge.a.b&content=a%2Bb%2Fc%3D"
        );
    }
}
