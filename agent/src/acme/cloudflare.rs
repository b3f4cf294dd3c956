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
//! from its file for each call and only ever sent in the `Authorization` header.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use hickory_proto::rr::Name;
use serde::Deserialize;

use super::dns01::Dns01Error;

/// Cloudflare's API root.
pub const API: &str = "https://api.cloudflare.com/client/v4";
/// TTL of a challenge record, seconds (Cloudflare's minimum for a non-automatic TTL).
const CHALLENGE_TTL: u32 = 120;
/// One API call's deadline.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Cloudflare {
    api: String,
    token_file: PathBuf,
    agent: ureq::Agent,
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
    /// `api` is [`API`] but for tests against a stand-in of the same endpoints.
    pub fn new(api: String, token_file: PathBuf) -> Cloudflare {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(CALL_TIMEOUT))
            .build()
            .into();
        Cloudflare {
            api: api.trim_end_matches('/').to_owned(),
            token_file,
            agent,
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
        let url = format!("{}{path}", self.api);
        let agent = self.agent.clone();
        let query: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let response = tokio::task::spawn_blocking(move || {
            let authorization = format!("Bearer {}", token.expose());
            let result = match (method, body) {
                ("POST", Some(body)) => agent
                    .post(&url)
                    .header("Authorization", &authorization)
                    .header("Content-Type", "application/json")
                    .query_pairs(query.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                    .send(body.to_string()),
                ("DELETE", _) => agent
                    .delete(&url)
                    .header("Authorization", &authorization)
                    .query_pairs(query.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                    .call(),
                _ => agent
                    .get(&url)
                    .header("Authorization", &authorization)
                    .query_pairs(query.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                    .call(),
            };
            result.and_then(|mut r| {
                let status = r.status().as_u16();
                r.body_mut().read_to_string().map(|text| (status, text))
            })
        })
        .await
        .map_err(|e| fail(e.to_string()))?
        .map_err(|e| fail(e.to_string()))?;
        let (status, text) = response;
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

/// The record's name without its final dot, as Cloudflare writes names.
fn bare(name: &Name) -> String {
    name.to_ascii().trim_end_matches('.').to_owned()
}
