//! What reaches the pods and what they reach: the Service in front of them (a LoadBalancer, or
//! a NodePort behind the user's own load balancer) and the NetworkPolicy.
//!
//! Each provider is asked for `lb_ip` in its own documented way (docs/deploy.md cites each):
//! Cilium's LB-IPAM and MetalLB and kube-vip by annotation; with a `loadBalancerClass` of the
//! workspace's choosing, by the annotations the workspace gives. `spec.loadBalancerIP` is never
//! set: Kubernetes deprecated it, and MetalLB refuses a Service that has both.

use super::*;

/// The annotation that asks `provider` for an address, for those that take one.
pub(super) fn lb_ip_annotation(provider: LbProvider) -> Option<&'static str> {
    match provider {
        // Cilium 1.16 and later; 1.15 and earlier read `io.cilium/lb-ipam-ips`.
        LbProvider::Cilium => Some("lbipam.cilium.io/ips"),
        // MetalLB 0.14.9 and later; earlier, `metallb.universe.tf/loadBalancerIPs`.
        LbProvider::Metallb => Some("metallb.io/loadBalancerIPs"),
        LbProvider::KubeVip => Some("kube-vip.io/loadbalancerIPs"),
        LbProvider::Class | LbProvider::NodePort => None,
    }
}

/// The provider as its own documentation names it.
pub(super) fn provider_name(provider: LbProvider) -> &'static str {
    match provider {
        LbProvider::Cilium => "Cilium LB-IPAM",
        LbProvider::Metallb => "MetalLB",
        LbProvider::KubeVip => "kube-vip",
        LbProvider::Class => "the loadBalancerClass's controller",
        LbProvider::NodePort => "a NodePort",
    }
}

/// `'sozu_managed`: the StatefulSet's governing Service. Headless, so it carries no traffic (the
/// LoadBalancer does): it gives each replica a stable DNS name, at which an operator reaches
/// that replica's `/v1/state`, unready ones included, since each orders and fails on its own.
pub(super) fn replicas_service(workspace: &Workspace) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(workspace, REPLICAS_SERVICE),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": true,
            "selector": selector(),
            "ports": [{ "name": "admin", "port": ADMIN_PORT, "protocol": "TCP", "targetPort": "admin" }],
        },
    })
}

pub(super) fn load_balancer(workspace: &Workspace) -> Value {
    let lb = &workspace.deploy.load_balancer;
    let mut metadata = metadata(workspace, APP);
    let node_port = lb.provider == LbProvider::NodePort;
    let mut spec = json!({
        "type": if node_port { "NodePort" } else { "LoadBalancer" },
        // Straight to a pod on the node that received the connection, without a second hop that
        // would replace the client's address: sozu logs, and the NetworkPolicy matches, the real
        // client. The load balancer's health check skips nodes that run no pod (with a NodePort,
        // the user's load balancer must check each node's port itself).
        "externalTrafficPolicy": "Local",
        "selector": selector(),
        "ports": [
            {
                "name": "http",
                "port": 80,
                "protocol": "TCP",
                "targetPort": workspace.listeners.http.port(),
            },
            {
                "name": "https",
                "port": 443,
                "protocol": "TCP",
                "targetPort": workspace.listeners.https.port(),
            },
        ],
    });
    if let Some(ports) = lb.node_ports {
        spec["ports"][0]["nodePort"] = json!(ports.http);
        spec["ports"][1]["nodePort"] = json!(ports.https);
    }
    // Each route of its own port at its own number (a NodePort Service gets one assigned).
    if let Some(list) = spec["ports"].as_array_mut() {
        for port in route_ports(workspace) {
            list.push(json!({
                "name": port.name(),
                "port": port.port,
                "protocol": port.protocol,
                "targetPort": port.port,
            }));
        }
    }
    let mut annotations = serde_json::Map::new();
    for (key, value) in &lb.annotations {
        annotations.insert(key.clone(), json!(value));
    }
    if let Some(ip) = workspace.lb_ip {
        if let Some(annotation) = lb_ip_annotation(lb.provider) {
            // The provider assigns exactly this address.
            annotations.insert(annotation.to_owned(), json!(ip.to_string()));
        }
        // The Service's IP family must match the address.
        spec["ipFamilyPolicy"] = json!("SingleStack");
        spec["ipFamilies"] = json!([if ip.is_ipv4() { "IPv4" } else { "IPv6" }]);
    }
    if let Some(class) = &lb.class {
        spec["loadBalancerClass"] = json!(class);
    }
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    if let (Some(sources), false) = (&workspace.allowed_sources, node_port) {
        // Filtered by the load balancer, where it enforces the ranges (Cilium does; MetalLB
        // leaves it to kube-proxy): the NetworkPolicy below holds either way.
        spec["loadBalancerSourceRanges"] = json!(sources_text(sources));
    }
    json!({ "apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec })
}
pub(super) fn sources_text(sources: &[ipnet::IpNet]) -> Vec<String> {
    sources.iter().map(ToString::to_string).collect()
}
/// What may reach the pods and what they may reach: the listeners from `allowed_sources` (from
/// anywhere without it), the admin port from the monitoring pods only (`/v1/state` and
/// `/metrics` name every host), and out only to DNS and the routes' upstream ports. Applied
/// before the Deployment, so no pod ever runs unisolated.
pub(super) fn network_policy(workspace: &Workspace) -> Value {
    let port = |name: &str| json!({ "port": name, "protocol": "TCP" });
    let mut listeners = json!({ "ports": [port("http"), port("https")] });
    if let Some(list) = listeners["ports"].as_array_mut() {
        for route_port in route_ports(workspace) {
            list.push(json!({ "port": route_port.port, "protocol": route_port.protocol }));
        }
    }
    if let Some(sources) = &workspace.allowed_sources {
        listeners["from"] = sources_text(sources)
            .into_iter()
            .map(|cidr| json!({ "ipBlock": { "cidr": cidr } }))
            .collect();
    }
    let monitoring = &workspace.deploy.monitoring;
    let mut scraper = json!({
        "namespaceSelector": {
            "matchLabels": { "kubernetes.io/metadata.name": monitoring.namespace },
        },
    });
    if !monitoring.pod_labels.is_empty() {
        scraper["podSelector"] = json!({ "matchLabels": monitoring.pod_labels });
    }
    let admin = json!({ "from": [scraper], "ports": [port("admin")] });
    // The agent resolves upstream names, through the cluster's DNS pods alone; sozu connects to
    // the backends.
    let dns_ports = |port: u16| {
        json!([
            { "port": port, "protocol": "UDP" },
            { "port": port, "protocol": "TCP" },
        ])
    };
    let cluster_dns = &workspace.deploy.cluster_dns;
    let mut dns_pods = json!({
        "namespaceSelector": {
            "matchLabels": { "kubernetes.io/metadata.name": cluster_dns.namespace },
        },
    });
    if !cluster_dns.pod_labels.is_empty() {
        dns_pods["podSelector"] = json!({ "matchLabels": cluster_dns.pod_labels });
    }
    let mut egress = vec![json!({ "to": [dns_pods], "ports": dns_ports(53) })];
    // Plus the ports named in the workspace: a Service that maps its port to another target
    // port is reached on the target port once the network plugin has translated it, which is
    // where Cilium and Calico apply the policy. Each with the protocols sozu speaks to it: a
    // 'udp route's datagrams go to its upstreams over UDP (and its health check, a TCP
    // connection, to the same port unless the check names another), everything else over TCP.
    let upstream_ports: BTreeSet<(u16, &str)> = workspace
        .routes
        .iter()
        .flat_map(|route| {
            let protocols: &[&str] = match route.kind {
                RouteKind::Udp(_) if route.health.as_ref().is_some_and(|h| h.port.is_none()) => {
                    &["UDP", "TCP"]
                }
                RouteKind::Udp(_) => &["UDP"],
                RouteKind::Http(_) | RouteKind::Tcp(_) | RouteKind::TlsPassthrough(_) => &["TCP"],
            };
            route
                .upstreams
                .iter()
                .filter_map(|u| match &u.upstream {
                    Upstream::Dns { port, .. } => Some(*port),
                    Upstream::Ip { address } => Some(address.port()),
                    Upstream::Unix { .. } => None,
                })
                .flat_map(move |port| protocols.iter().map(move |&p| (port, p)))
        })
        // A health check on another port than the backend's is sozu dialling that port.
        .chain(
            workspace
                .routes
                .iter()
                .filter_map(|route| Some((route.health.as_ref()?.port?, "TCP"))),
        )
        // A port the workspace names without a protocol: either (NodeLocal DNSCache's 53 is
        // asked over UDP first, a 'udp route's upstream Service may map its port).
        .chain(
            workspace
                .deploy
                .extra_egress_ports
                .iter()
                .flat_map(|&port| [(port, "TCP"), (port, "UDP")]),
        )
        .collect();
    // 'sozu_managed: the agent talks to the ACME directory and to Cloudflare's API over HTTPS
    // (names whose addresses change, so any address), updates the DNS server `dns01.server`
    // and asks `propagation.nameservers`, by address; without the latter, the zone's
    // authoritative servers are found at run time, anywhere: port 53 to any address then.
    if let Some(acme) = &workspace.acme {
        let directory_port = acme_directory_port(&acme.directory);
        let https: BTreeSet<u16> = BTreeSet::from([443, directory_port]);
        egress.push(json!({
            "ports": https
                .iter()
                .map(|port| json!({ "port": port, "protocol": "TCP" }))
                .collect::<Vec<_>>(),
        }));
        let mut servers: Vec<SocketAddr> = Vec::new();
        if let Dns01::Rfc2136 { server, .. } = &acme.dns01 {
            servers.push(*server);
        }
        servers.extend(acme.propagation.nameservers.iter().flatten().copied());
        for server in &servers {
            let cidr = match server.ip() {
                IpAddr::V4(ip) => format!("{ip}/32"),
                IpAddr::V6(ip) => format!("{ip}/128"),
            };
            egress.push(json!({
                "to": [{ "ipBlock": { "cidr": cidr } }],
                "ports": dns_ports(server.port()),
            }));
        }
        if acme.propagation.nameservers.is_none() {
            egress.push(json!({ "ports": dns_ports(53) }));
        }
    }
    // The `traefik` record's endpoint, polled by the agent (a name whose addresses may change,
    // so any address). Routes its answers add later need their upstream ports in
    // `deploy.extra_egress_ports` (docs/deploy.md).
    if let Some(url) = workspace
        .traefik
        .as_ref()
        .and_then(|t| t.endpoint.as_deref())
    {
        egress.push(json!({
            "ports": [{ "port": endpoint_port(url), "protocol": "TCP" }],
        }));
    }
    // A rule without ports would allow every port.
    if !upstream_ports.is_empty() {
        let ports: Vec<Value> = upstream_ports
            .iter()
            .map(|(port, protocol)| json!({ "port": port, "protocol": protocol }))
            .collect();
        egress.push(json!({ "ports": ports }));
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(workspace, APP),
        "spec": {
            "podSelector": { "matchLabels": selector() },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [listeners, admin],
            "egress": egress,
        },
    })
}
/// The port of an `http://` or `https://` URL: 80 or 443 unless it names another.
pub(super) fn endpoint_port(url: &str) -> u16 {
    let (rest, default) = match url.strip_prefix("https://") {
        Some(rest) => (rest, 443),
        None => (url.strip_prefix("http://").unwrap_or(url), 80),
    };
    rest.split('/')
        .next()
        .and_then(|authority| authority.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(default)
}

/// The port of the ACME directory URL (`https://host[:port]/…`): 443 unless it names another.
pub(super) fn acme_directory_port(directory: &str) -> u16 {
    directory
        .strip_prefix("https://")
        .and_then(|rest| rest.split('/').next())
        .and_then(|authority| authority.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(443)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoints_port_is_the_one_it_names_or_its_schemes() {
        for (url, port) in [
            (
                "http://atlas.internal:8080/v1/integrations/traefik/config",
                8080,
            ),
            ("http://atlas.internal/v1/config", 80),
            ("https://atlas.internal/v1/config", 443),
            ("https://[fd00::7]:8443/config", 8443),
        ] {
            assert_eq!(endpoint_port(url), port, "{url}");
        }
    }
}
