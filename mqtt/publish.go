package mqtt

// This file publishes downlink messages and works out the UDP address
// handed to boards.

import (
	"context"
	"fmt"
	"net"
	"net/url"
)

// publish sends one QoS 0 message (what boards expect) and waits until
// paho has written it, or ctx ends.
func (g *Gateway) publish(ctx context.Context, topic string, msg []byte) error {
	// While paho reconnects it reports QoS 0 publishes as done without
	// sending them; refuse instead, so callers learn the truth.
	if !g.client.IsConnectionOpen() {
		return ErrBrokerUnavailable
	}
	tok := g.client.Publish(topic, 0, false, msg)
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return fmt.Errorf("mqtt publish: %w", err)
		}
		g.stats.out.Add(1)
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mqtt publish: %w", ctx.Err())
	}
}

// advertiseHost picks the UDP host handed to one board: the configured
// one; else the address the UDP socket is bound to, if it is a specific
// one; else the address the board reached the broker on (by construction
// one it can reach); else the gateway-wide default. Boards only resolve
// IPv4.
func (g *Gateway) advertiseHost(b Board) string {
	if g.cfg.UDP.Advertise != "" {
		h, _, _ := splitAdvertise(g.cfg.UDP.Advertise)
		return h
	}
	if ip := boundIPv4(g.udp.conn.LocalAddr()); ip != "" {
		return ip
	}
	if host, _, err := net.SplitHostPort(b.LocalAddr); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.To4() != nil && !ip.IsUnspecified() {
			return ip.To4().String()
		}
	}
	return g.defHost
}

// boundIPv4 is the socket's IPv4 address unless it is bound to all
// interfaces.
func boundIPv4(a net.Addr) string {
	ua, ok := a.(*net.UDPAddr)
	if !ok || ua.IP == nil || ua.IP.IsUnspecified() || ua.IP.To4() == nil {
		return ""
	}
	return ua.IP.To4().String()
}

// defaultAdvertiseHost is the UDP host for boards the gateway knows nothing
// about: the local IPv4 address that routes towards the broker (boards
// reach the broker, so they are likely to reach this host too).
func (g *Gateway) defaultAdvertiseHost() string {
	if g.cfg.UDP.Advertise != "" {
		h, _, _ := splitAdvertise(g.cfg.UDP.Advertise)
		return h
	}
	if ip := boundIPv4(g.udp.conn.LocalAddr()); ip != "" {
		return ip
	}
	if u, err := url.Parse(g.cfg.Broker); err == nil && u.Hostname() != "" {
		port := u.Port()
		if port == "" {
			port = "1883"
		}
		// Connecting a UDP socket sends nothing; it only asks the kernel
		// which local address it would use.
		if c, err := net.Dial("udp4", net.JoinHostPort(u.Hostname(), port)); err == nil {
			defer c.Close()
			if ua, ok := c.LocalAddr().(*net.UDPAddr); ok && ua.IP.To4() != nil {
				return ua.IP.To4().String()
			}
		}
	}
	return "127.0.0.1"
}

// udpAdvertisePort is the port handed to boards.
func (g *Gateway) udpAdvertisePort() int {
	if g.cfg.UDP.Advertise != "" {
		if _, p, _ := splitAdvertise(g.cfg.UDP.Advertise); p > 0 {
			return p
		}
	}
	return g.udp.port()
}

// redactURL drops credentials from a broker URL before it is logged.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}
