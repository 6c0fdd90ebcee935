package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/natstest"
)

// tryStart starts a node as Start does, and stops it at cleanup when it
// started. logs records what the node logged.
func tryStart(t *testing.T, cfg Config) (*Node, *observer.ObservedLogs, error) {
	t.Helper()
	if cfg.NodeID == "" {
		cfg.NodeID = "n"
	}
	cfg.OfflineAfter = 1500 * time.Millisecond
	core, logs := observer.New(zapcore.DebugLevel)
	hub := device.NewHub(device.HubConfig{}, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, hub.Close(ctx))
	})
	n, err := Start(context.Background(), cfg, hub, zap.New(core))
	if err == nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			n.Stop(ctx)
		})
	}
	return n, logs, err
}

// insecureWarned reports whether the node said loudly that it joined an
// open NATS, naming the risk.
func insecureWarned(logs *observer.ObservedLogs) bool {
	for _, e := range logs.FilterLevelExact(zapcore.WarnLevel).All() {
		if e.Message == insecureWarning {
			return true
		}
	}
	return false
}

// TestOutsidersAreRefused (issue 24, defect 15): on the NATS the docs
// tell an operator to run (configs/nats-fleet.conf), a fleet works with
// its credentials, and a client without them, or with a wrong password,
// is not let in: it can neither publish a routed call nor read the
// directory. Before, the docs started a NATS that let anyone in.
func TestOutsidersAreRefused(t *testing.T) {
	url := startNATS(t)
	a, b := startNode(t, url, "a"), startNode(t, url, "b")
	b.attach(t, "bb:00:00:00:00:01", nil)
	require.Eventually(t, func() bool { return len(readyIDs(a.hub)) == 1 }, 10*time.Second, 20*time.Millisecond)
	_, err := a.hub.CallTool(context.Background(), "bb:00:00:00:00:01", "self.get_device_status", nil)
	require.NoError(t, err, "the fleet works with its credentials")

	_, err = nats.Connect(url, nats.NoReconnect())
	require.ErrorIs(t, err, nats.ErrAuthorization, "no credentials")
	_, err = nats.Connect(url, nats.NoReconnect(), nats.UserInfo(natstest.User, "guess"))
	require.ErrorIs(t, err, nats.ErrAuthorization, "a wrong password")
	_, err = nats.Connect(url, nats.NoReconnect(), nats.Token("guess"))
	require.ErrorIs(t, err, nats.ErrAuthorization, "a token")
}

// TestNodeWithoutCredentialsIsRefusedByNATS: a node told to join without
// credentials (insecure) is not let in by a NATS that requires them.
func TestNodeWithoutCredentialsIsRefusedByNATS(t *testing.T) {
	url := startNATS(t)
	_, _, err := tryStart(t, Config{URL: url, Insecure: true})
	require.ErrorIs(t, err, nats.ErrAuthorization)
	_, _, err = tryStart(t, Config{URL: url, Auth: Auth{User: natstest.User, Password: "guess"}})
	require.ErrorIs(t, err, nats.ErrAuthorization)
}

// TestNodeWithoutCredentialsRefusesToStart (issue 24, defect 15): a node
// configured without credentials refuses to join unless told insecure,
// and then says loudly what that risks.
func TestNodeWithoutCredentialsRefusesToStart(t *testing.T) {
	url := natstest.StartOpen(t).ClientURL()
	_, _, err := tryStart(t, Config{URL: url})
	require.ErrorIs(t, err, ErrNoCredentials)
	// Credentials in the URL would pass for none here, and reach the
	// probe; they are refused.
	_, _, err = tryStart(t, Config{URL: strings.Replace(url, "nats://", "nats://u:p@", 1), Auth: fleetAuth})
	require.ErrorContains(t, err, "a NATS URL carries credentials")

	n, logs, err := tryStart(t, Config{URL: url, Insecure: true})
	require.NoError(t, err)
	require.True(t, n.Connected())
	require.True(t, insecureWarned(logs), "the node warns that the fleet bus is open")
}

// TestNodeRefusesNATSThatLetsAnyoneIn (issue 24, defect 15): a node with
// credentials probes whether NATS would let it in without them, and
// refuses to join one that does (a NATS without authentication, which
// ignores the credentials, or one with a no_auth_user) unless insecure.
func TestNodeRefusesNATSThatLetsAnyoneIn(t *testing.T) {
	open := natstest.StartOpen(t).ClientURL()
	_, _, err := tryStart(t, Config{URL: open, Auth: fleetAuth})
	require.ErrorIs(t, err, ErrOpenNATS)
	n, logs, err := tryStart(t, Config{URL: open, Auth: fleetAuth, Insecure: true})
	require.NoError(t, err)
	require.True(t, n.Connected())
	require.True(t, insecureWarned(logs))

	noAuthUser := natstest.Run(t, &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true, Users: []*server.User{{Username: "u", Password: "p"}}, NoAuthUser: "u"})
	_, _, err = tryStart(t, Config{URL: noAuthUser.ClientURL(), Auth: Auth{User: "u", Password: "p"}})
	require.ErrorIs(t, err, ErrOpenNATS)

	// On a NATS that requires credentials the probe is refused, and the
	// node joins without a warning.
	n, logs, err = tryStart(t, Config{URL: startNATS(t), Auth: fleetAuth})
	require.NoError(t, err)
	require.True(t, n.Connected())
	require.False(t, insecureWarned(logs))
}

// TestNodeAuthMethods: a node joins with a token, an nkey seed file or a
// TLS client certificate, where NATS requires that credential, and a node
// without it is refused.
func TestNodeAuthMethods(t *testing.T) {
	base := func() *server.Options {
		return &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	}
	dir := t.TempDir()

	t.Run("token", func(t *testing.T) {
		opts := base()
		opts.Authorization = "fleet-token-0123456789"
		url := natstest.Run(t, opts).ClientURL()
		_, logs, err := tryStart(t, Config{URL: url, Auth: Auth{Token: "fleet-token-0123456789"}})
		require.NoError(t, err)
		require.False(t, insecureWarned(logs))
		_, _, err = tryStart(t, Config{URL: url, Auth: Auth{Token: "guess"}})
		require.ErrorIs(t, err, nats.ErrAuthorization)
	})

	t.Run("nkey", func(t *testing.T) {
		kp, err := nkeys.CreateUser()
		require.NoError(t, err)
		pub, err := kp.PublicKey()
		require.NoError(t, err)
		seed, err := kp.Seed()
		require.NoError(t, err)
		seedFile := filepath.Join(dir, "node.nk")
		require.NoError(t, os.WriteFile(seedFile, seed, 0o600))
		opts := base()
		opts.Nkeys = []*server.NkeyUser{{Nkey: pub}}
		url := natstest.Run(t, opts).ClientURL()
		_, logs, err := tryStart(t, Config{URL: url, Auth: Auth{NKeySeedFile: seedFile}})
		require.NoError(t, err)
		require.False(t, insecureWarned(logs))
		_, _, err = tryStart(t, Config{URL: url, Insecure: true})
		require.ErrorIs(t, err, nats.ErrAuthorization)
		_, _, err = tryStart(t, Config{URL: url, Auth: Auth{NKeySeedFile: filepath.Join(dir, "missing.nk")}})
		require.ErrorContains(t, err, "nkey seed file")
	})

	t.Run("client certificate", func(t *testing.T) {
		ca, cert, key := writeTLS(t, dir)
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert["server"], KeyFile: key["server"], CaFile: ca, Verify: true})
		require.NoError(t, err)
		opts := base()
		opts.TLSConfig, opts.TLSVerify, opts.TLSTimeout = tc, true, 5
		url := natstest.Run(t, opts).ClientURL()
		_, logs, err := tryStart(t, Config{URL: url, Auth: Auth{CAFile: ca, CertFile: cert["node"], KeyFile: key["node"]}})
		require.NoError(t, err)
		require.False(t, insecureWarned(logs), "the probe, without a certificate, was refused")
		_, _, err = tryStart(t, Config{URL: url, Insecure: true, Auth: Auth{CAFile: ca}})
		require.Error(t, err, "no client certificate")
	})
}

// writeTLS writes a CA and, signed by it, a server certificate for
// 127.0.0.1 and a client certificate for a node; it returns their files.
func writeTLS(t *testing.T, dir string) (ca string, cert, key map[string]string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleet test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600))
		return path
	}
	ca = write("ca.pem", "CERTIFICATE", caDER)
	cert, key = map[string]string{}, map[string]string{}
	for i, name := range []string{"server", "node"} {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		if name == "server" {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		require.NoError(t, err)
		kder, err := x509.MarshalECPrivateKey(k)
		require.NoError(t, err)
		cert[name] = write(name+".pem", "CERTIFICATE", der)
		key[name] = write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	return ca, cert, key
}
