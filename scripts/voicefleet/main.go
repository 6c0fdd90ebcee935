// Command voicefleet measures the voice relay end to end, through the real
// transports: a bridge process (cmd/bridge, the only thing relaying)
// between simulated boards and the stand-in voice server, both in this
// process, all on loopback and one clock.
//
//	boards (simulator) ──WebSocket, or OTA then MQTT+UDP──► bridge ──WebSocket──► voicestub
//	      this process              (its own process)                       this process
//
// Every board holds one manual-mode conversation at the same time (spread
// over -spread): listen start, -frames uplink frames paced in real time,
// listen stop; the stub answers with -frames downlink frames paced in real
// time, each stamped with the time the stub wrote it (voicestub Stamp). It
// prints one JSON line: uplink frames the boards sent and the stub heard,
// downlink frames the stub sent and the boards received (and dropped from
// the firmware's 40-packet decode queue), and the relay latency of each
// played downlink frame, stub write to board arrival.
//
//	go run ./scripts/voicefleet -transport ws -boards 1000 -frames 50
//
// scripts/voice-fleet.sh runs it on both transports.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// options are the command line.
type options struct {
	transport  string
	boards     int
	frames     int
	frameBytes int
	pace       time.Duration
	spread     time.Duration
	proto      int
	parallel   int
	bridgeBin  string
	bridgeArgs []string
	timeout    time.Duration
	logDir     string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("voicefleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.transport, "transport", "ws", "how boards reach the bridge: ws (WebSocket) or mqtt (OTA, then the embedded broker and UDP)")
	fs.IntVar(&o.boards, "boards", 100, "boards, each holding one conversation, all at once")
	fs.IntVar(&o.frames, "frames", 50, "uplink frames per conversation, and downlink frames in each answer")
	fs.IntVar(&o.frameBytes, "frame-bytes", 120, "uplink Opus payload size (a 60 ms voice packet is about 100-200 bytes)")
	fs.DurationVar(&o.pace, "pace", 60*time.Millisecond, "frame interval, both directions (60ms: real time)")
	fs.DurationVar(&o.spread, "spread", time.Second, "conversations start evenly spread over this")
	fs.IntVar(&o.proto, "protocol-version", 1, "WebSocket boards' binary protocol version (1, 2 or 3)")
	fs.IntVar(&o.parallel, "connect-parallel", 64, "boards connecting at once (kept under websocket.max_pending_hellos and mqtt.max_pending_connects)")
	fs.StringVar(&o.bridgeBin, "bridge", "", "bridge binary (default: go build ./cmd/bridge into a temporary directory)")
	fs.Func("bridge-arg", "extra bridge flag (repeatable), e.g. --bridge-arg=--ota-burst=2000", func(v string) error {
		o.bridgeArgs = append(o.bridgeArgs, v)
		return nil
	})
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound on the whole run")
	fs.StringVar(&o.logDir, "log-dir", "", "keep the bridge's log here (default: a temporary directory, removed)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	case o.transport != "ws" && o.transport != "mqtt":
		return o, fmt.Errorf("-transport %q: want ws or mqtt", o.transport)
	case o.boards < 1 || o.boards > 1<<24:
		return o, errors.New("-boards: want 1 to 16777216")
	case o.frames < 1:
		return o, errors.New("-frames: want at least 1")
	case o.frameBytes < 0 || o.frameBytes > 1484:
		return o, errors.New("-frame-bytes: want 0 to 1484")
	case o.pace <= 0 || o.spread < 0:
		return o, errors.New("-pace must be positive, -spread not negative")
	case o.proto < 1 || o.proto > 3:
		return o, errors.New("-protocol-version: want 1, 2 or 3")
	case o.parallel < 1:
		return o, errors.New("-connect-parallel: want at least 1")
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "voicefleet:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	res, err := run(ctx, o, os.Stderr)
	if res != nil {
		line, _ := json.Marshal(res)
		fmt.Println(string(line))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "voicefleet:", err)
		os.Exit(1)
	}
}

// logf reports progress on stderr, so stdout stays one JSON line.
func logf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "voicefleet: %s "+strings.TrimSuffix(format, "\n")+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}
