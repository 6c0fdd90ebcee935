package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// bridge is the bridge process under test.
type bridge struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has been waited for
	waitErr error
	logPath string
	device  string // host:port of the device listener
	control string // host:port of the control listener
	udpPort int    // the audio socket's port (mqtt), 0 otherwise
}

// freePort picks a free loopback port of the network ("tcp" or "udp").
// Another process could take it before the bridge binds it; on loopback
// in a test run that does not happen in practice.
func freePort(network string) (int, error) {
	if network == "udp" {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			return 0, err
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// buildBridge builds cmd/bridge into dir.
func buildBridge(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "bridge")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/devicebridge/devicebridge/cmd/bridge").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build cmd/bridge (run inside the module): %v: %s", err, out)
	}
	return bin, nil
}

// startBridge runs the bridge with the voice relay toward upstream, its
// listeners on free loopback ports, and waits for /healthz.
func startBridge(ctx context.Context, o options, bin, upstream, logDir string) (*bridge, error) {
	var ports [4]int
	for i, nw := range []string{"tcp", "tcp", "tcp", "udp"} {
		p, err := freePort(nw)
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	b := &bridge{
		exited:  make(chan struct{}),
		logPath: filepath.Join(logDir, "bridge-"+o.transport+".log"),
		device:  fmt.Sprintf("127.0.0.1:%d", ports[0]),
		control: fmt.Sprintf("127.0.0.1:%d", ports[1]),
	}
	args := []string{
		"--device-listen", b.device,
		"--control-listen", b.control,
		"--data-dir", "", // approvals and secrets in memory
		"--log-format", "json", "--log-level", "warn",
		"--voice-upstream", upstream,
	}
	if o.transport == "mqtt" {
		b.udpPort = ports[3]
		args = append(args,
			"--mqtt-listen", fmt.Sprintf("127.0.0.1:%d", ports[2]),
			"--mqtt-udp-listen", fmt.Sprintf("127.0.0.1:%d", ports[3]),
			"--ota-transport", "mqtt")
	} else {
		args = append(args, "--mqtt-listen", "")
	}
	args = append(args, o.bridgeArgs...)
	logf2, err := os.Create(b.logPath)
	if err != nil {
		return nil, err
	}
	b.cmd = exec.Command(bin, args...)
	b.cmd.Stdout, b.cmd.Stderr = logf2, logf2
	if err := b.cmd.Start(); err != nil {
		logf2.Close()
		return nil, err
	}
	go func() {
		b.waitErr = b.cmd.Wait()
		logf2.Close()
		close(b.exited)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + b.control + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return b, nil
			}
		}
		select {
		case <-b.exited:
			return nil, fmt.Errorf("bridge exited at start (%v): %s", b.waitErr, b.logTail())
		case <-ctx.Done():
			b.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.stop()
			return nil, errors.New("bridge not healthy within 30 s: " + b.logTail())
		}
	}
}

// stop asks the bridge to shut down (SIGTERM) and kills it after 20 s.
func (b *bridge) stop() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(20 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
}

// logTail is the end of the bridge's log, for error messages.
func (b *bridge) logTail() string {
	data, _ := os.ReadFile(b.logPath)
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(data)
}

// logLines counts the log's lines by level and message, for the report.
func (b *bridge) logLines() map[string]int {
	f, err := os.Open(b.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		lvl, msg := jsonField(line, "level"), jsonField(line, "msg")
		if lvl == "" {
			continue
		}
		out[lvl+": "+msg]++
	}
	return out
}

// jsonField pulls a top-level string field out of a zap JSON line without
// decoding the rest.
func jsonField(line, key string) string {
	_, rest, ok := strings.Cut(line, `"`+key+`":"`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// metrics scrapes the bridge's /metrics into name{labels} → value.
func (b *bridge) metrics() (map[string]float64, error) {
	resp, err := http.Get("http://" + b.control + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: HTTP %d", resp.StatusCode)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format: every sample line as
// "name{labels}" (labels as written) → value.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// procStatus reads VmRSS and VmHWM (peak) of pid, in MiB.
func procStatus(pid int) (rss, hwm float64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		name, val, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 64)
		if name == "VmRSS" {
			rss = kb / 1024
		} else {
			hwm = kb / 1024
		}
	}
	return rss, hwm
}

// cpuSeconds is the user plus system CPU time pid has used.
func cpuSeconds(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces: state is field 3, utime 14, stime 15.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ is 100 on Linux
}

// machineBusySeconds is the CPU time every core of the machine has spent
// busy (not idle, not waiting for I/O), from /proc/stat.
func machineBusySeconds() float64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / 100
}

// udpDrops reads the kernel's drop counters (/proc/net/udp): of the UDP
// socket bound to 127.0.0.1:port (the bridge's audio socket), and summed
// over this process's own UDP sockets (the boards'). They count datagrams
// lost because a receive buffer was full, before any program saw them.
func udpDrops(port int) (bridge, boards int64) {
	data, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		return -1, -1
	}
	mine := selfSocketInodes()
	want := fmt.Sprintf("0100007F:%04X", port)
	for _, line := range strings.Split(string(data), "\n")[1:] {
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
		f := strings.Fields(line)
		if len(f) < 13 {
			continue
		}
		d, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
		switch {
		case f[1] == want:
			bridge += d
		case mine[f[9]]:
			boards += d
		}
	}
	return bridge, boards
}

// selfSocketInodes is the set of socket inodes this process holds open.
func selfSocketInodes() map[string]bool {
	out := map[string]bool{}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return out
	}
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue
		}
		if in, ok := strings.CutPrefix(l, "socket:["); ok {
			out[strings.TrimSuffix(in, "]")] = true
		}
	}
	return out
}
