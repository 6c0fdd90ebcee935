package app

// This file picks the addresses the startup log shows: a listener on every
// interface (0.0.0.0, [::]) is shown at the machine's own LAN address, the
// one a board must be given, never at 127.0.0.1, which a board cannot
// reach.

import (
	"net"
	"os"
)

// reachableHosts are the hosts a client on another machine can use for a
// listener bound to addr: the bound IP when it is one; for a wildcard
// bind, the machine's non-loopback IPv4 addresses (global IPv6 ones when
// it has no IPv4 and the bind is [::]), else its host name, else
// 127.0.0.1. ips lists the machine's interface addresses.
func reachableHosts(addr net.Addr, ips func() []net.IP, hostname func() (string, error)) []string {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return []string{addr.String()}
	}
	bound := net.ParseIP(host)
	if bound == nil || !bound.IsUnspecified() {
		return []string{host}
	}
	var v4, v6 []string
	for _, ip := range ips() {
		switch {
		case ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast():
		case ip.To4() != nil:
			v4 = append(v4, ip.String())
		case ip.IsGlobalUnicast():
			v6 = append(v6, ip.String())
		}
	}
	if len(v4) > 0 {
		return v4
	}
	if len(v6) > 0 && bound.To4() == nil {
		return v6
	}
	if name, err := hostname(); err == nil && name != "" {
		return []string{name}
	}
	return []string{"127.0.0.1"}
}

// interfaceIPs lists the addresses of the machine's interfaces that are up
// and not loopback.
func interfaceIPs() []net.IP {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []net.IP
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				out = append(out, n.IP)
			}
		}
	}
	return out
}

// publicHosts is reachableHosts on this machine.
func publicHosts(addr net.Addr) []string { return reachableHosts(addr, interfaceIPs, os.Hostname) }

// hostPortFor joins host with addr's port.
func hostPortFor(host string, addr net.Addr) string {
	_, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return net.JoinHostPort(host, port)
}
