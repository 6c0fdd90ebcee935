// Package mosquittotest runs a real Mosquitto broker for tests: its own
// process, on a free loopback port, with a configuration generated in the
// test's temporary directory. It can be killed and restarted on the same
// port to test reconnects.
//
// Tests skip when no mosquitto binary is installed, unless the environment
// sets DEVICEBRIDGE_REQUIRE_MOSQUITTO=1 (CI does), in which case they fail.
package mosquittotest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// RequireEnv makes a missing mosquitto a test failure instead of a skip.
const RequireEnv = "DEVICEBRIDGE_REQUIRE_MOSQUITTO"

// startTimeout bounds how long a starting broker may take to accept
// connections.
const startTimeout = 10 * time.Second

// Broker is one Mosquitto process (restartable on the same port).
type Broker struct {
	t    testing.TB
	bin  string
	conf string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	logs *bytes.Buffer
	done chan struct{}
}

// Find returns the mosquitto binary, skipping (or failing, under
// DEVICEBRIDGE_REQUIRE_MOSQUITTO=1) the test when there is none. Debian
// installs it in /usr/sbin, which is often not on a user's PATH.
func Find(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/opt/homebrew/sbin/mosquitto"} {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("mosquitto is not installed, and %s=1 requires it (apt-get install -y mosquitto)", RequireEnv)
	}
	t.Skip("mosquitto is not installed; skipping (set " + RequireEnv + "=1 to make this a failure)")
	return ""
}

// Start runs a Mosquitto on a free loopback port with a generated config
// (anonymous access, no persistence, nothing else) plus any extra config
// lines. It is killed when the test ends.
func Start(t testing.TB, extra ...string) *Broker {
	t.Helper()
	bin := Find(t)
	port := freePort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "mosquitto.conf")
	body := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n", port)
	for _, l := range extra {
		body += l + "\n"
	}
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	b := &Broker{t: t, bin: bin, conf: conf, port: port}
	b.Restart()
	t.Cleanup(b.Kill)
	return b
}

// URL is the broker's tcp:// URL.
func (b *Broker) URL() string { return "tcp://" + b.Addr() }

// Addr is host:port.
func (b *Broker) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Kill stops the broker abruptly (SIGKILL): clients see their connections
// drop without a DISCONNECT. It is a no-op when the broker is not running.
func (b *Broker) Kill() {
	b.mu.Lock()
	cmd, done := b.cmd, b.done
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart starts the broker again on the same port and waits until it
// accepts connections.
func (b *Broker) Restart() {
	b.t.Helper()
	b.Kill()
	logs := &bytes.Buffer{}
	cmd := exec.Command(b.bin, "-c", b.conf)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		b.t.Fatalf("starting mosquitto: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b.mu.Lock()
	b.cmd, b.logs, b.done = cmd, logs, done
	b.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return
		}
		select {
		case <-done:
			b.t.Fatalf("mosquitto exited at start: %s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			b.Kill()
			b.t.Fatalf("mosquitto did not accept connections within %v: %v\n%s", startTimeout, err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort asks the kernel for a free loopback port. Another process could
// take it before mosquitto binds; in practice it does not happen.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
