package app

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReachableHosts: a listener on every interface is shown at the
// machine's LAN addresses, never at loopback; one bound to an address at
// that address.
func TestReachableHosts(t *testing.T) {
	tcp := func(s string) net.Addr { a, err := net.ResolveTCPAddr("tcp", s); require.NoError(t, err); return a }
	ips := func(ss ...string) func() []net.IP {
		return func() []net.IP {
			var out []net.IP
			for _, s := range ss {
				out = append(out, net.ParseIP(s))
			}
			return out
		}
	}
	host := func() (string, error) { return "bench", nil }
	noHost := func() (string, error) { return "", errors.New("no name") }
	lan := ips("127.0.0.1", "fe80::1", "192.168.1.20", "::1", "2001:db8::5", "10.0.0.7")

	assert.Equal(t, []string{"192.168.1.20", "10.0.0.7"}, reachableHosts(tcp("0.0.0.0:8000"), lan, host))
	assert.Equal(t, []string{"192.168.1.20", "10.0.0.7"}, reachableHosts(tcp("[::]:8000"), lan, host))
	assert.Equal(t, []string{"2001:db8::5"}, reachableHosts(tcp("[::]:8000"), ips("2001:db8::5", "fe80::1"), host),
		"an IPv6-only machine bound to [::]")
	assert.Equal(t, []string{"bench"}, reachableHosts(tcp("0.0.0.0:8000"), ips("2001:db8::5"), host),
		"an IPv4 bind on a machine without IPv4: its name")
	assert.Equal(t, []string{"127.0.0.1"}, reachableHosts(tcp("0.0.0.0:8000"), ips(), noHost), "nothing else to show")
	assert.Equal(t, []string{"127.0.0.1"}, reachableHosts(tcp("127.0.0.1:8080"), lan, host), "loopback stays loopback")
	assert.Equal(t, []string{"10.0.0.7"}, reachableHosts(tcp("10.0.0.7:8000"), lan, host))
}

// TestStartupLogNamesReachableAddresses: the "bridge listening" line of a
// device listener on every interface gives the machine's LAN address, and
// a loopback control listener stays loopback.
func TestStartupLogNamesReachableAddresses(t *testing.T) {
	leakCheck(t)
	a, logs := loggedApp(t, func(c *Config) { c.DeviceListen = "0.0.0.0:0" })
	lines := logs.FilterMessage("bridge listening").All()
	require.Len(t, lines, 1)
	fields := lines[0].ContextMap()
	_, port, err := net.SplitHostPort(a.DeviceAddr().String())
	require.NoError(t, err)
	want := net.JoinHostPort(publicHosts(a.DeviceAddr())[0], port)
	assert.Equal(t, "ws://"+want+"/xiaozhi/v1/", fields["devices"])
	assert.Equal(t, "http://"+want+"/xiaozhi/ota/", fields["ota"])
	if len(interfaceIPs()) > 0 {
		assert.NotContains(t, fields["devices"], "127.0.0.1", "a board cannot reach loopback")
	}
	assert.True(t, strings.HasPrefix(fields["control"].(string), "http://127.0.0.1:"), fields["control"])
}
