//! Integration tests against the real, pinned sozu. One binary; each module is one concern.

/// `render --format sozu-toml` output accepted (and refused) by sozu's own `config check`.
mod render_sozu;

/// `private-ingress run` against a real sozu: what HTTPS clients see through it.
mod live;

/// How routes match: exact, segment and regex paths, methods, header matches, precedence.
mod matching;

/// Certificate rotation: every way a certificate can land on disk switches what clients see.
mod rotation;

/// Certificate pairs named by path (`certificates`): served for the hosts they cover, rotated,
/// refused while the last good pair serves.
mod certificate_files;

/// sozu's state read back whatever its command buffer: a sozu with its default buffer and a
/// state larger than one answer keeps taking rotations and resyncs.
mod reads;

/// Upstream names through the system's resolver configuration: answers that change, a resolver
/// that never answers.
mod dns;

/// Readiness per route: one route that cannot be served does not keep a new agent unready,
/// unless it is asked to be strict.
mod readiness;

/// Backends: health checks, drains, weights, HSTS and drift repaired from sozu's events.
mod backends;

/// The agent as a supervised process: a dying task, a wedged loop, SIGTERM whatever sozu does.
mod supervision;

/// What a workspace, a pair or an admin client can do to the agent, and cannot.
mod security;

/// Bad certificate pairs: refused with their reason while the last good pair keeps serving.
mod bad_input;

/// The rendered Kubernetes pod, run as a kubelet runs it: Ready, serving, rotating, draining.
mod pod;

/// A seeded, randomised soak: rotations, bad pairs, edits, kills and restarts.
mod soak;

/// Traffic from sozu's access-log stream: request metrics per route and JSON access logs.
mod traffic;

/// `tls_rotation = 'sozu_managed`: certificates ordered from pebble over DNS-01 (BIND, Cloudflare).
mod acme;

/// Alert rules and the Grafana dashboard against a real Prometheus scraping the agent.
mod alerts;

/// `'sozu_managed` with two replicas: the rendered StatefulSet's pods order, serve, and are
/// rolled one at a time under load.
mod replicas;

/// The listeners' policy: client certificates with revocation, the lowest TLS version.
mod listener;

/// Route policies: redirects, rewrites, headers, basic auth, limits, error pages.
mod policy;

/// Routes of their own port: SSH and Redis over TCP, TLS passed through by SNI, UDP.
mod ports;
/// The protocols behind the routes: WebSockets across what the agent does, idle streams, HTTP/2
/// per listener, gRPC to h2c servers.
mod protocols;
/// `top` on a pseudo-terminal against a real agent and sozu, and `/v1/events` on its own.
mod top;

/// The Gateway API conformance suite's HTTPRoute cases, imported with `import gateway` and
/// served through the agent and sozu to echo backends.
mod gateway_conformance;

/// Traefik's dynamic configuration through a real Traefik and through the agent and sozu (the
/// workspace `import traefik` writes): the same answers, and the differences the docs list.
mod traefik;

/// The workspace's `traefik` record served live: Orca's directory edited, added, broken,
/// drained and removed; Atlas's endpoint changing, stalling and answering garbage.
mod traefik_live;
