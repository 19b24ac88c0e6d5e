package deploy

import (
	"net/url"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// defaultPorts are the ports relayd's URL schemes imply.
var defaultPorts = map[string]int32{"postgres": 5432, "postgresql": 5432, "amqp": 5672, "amqps": 5671, "nats": 4222, "tls": 4222}

// urlPorts returns the ports of every URL in a setting (a comma-separated
// list for the brokers).
func urlPorts(setting string, p *problems, name string) []int32 {
	var ports []int32
	for raw := range strings.SplitSeq(setting, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || defaultPorts[u.Scheme] == 0 {
			p.add("%s=%q: not a URL with a port the test knows", name, setting)
			continue
		}
		port := defaultPorts[u.Scheme]
		if s := u.Port(); s != "" {
			n, _ := strconv.Atoi(s)
			port = int32(n)
		}
		ports = append(ports, port)
	}
	return ports
}

// One NetworkPolicy covers the relay's pods and any Job's: it lets in
// Prometheus alone, on the metrics port, and lets out DNS and the ports of
// the URLs relayd is given.
func checkNetworkPolicy(f *facts, b *bundle, p *problems) {
	d, c := b.relay(p)
	if c == nil {
		return
	}
	if len(b.netpols) != 1 {
		p.add("%d NetworkPolicies, want 1", len(b.netpols))
		return
	}
	np := b.netpols[0]
	for _, pd := range b.pods() {
		if !selects(np.Spec.PodSelector.MatchLabels, pd.labels) {
			p.add("NetworkPolicy %s does not select %s's pods", np.Name, pd.owner)
		}
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		p.add("NetworkPolicy %s: policyTypes %v, want Ingress and Egress", np.Name, np.Spec.PolicyTypes)
	}
	metricsPort := containerPort(c, intstr.FromString("metrics"))
	for _, in := range np.Spec.Ingress {
		if len(in.From) == 0 {
			p.add("NetworkPolicy %s lets in any source", np.Name)
		}
		if len(in.Ports) == 0 {
			p.add("NetworkPolicy %s lets in every port", np.Name)
		}
		for _, port := range in.Ports {
			if port.Port == nil || containerPort(c, *port.Port) != metricsPort {
				p.add("NetworkPolicy %s lets in port %v, not only the metrics port %d", np.Name, port.Port, metricsPort)
			}
		}
	}
	// allowed reports whether a rule lets out port to any address.
	allowed := func(port int32, proto corev1.Protocol) bool {
		for _, out := range np.Spec.Egress {
			if len(out.To) > 0 {
				continue
			}
			if len(out.Ports) == 0 {
				return true
			}
			for _, pp := range out.Ports {
				if pp.Port != nil && pp.Port.IntVal == port && (pp.Protocol == nil || *pp.Protocol == proto) {
					return true
				}
			}
		}
		return false
	}
	// Its own pods' metrics port, both ways: cutover check --instances.
	own := func(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) bool {
		return len(peers) == 1 && peers[0].PodSelector != nil && peers[0].NamespaceSelector == nil &&
			selects(peers[0].PodSelector.MatchLabels, d.Spec.Template.Labels) &&
			len(ports) == 1 && ports[0].Port != nil && containerPort(c, *ports[0].Port) == metricsPort
	}
	if !slices.ContainsFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool { return own(r.From, r.Ports) }) {
		p.add("NetworkPolicy %s does not let in its own pods on the metrics port", np.Name)
	}
	if !slices.ContainsFunc(np.Spec.Egress, func(r networkingv1.NetworkPolicyEgressRule) bool { return own(r.To, r.Ports) }) {
		p.add("NetworkPolicy %s does not let out to its own pods' metrics port", np.Name)
	}
	if !allowed(53, corev1.ProtocolUDP) {
		p.add("NetworkPolicy %s lets out no DNS", np.Name)
	}
	env := b.env(c, f.defaults)
	for _, k := range urlVars {
		if env[k] == "" {
			continue
		}
		for _, port := range urlPorts(env[k], p, k) {
			if !allowed(port, corev1.ProtocolTCP) {
				p.add("NetworkPolicy %s does not let out port %d of %s", np.Name, port, k)
			}
		}
	}
}

// Every pod runs as the build's own ServiceAccount, with no token mounted:
// relayd calls no Kubernetes API.
func checkServiceAccount(_ *facts, b *bundle, p *problems) {
	for _, pd := range b.pods() {
		name := pd.spec.ServiceAccountName
		i := slices.IndexFunc(b.accounts, func(sa *corev1.ServiceAccount) bool { return sa.Name == name })
		if i < 0 {
			p.add("%s runs as ServiceAccount %q, not one of the build's", pd.owner, name)
			continue
		}
		if sa := b.accounts[i]; sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			p.add("ServiceAccount %s mounts its token", sa.Name)
		}
		if pd.spec.AutomountServiceAccountToken == nil || *pd.spec.AutomountServiceAccountToken {
			p.add("%s mounts a service account token", pd.owner)
		}
	}
}
