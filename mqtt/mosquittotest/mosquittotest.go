// Package mosquittotest runs a real Mosquitto broker for tests: its own
// process, on a free loopback port, with a configuration generated in the
// test's temporary directory. It can be killed and restarted on the same
// port to test reconnects.
//
// Tests skip when no mosquitto binary is installed, unless the environment
// sets DEVICEBRIDGE_REQUIRE_MOSQUITTO=1 (CI does), in which case they fail.
package mosquittotest

import (
	"fmt"
	"github.com/devicebridge/devicebridge/internal/syncbuf"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RequireEnv makes a missing mosquitto a test failure instead of a skip.
const RequireEnv = "DEVICEBRIDGE_REQUIRE_MOSQUITTO"

// ValgrindEnv runs every broker under valgrind --error-exitcode=1 (CI's
// memory step): the broker is stopped with SIGTERM at the end of the test,
// which fails when valgrind reported an error.
const ValgrindEnv = "DEVICEBRIDGE_MOSQUITTO_VALGRIND"

// startTimeout bounds how long a starting broker may take to accept
// connections (valgrind is much slower to start).
const startTimeout = 10 * time.Second

// Broker is one Mosquitto process (restartable on the same port).
type Broker struct {
	t    testing.TB
	bin  string
	conf string
	port int

	valgrind bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	logs *syncbuf.Buffer // the process's output, read while it is written
	done chan struct{}
	err  error // the process's exit, once done
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
	b := &Broker{t: t, bin: bin, conf: conf, port: port, valgrind: os.Getenv(ValgrindEnv) == "1"}
	b.Restart()
	if b.valgrind {
		t.Cleanup(b.stopChecked)
	} else {
		t.Cleanup(b.Kill)
	}
	return b
}

// Logs is what the broker wrote so far (its log goes to stderr).
func (b *Broker) Logs() string {
	b.mu.Lock()
	l := b.logs
	b.mu.Unlock()
	if l == nil {
		return ""
	}
	return l.String()
}

// stopChecked ends the broker with SIGTERM, so that valgrind reports, and
// fails the test when it exited with an error.
func (b *Broker) stopChecked() {
	b.mu.Lock()
	cmd, done := b.cmd, b.done
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
	}
	b.mu.Lock()
	err := b.err
	b.mu.Unlock()
	if err != nil {
		b.t.Errorf("mosquitto (under valgrind) exited with %v:\n%s", err, b.Logs())
	}
}

// Plugin returns deploy/mosquitto/devicebridge.so, built with make first
// (make does nothing when it is up to date). Without the build tools or
// Mosquitto's headers the test is skipped, or fails under
// DEVICEBRIDGE_REQUIRE_MOSQUITTO=1.
func Plugin(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the source tree")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "mosquitto")
	out, err := exec.Command("make", "-s", "-C", dir).CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("building the Mosquitto plugin failed (apt-get install -y build-essential mosquitto-dev libmosquitto-dev libssl-dev): %v\n%s", err, out)
		if os.Getenv(RequireEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return filepath.Join(dir, "devicebridge.so")
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
	logs := &syncbuf.Buffer{}
	cmd := exec.Command(b.bin, "-c", b.conf)
	timeout := startTimeout
	if b.valgrind {
		cmd = exec.Command("valgrind", "--error-exitcode=1", "--leak-check=full", "--errors-for-leak-kinds=definite",
			"--quiet", b.bin, "-c", b.conf)
		timeout = 2 * time.Minute
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		b.t.Fatalf("starting mosquitto: %v", err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		b.mu.Lock()
		b.err = err
		b.mu.Unlock()
		close(done)
	}()
	b.mu.Lock()
	b.cmd, b.logs, b.done = cmd, logs, done
	b.mu.Unlock()

	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return
		}
		select {
		case <-done:
			b.t.Fatalf("mosquitto exited at start: %s", b.Logs())
		default:
		}
		if time.Now().After(deadline) {
			b.Kill()
			b.t.Fatalf("mosquitto did not accept connections within %v: %v\n%s", timeout, err, b.Logs())
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
