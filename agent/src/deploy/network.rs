//! What reaches the pods and what they reach: the LoadBalancer Service and the NetworkPolicy.

use super::*;

pub(super) fn load_balancer(workspace: &Workspace) -> Value {
    let mut metadata = metadata(workspace, APP);
    let mut spec = json!({
        "type": "LoadBalancer",
        // Straight to a pod on the node that received the connection, without a second hop that
        // would replace the client's address: sozu logs, and the NetworkPolicy matches, the real
        // client. The load balancer's health check skips nodes that run no pod.
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
    if let Some(ip) = workspace.lb_ip {
        // Cilium's LB IPAM assigns exactly this address; the Service's IP family must match it.
        metadata["annotations"] = json!({ "lbipam.cilium.io/ips": ip.to_string() });
        spec["ipFamilyPolicy"] = json!("SingleStack");
        spec["ipFamilies"] = json!([if ip.is_ipv4() { "IPv4" } else { "IPv6" }]);
    }
    if let Some(sources) = &workspace.allowed_sources {
        // Filtered by the load balancer itself, before the traffic reaches a node.
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
    // where Cilium and Calico apply the policy.
    let upstream_ports: BTreeSet<u16> = workspace
        .routes
        .iter()
        .flat_map(|route| &route.upstreams)
        .filter_map(|u| match &u.upstream {
            Upstream::Dns { port, .. } => Some(*port),
            Upstream::Ip { address } => Some(address.port()),
            Upstream::Unix { .. } => None,
        })
        // A health check on another port than the backend's is sozu dialling that port.
        .chain(
            workspace
                .routes
                .iter()
                .filter_map(|route| route.health.as_ref()?.port),
        )
        .chain(workspace.deploy.extra_egress_ports.iter().copied())
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
    // A rule without ports would allow every port.
    if !upstream_ports.is_empty() {
        let ports: Vec<Value> = upstream_ports
            .iter()
            .map(|port| json!({ "port": port, "protocol": "TCP" }))
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
/// The port of the ACME directory URL (`https://host[:port]/…`): 443 unless it names another.
pub(super) fn acme_directory_port(directory: &str) -> u16 {
    directory
        .strip_prefix("https://")
        .and_then(|rest| rest.split('/').next())
        .and_then(|authority| authority.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(443)
}
