package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"

	"tern/agent/agentapi"
	"tern/dataplane"
)

// planeTable turns the control plane's mappings into the data plane's:
// a host's underlay is its registered one (HostUnderlay), else the IP of
// its agent address; this host's is the agent's own. A mapping the data
// plane cannot place (not IPv4, no underlay for its host) is left out,
// and named in the error, so one such mapping does not hold back every
// other update; packets to its VM drop as having no mapping.
func planeTable(ms []agentapi.Mapping, selfID string, self netip.Addr) ([]dataplane.Mapping, error) {
	out := make([]dataplane.Mapping, 0, len(ms))
	var errs []error
	for _, m := range ms {
		ip, err := netip.ParseAddr(m.IP)
		if err != nil || !ip.Is4() {
			errs = append(errs, fmt.Errorf("mapping for %s: ip %q is not IPv4", m.InstanceID, m.IP))
			continue
		}
		underlay := self
		if m.HostID != selfID {
			if underlay, err = hostUnderlay(m); err != nil {
				errs = append(errs, fmt.Errorf("mapping for %s: %w", m.InstanceID, err))
				continue
			}
		}
		out = append(out, dataplane.Mapping{VNI: m.VNI, IP: ip, InstanceID: m.InstanceID, Underlay: underlay})
	}
	return out, errors.Join(errs...)
}

func hostUnderlay(m agentapi.Mapping) (netip.Addr, error) {
	if m.HostUnderlay != "" {
		a, err := netip.ParseAddr(m.HostUnderlay)
		if err != nil || !a.Is4() {
			return netip.Addr{}, fmt.Errorf("host %s: underlay %q is not IPv4", m.HostID, m.HostUnderlay)
		}
		return a, nil
	}
	u, err := url.Parse(m.HostAddress)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("host %s: address %q: %w", m.HostID, m.HostAddress, err)
	}
	host := u.Hostname()
	if host == "" {
		host, _, _ = net.SplitHostPort(m.HostAddress)
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Is4() {
		return netip.Addr{}, fmt.Errorf("host %s: no underlay, and address %q has no IPv4", m.HostID, m.HostAddress)
	}
	return a, nil
}
