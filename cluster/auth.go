package cluster

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// Auth is how a node proves itself to NATS. The fleet bus carries routed
// calls, their arguments and the directory every node trusts, so a NATS
// that lets anyone in gives anyone every board: a node joins only with
// credentials (one of User/Password, Token, CredsFile or NKeySeedFile,
// and/or a client certificate) unless Config.Insecure says otherwise.
type Auth struct {
	// User and Password: NATS user/password authentication.
	User, Password string
	// Token: NATS token authentication.
	Token string
	// CredsFile: a NATS credentials file (user JWT and nkey seed).
	CredsFile string
	// NKeySeedFile: a file holding a user nkey seed (SU...).
	NKeySeedFile string
	// CAFile verifies the server's certificate (TLS); CertFile and KeyFile
	// present a client certificate, which the server may map to a user.
	CAFile, CertFile, KeyFile string
}

// HasCredentials reports whether a's connections present any credential.
func (a Auth) HasCredentials() bool {
	return a.User != "" || a.Token != "" || a.CredsFile != "" || a.NKeySeedFile != "" || a.CertFile != ""
}

// trust are the options that verify the server, without any credential:
// what the probe connects with.
func (a Auth) trust() []nats.Option {
	if a.CAFile == "" {
		return nil
	}
	return []nats.Option{nats.RootCAs(a.CAFile)}
}

// options are the nats.go options of a's credentials and trust.
func (a Auth) options() ([]nats.Option, error) {
	opts := a.trust()
	if a.User != "" {
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	}
	if a.Token != "" {
		opts = append(opts, nats.Token(a.Token))
	}
	if a.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	}
	if a.NKeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(a.NKeySeedFile)
		if err != nil {
			// The error names the file, never its content.
			return nil, fmt.Errorf("cluster: nkey seed file: %w", err)
		}
		opts = append(opts, o)
	}
	if a.CertFile != "" {
		opts = append(opts, nats.ClientCert(a.CertFile, a.KeyFile))
	}
	return opts, nil
}

// ErrNoCredentials: the node has no NATS credentials and was not told to
// join an open NATS anyway (Config.Insecure).
var ErrNoCredentials = errors.New("cluster: no NATS credentials: whoever reaches NATS could call every board of the fleet " +
	"and read every routed call; give the node credentials (user/password, token, creds file, nkey seed or client certificate) " +
	"on a NATS that requires them, or set insecure to join an open NATS anyway")

// ErrOpenNATS: NATS let a client in without credentials, so the fleet bus
// is anyone's, and the node was not told to join anyway (Config.Insecure).
var ErrOpenNATS = errors.New("cluster: NATS lets clients in without credentials, so whoever reaches it could call every board " +
	"of the fleet and read every routed call; require authentication on NATS (docs/scaling.md), or set insecure to join anyway")

// CheckURL refuses NATS URLs (comma-separated) that carry credentials:
// they would bypass Auth (and the probe, which reuses the URLs), and sit on
// command lines and in logs.
func CheckURL(urls string) error {
	for _, s := range strings.Split(urls, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("cluster: NATS URL %q: %w", s, err)
		}
		if u.User != nil {
			return errors.New("cluster: a NATS URL carries credentials (user:password@ or token@); give them as credentials instead")
		}
	}
	return nil
}

// probeTimeout bounds the probe's connection attempt.
const probeTimeout = 5 * time.Second

// letsAnyoneIn connects to url without credentials (trusting the server as
// the node does) and reports whether NATS let that connection in. Only a
// successful connection counts: a refusal for any reason means NATS did
// not let it in.
func letsAnyoneIn(url string, a Auth, log *zap.Logger) bool {
	opts := append([]nats.Option{nats.Name("devicebridge credentials probe"), nats.NoReconnect(),
		nats.Timeout(probeTimeout), nats.MaxReconnects(0)}, a.trust()...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		log.Debug("NATS refused a connection without credentials, as it should", zap.Error(err))
		return false
	}
	nc.Close()
	return true
}

// insecureWarning is said at start by a node that joins an open NATS.
const insecureWarning = "INSECURE: this node joined a NATS that lets clients in without credentials (insecure is set): " +
	"whoever reaches NATS can call every board of the fleet (reboot them, change their settings), read every routed call's " +
	"arguments and the whole directory, and add or remove boards from it; require credentials on NATS and bind it to " +
	"loopback or a private network (docs/scaling.md)"
