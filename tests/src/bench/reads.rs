//! What sozu's listings cost: each listing the agent's state read may use, whole and filtered,
//! timed from the bench against the agent's sozu, with its answer's size on the wire.

use std::path::Path;
use std::time::{Duration, Instant};

use sozu_command_lib::channel::Channel;
use sozu_command_lib::proto::command::{
    request::RequestType, FrontendFilters, ListListeners, QueryCertificatesFilters,
    QueryClustersHashes, Request, Response, ResponseStatus,
};

/// One connection to sozu's command socket, as a client of the bench.
pub struct Probe {
    channel: Channel<Request, Response>,
}

/// What one request cost: the time to its final answer and that answer's size on the wire
/// (sozu's 8-byte length prefix included), or why it failed.
pub struct Cost {
    pub took: Duration,
    pub bytes: usize,
    pub response: Option<Response>,
    pub error: Option<String>,
}

impl Probe {
    pub fn connect(socket: &Path) -> Result<Probe, String> {
        let mut channel =
            Channel::<Request, Response>::from_path(&socket.to_string_lossy(), 4096, 1 << 30)
                .map_err(|e| format!("connect to {}: {e}", socket.display()))?;
        channel.blocking().map_err(|e| e.to_string())?;
        Ok(Probe { channel })
    }

    pub fn ask(&mut self, request: RequestType) -> Cost {
        use prost::Message;
        let started = Instant::now();
        if let Err(e) = self.channel.write_message(&Request::from(request)) {
            return Cost {
                took: started.elapsed(),
                bytes: 0,
                response: None,
                error: Some(e.to_string()),
            };
        }
        loop {
            match self
                .channel
                .read_message_blocking_timeout(Some(Duration::from_secs(60)))
            {
                Ok(response) => match response.status() {
                    ResponseStatus::Processing => continue,
                    ResponseStatus::Ok => {
                        return Cost {
                            took: started.elapsed(),
                            bytes: response.encoded_len() + 8,
                            response: Some(response),
                            error: None,
                        }
                    }
                    ResponseStatus::Failure => {
                        return Cost {
                            took: started.elapsed(),
                            bytes: response.encoded_len() + 8,
                            error: Some(response.message.clone()),
                            response: Some(response),
                        }
                    }
                },
                Err(e) => {
                    return Cost {
                        took: started.elapsed(),
                        bytes: 0,
                        response: None,
                        error: Some(e.to_string()),
                    }
                }
            }
        }
    }
}

pub fn frontends(
    domain: Option<&str>,
    cluster: Option<&str>,
    http: bool,
    https: bool,
    tcp: bool,
) -> RequestType {
    RequestType::ListFrontends(FrontendFilters {
        http,
        https,
        tcp,
        domain: domain.map(str::to_owned),
        cluster_id: cluster.map(str::to_owned),
    })
}

pub fn certificates(domain: Option<&str>, fingerprint: Option<&str>) -> RequestType {
    RequestType::QueryCertificatesFromTheState(QueryCertificatesFilters {
        domain: domain.map(str::to_owned),
        fingerprint: fingerprint.map(str::to_owned),
    })
}

pub fn listeners() -> RequestType {
    RequestType::ListListeners(ListListeners {})
}

pub fn hashes() -> RequestType {
    RequestType::QueryClustersHashes(QueryClustersHashes {})
}
