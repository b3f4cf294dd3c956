//! The ACME account and the HTTP client under it.
//!
//! instant-acme runs on an HTTP client built here, for two reasons: a private CA's roots
//! (`acme.ca_bundle`, every certificate of the file, not only the first) must be trusted for its
//! TLS, and the `Retry-After` of a refused request (a rate limit, a CA in maintenance) must be
//! honoured, while instant-acme's errors drop the headers. Each order gets its own recorder of
//! that header, so concurrent orders do not read each other's.
//!
//! The account is created once per CA and its credentials (its private key) kept in the state
//! directory; every later start, and every order, restores it from there.

use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use instant_acme::{
    Account, AccountCredentials, BodyWrapper, BytesResponse, ExternalAccountKey, HttpClient,
    NewAccount,
};

use super::http::{self as https, Https, Roots};
use super::store::{blocking, json_failure, Store, StoreError};
use super::AcmeError;
use crate::workspace::Acme;

/// One request to the CA, its whole answer included. instant-acme polls an order with requests
/// of its own, each bounded by this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `Retry-After` taken as it is: a CA asking for more is asked again after a day.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// The latest `Retry-After` a refusal carried, as an absolute time.
pub type RetryAfter = Arc<Mutex<Option<SystemTime>>>;

/// An HTTP client for instant-acme that records the `Retry-After` of refused requests.
#[derive(Clone)]
struct Recording {
    inner: Https,
    retry_after: RetryAfter,
}

impl HttpClient for Recording {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>>
    {
        let client = self.inner.clone();
        let slot = self.retry_after.clone();
        Box::pin(async move {
            let response = https::exchange(&client, req, REQUEST_TIMEOUT)
                .await
                .map_err(|e| instant_acme::Error::Other(Box::new(e)))?;
            if !response.status().is_success() {
                if let Some(at) = retry_after(response.headers()) {
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
                }
            }
            Ok(BytesResponse::from(response.map(Full::new)))
        })
    }
}

/// `Retry-After: <seconds>` or `Retry-After: <HTTP date>`, at most [`MAX_RETRY_AFTER`] ahead.
fn retry_after(headers: &http::HeaderMap) -> Option<SystemTime> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let now = SystemTime::now();
    let at = match value.parse::<u64>() {
        Ok(seconds) => now.checked_add(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))?,
        Err(_) => httpdate_parse(value)?,
    };
    Some(at.min(now.checked_add(MAX_RETRY_AFTER)?))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form RFC 9110 requires of senders.
fn httpdate_parse(value: &str) -> Option<SystemTime> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let parsed = time::PrimitiveDateTime::parse(value, &format).ok()?;
    Some(parsed.assume_utc().into())
}

/// The CA's client: trusting the roots of `ca_bundle` only when given, else the platform's.
fn hyper(ca_bundle: Option<&Path>) -> Result<Https, AcmeError> {
    let roots = ca_bundle.map_or(Roots::Platform, Roots::Bundle);
    https::client(roots).map_err(|e| match e {
        https::HttpError::Bundle { path, reason } => AcmeError::CaBundle { path, reason },
        other => AcmeError::Tls(other.to_string()),
    })
}

/// An account at one CA, restorable once per order.
#[derive(Clone)]
pub struct AccountSource {
    http: Https,
    /// The serialised credentials (they hold the account key).
    credentials: Arc<serde_json::Value>,
    pub directory: String,
}

impl std::fmt::Debug for AccountSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountSource")
            .field("directory", &self.directory)
            .finish_non_exhaustive()
    }
}

impl AccountSource {
    /// The account for `settings.directory`: restored from the store, or created (with EAB when
    /// configured) and stored before it is used.
    pub async fn open(
        settings: &Acme,
        store: &Arc<Store>,
    ) -> Result<(AccountSource, bool), AcmeError> {
        let http = hyper(settings.ca_bundle.as_deref())?;
        let directory = settings.directory.clone();
        let stored = {
            let (store, directory) = (store.clone(), directory.clone());
            blocking(move || store.load_account::<serde_json::Value>(&directory)).await?
        };
        if let Some(credentials) = stored {
            let source = AccountSource {
                http,
                credentials: Arc::new(credentials),
                directory,
            };
            // Restoring fetches the directory: a CA that is down is known now.
            source.account().await?;
            return Ok((source, false));
        }
        let eab = match &settings.eab {
            Some(eab) => {
                let key = super::secret::read_base64(&eab.hmac_key_file)?;
                Some(ExternalAccountKey::new(eab.kid.clone(), &key))
            }
            None => None,
        };
        let contact: Vec<String> = settings
            .email
            .iter()
            .map(|e| format!("mailto:{e}"))
            .collect();
        let contact: Vec<&str> = contact.iter().map(String::as_str).collect();
        let builder = Account::builder_with_http(Box::new(Recording {
            inner: http.clone(),
            retry_after: RetryAfter::default(),
        }));
        let (_, credentials): (Account, AccountCredentials) = builder
            .create(
                &NewAccount {
                    contact: &contact,
                    terms_of_service_agreed: true,
                    only_return_existing: false,
                },
                directory.clone(),
                eab.as_ref(),
            )
            .await
            .map_err(AcmeError::from_acme)?;
        let credentials = serde_json::to_value(&credentials).map_err(|e| {
            AcmeError::Store(StoreError::Io {
                path: store.dir().to_owned(),
                reason: format!("cannot serialise the account: {}", json_failure(&e)),
            })
        })?;
        {
            let (store, directory, credentials) =
                (store.clone(), directory.clone(), credentials.clone());
            blocking(move || store.save_account(&directory, &credentials)).await?;
        }
        Ok((
            AccountSource {
                http,
                credentials: Arc::new(credentials),
                directory,
            },
            true,
        ))
    }

    /// The account, on a client of its own that records `Retry-After` into the returned slot.
    pub async fn account_recording(&self) -> Result<(Account, RetryAfter), AcmeError> {
        let slot = RetryAfter::default();
        let credentials: AccountCredentials = serde_json::from_value((*self.credentials).clone())
            .map_err(|e| {
            AcmeError::Store(StoreError::Corrupt {
                path: Path::new("accounts").to_owned(),
                reason: json_failure(&e).into(),
            })
        })?;
        let account = Account::builder_with_http(Box::new(Recording {
            inner: self.http.clone(),
            retry_after: slot.clone(),
        }))
        .from_credentials(credentials)
        .await
        .map_err(AcmeError::from_acme)?;
        Ok((account, slot))
    }

    pub async fn account(&self) -> Result<Account, AcmeError> {
        Ok(self.account_recording().await?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates_within_a_day() {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, "120".parse().unwrap());
        let at = retry_after(&headers).unwrap();
        let left = at.duration_since(SystemTime::now()).unwrap().as_secs();
        assert!((118..=120).contains(&left), "{left}");
        let soon = time::OffsetDateTime::now_utc() + time::Duration::hours(2);
        let format = time::macros::format_description!(
            "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
        );
        headers.insert(
            http::header::RETRY_AFTER,
            soon.format(&format).unwrap().parse().unwrap(),
        );
        let at = retry_after(&headers).unwrap();
        let unix = at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(unix, soon.unix_timestamp() as u64);
        headers.insert(http::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
        // A CA asking for longer than a day, or for longer than time itself, is asked again
        // after a day; nothing overflows.
        for far in ["18446744073709551615", "Sun, 06 Nov 2044 08:49:37 GMT"] {
            headers.insert(http::header::RETRY_AFTER, far.parse().unwrap());
            let at = retry_after(&headers).unwrap();
            let left = at.duration_since(SystemTime::now()).unwrap();
            assert!(
                left <= MAX_RETRY_AFTER && left > MAX_RETRY_AFTER - Duration::from_secs(5),
                "{far}: {left:?}"
            );
        }
    }
}
