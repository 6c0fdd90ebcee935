package simulator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/ctxtime"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
)

// Defaults for FleetConfig fields left at zero.
const (
	// DefaultMACPrefix is a locally administered prefix, so simulated MACs
	// cannot clash with real hardware.
	DefaultMACPrefix     = "02:00:00"
	DefaultReconnectMin  = time.Second
	DefaultReconnectMax  = 30 * time.Second
	reconnectJitterRatio = 0.2
	// DefaultSummaryInterval is FleetConfig.SummaryInterval's default.
	DefaultSummaryInterval = 10 * time.Second
)

// FleetConfig configures a group of boards that share one profile and one
// server.
type FleetConfig struct {
	// URL is the server's WebSocket URL, e.g. ws://127.0.0.1:8000/xiaozhi/v1/.
	URL string
	// Profile is required.
	Profile *Profile
	// Count is the number of boards (at least 1).
	Count int
	// MACPrefix holds the leading octets of every MAC (1 to 5 octets,
	// default "02:00:00"); the remaining octets are the board's 1-based
	// index, so board 1 is 02:00:00:00:00:01. Client ids derive from the
	// MAC, so a restarted fleet keeps its identities.
	MACPrefix string
	// Token is sent by every board.
	Token string
	// Reconnect makes a board reconnect after its connection ends or fails,
	// with exponential backoff between ReconnectMin and ReconnectMax.
	// Without it a board that loses its connection stays offline.
	Reconnect    bool
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	// SummaryInterval is how often the fleet writes one warning that
	// counts the reconnects of the interval that a busy or vanished server
	// explains (503s during a burst, the server stopping), instead of one
	// warning per board; each board's own line is at info. Zero or less
	// means 10s.
	SummaryInterval time.Duration
	// StartInterval spaces out the boards' first connection attempts so a
	// large fleet does not hit the server all at once.
	StartInterval time.Duration
	// Board is the template for each board's Config. MAC, ClientID,
	// Profile, Token and Logger are filled in per board.
	Board Config
	// Converse, when set, makes every board hold a conversation
	// (Board.Converse with these options) right after each connect, and
	// again every ConverseEvery while connected (0: once per connection).
	// Each ends in one info line: what the board heard, and the frames.
	Converse      *ConverseOptions
	ConverseEvery time.Duration
	// Logger receives fleet and board logs; nil means no logging.
	Logger *zap.Logger
}

// Fleet runs a group of boards against one server.
type Fleet struct {
	cfg    FleetConfig
	boards []*Board
	log    *zap.Logger

	// retries counts, by reason, reconnects since the last summary.
	retriesMu sync.Mutex
	retries   map[string]int
	// failures throttles the warning for connections that failed for a
	// reason worth a look (a refused token, no hello, a board crash): one
	// line at once, then one per interval with the count left out.
	failures logthrottle.Throttle
	// convFailures throttles the warning for failed conversations alike.
	convFailures logthrottle.Throttle
}

// FleetStats sums the boards' counters.
type FleetStats struct {
	Boards    int // boards in the fleet
	Connected int // boards connected now: hello exchanged (WebSocket) or CONNACK received (MQTT)
	Stats         // counters summed over all boards
}

// NewFleet validates cfg and creates the boards without connecting them.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	if cfg.Profile == nil {
		return nil, errors.New("simulator: fleet config has no profile")
	}
	if cfg.URL == "" {
		return nil, errors.New("simulator: fleet config has no url")
	}
	if cfg.Count < 1 {
		return nil, fmt.Errorf("simulator: fleet count %d: want at least 1", cfg.Count)
	}
	cfg.MACPrefix = strings.ToLower(cmp.Or(cfg.MACPrefix, DefaultMACPrefix))
	cfg.ReconnectMin = cmp.Or(cfg.ReconnectMin, DefaultReconnectMin)
	cfg.ReconnectMax = max(cmp.Or(cfg.ReconnectMax, DefaultReconnectMax), cfg.ReconnectMin)
	if cfg.SummaryInterval <= 0 {
		cfg.SummaryInterval = DefaultSummaryInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Converse != nil {
		o := *cfg.Converse
		if _, err := o.normalize(""); err != nil {
			return nil, err
		}
		cfg.Converse = &o
	}
	prefix, err := parseMACPrefix(cfg.MACPrefix)
	if err != nil {
		return nil, err
	}
	free := 6 - len(prefix)
	if limit := 1 << (8 * free); cfg.Count >= limit {
		return nil, fmt.Errorf("simulator: a %d-octet MAC prefix leaves room for %d boards, not %d", len(prefix), limit-1, cfg.Count)
	}

	f := &Fleet{cfg: cfg, log: cfg.Logger.Named("fleet"), retries: map[string]int{}}
	f.failures.SetInterval(cfg.SummaryInterval)
	f.convFailures.SetInterval(cfg.SummaryInterval)
	for i := 1; i <= cfg.Count; i++ {
		var mac [6]byte
		copy(mac[:], prefix)
		for j, idx := 5, i; j >= len(prefix); j, idx = j-1, idx>>8 {
			mac[j] = byte(idx)
		}
		bc := cfg.Board
		bc.MAC = formatMAC(mac)
		bc.ClientID = uuidFromMAC(bc.MAC)
		bc.Profile = cfg.Profile
		bc.Token = cfg.Token
		bc.Logger = cfg.Logger
		b, err := NewBoard(bc)
		if err != nil {
			return nil, err
		}
		f.boards = append(f.boards, b)
	}
	return f, nil
}

func parseMACPrefix(s string) ([]byte, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 1 || len(parts) > 5 {
		return nil, fmt.Errorf("simulator: MAC prefix %q: want 1 to 5 colon-separated octets", s)
	}
	out := make([]byte, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 16, 8)
		if err != nil || len(p) != 2 {
			return nil, fmt.Errorf("simulator: MAC prefix %q: octet %q is not two hex digits", s, p)
		}
		out[i] = byte(v)
	}
	return out, nil
}

// Boards returns the fleet's boards in index order.
func (f *Fleet) Boards() []*Board { return f.boards }

// Stats sums the boards' counters.
func (f *Fleet) Stats() FleetStats {
	fs := FleetStats{Boards: len(f.boards)}
	for _, b := range f.boards {
		// Connected before Stats: a board reads as connected only after
		// its connect was counted, so Connected never exceeds Connects.
		if b.Connected() {
			fs.Connected++
		}
		s := b.Stats()
		fs.Connects += s.Connects
		fs.TextReceived += s.TextReceived
		fs.BinaryReceived += s.BinaryReceived
		fs.MessagesSent += s.MessagesSent
		fs.CallsRun += s.CallsRun
		fs.MCPDropped += s.MCPDropped
		fs.Ignored += s.Ignored
		fs.RepliesLost += s.RepliesLost
		fs.TasksDiscarded += s.TasksDiscarded
		fs.Reboots += s.Reboots
		fs.AudioSent += s.AudioSent
		fs.AudioDropped += s.AudioDropped
		fs.Conversations += s.Conversations
		fs.ConversationErrors += s.ConversationErrors
	}
	return fs
}

// Run connects every board and keeps them connected until ctx ends; then
// it closes all boards, waits for them and returns nil. Without Reconnect
// it also returns once every board has gone offline, with their errors
// joined.
func (f *Fleet) Run(ctx context.Context) error {
	return f.runAll(ctx, f.runBoard)
}

// runAll runs every board with run, each start delayed by its index times
// StartInterval, and waits for all of them.
func (f *Fleet) runAll(ctx context.Context, run func(context.Context, *Board) error) error {
	stop, summarized := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(summarized)
		f.summarize(ctx, stop)
	}()
	defer func() {
		close(stop)
		<-summarized
	}()
	var wg sync.WaitGroup
	errs := make([]error, len(f.boards))
	for i, b := range f.boards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !ctxtime.Sleep(ctx, time.Duration(i)*f.cfg.StartInterval) {
				return
			}
			errs[i] = run(ctx, b)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(errs...)
}

// RunFleet creates a fleet from cfg and runs it until ctx ends.
func RunFleet(ctx context.Context, cfg FleetConfig) error {
	f, err := NewFleet(cfg)
	if err != nil {
		return err
	}
	return f.Run(ctx)
}

// runBoard keeps one board connected over WebSocket. It returns nil when
// ctx ends, or the board's last error when reconnecting is off.
func (f *Fleet) runBoard(ctx context.Context, b *Board) error {
	defer b.Close()
	return f.keepConnected(ctx, b, func(ctx context.Context) error {
		if err := b.ConnectWebSocket(ctx, f.cfg.URL); err != nil {
			return err
		}
		return f.serveConversing(ctx, b, b.Serve)
	})
}

// serveConversing runs serve and, when the fleet converses, the board's
// conversations beside it until serve returns.
func (f *Fleet) serveConversing(ctx context.Context, b *Board, serve func(context.Context) error) error {
	if f.cfg.Converse == nil {
		return serve(ctx)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.converse(cctx, b)
	}()
	err := serve(ctx)
	cancel()
	<-done
	return err
}

// converse holds the board's conversations until ctx ends: one at once,
// then one every ConverseEvery.
func (f *Fleet) converse(ctx context.Context, b *Board) {
	for {
		c, err := b.Converse(ctx, *f.cfg.Converse)
		if ctx.Err() != nil {
			return
		}
		f.logConversation(b, c, err)
		if f.cfg.ConverseEvery <= 0 || !ctxtime.Sleep(ctx, f.cfg.ConverseEvery) {
			return
		}
	}
}

// logConversation sums up one conversation in one line: at info when the
// server answered, else a warning throttled across the fleet.
func (f *Fleet) logConversation(b *Board, c *Conversation, err error) {
	if err != nil {
		f.convFailures.Warn(b.log, "conversation failed", zap.Error(err))
		return
	}
	fields := []zap.Field{
		clip.Field("stt", strings.Join(c.STT, " ")),
		clip.Field("tts", strings.Join(c.Sentences, " ")),
		zap.Int("uplink_frames", c.UplinkSent),
		zap.Int("downlink_frames", len(c.Audio)),
	}
	if n := c.Dropped + c.QueueDropped + c.Rejected; n > 0 {
		fields = append(fields, zap.Int("downlink_dropped", n))
	}
	if len(c.Audio) > 0 {
		fields = append(fields, zap.Duration("first_audio_after", c.Audio[0].At.Sub(c.UplinkDone)))
	}
	b.log.Info("conversation", fields...)
}

// keepConnected runs one connection at a time (connect and serve until it
// ends) and starts another after a backoff, while ctx lasts and the fleet
// reconnects. A connection that lasted longer than ReconnectMax resets the
// backoff; one that drops at once does not, so a flapping server is not
// hammered.
func (f *Fleet) keepConnected(ctx context.Context, b *Board, connection func(context.Context) error) error {
	attempt := 0
	for {
		start := time.Now()
		err := connection(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if !f.cfg.Reconnect {
			return fmt.Errorf("board %s: %w", b.MAC(), err)
		}
		if time.Since(start) > f.cfg.ReconnectMax {
			attempt = 0
		}
		delay := f.backoff(attempt)
		attempt++
		f.noteReconnect(b, err, delay)
		if !ctxtime.Sleep(ctx, delay) {
			return nil
		}
	}
}

// backoff doubles from ReconnectMin up to ReconnectMax, with jitter so a
// fleet dropped at once does not come back at once.
func (f *Fleet) backoff(attempt int) time.Duration {
	d := f.cfg.ReconnectMin
	for i := 0; i < attempt && d < f.cfg.ReconnectMax; i++ {
		d *= 2
	}
	d = min(d, f.cfg.ReconnectMax)
	jitter := 1 + reconnectJitterRatio*(2*rand.Float64()-1)
	return time.Duration(float64(d) * jitter)
}

// Reasons a board reconnects that the server's state explains; they are
// counted into the fleet's periodic summary, not warned about per board.
const (
	reasonServerBusy     = "server_busy"     // 429, 502, 503, 504 (e.g. too many boards waiting for their hello)
	reasonUnreachable    = "unreachable"     // nothing answered: the server is down or restarting
	reasonConnectionLost = "connection_lost" // the server closed or dropped the link (a shutdown, a restart)
)

// noteReconnect logs that b's connection ended with err and that it
// reconnects after delay. A board's own doing (a reboot, an injected
// fault) and what a busy or vanished server explains are logged per board
// at info, the latter also counted for the fleet's summary warning; any
// other failure is a warning, throttled across the fleet so that 2,000
// boards refused for one reason write one line per interval.
func (f *Fleet) noteReconnect(b *Board, err error, delay time.Duration) {
	fields := []zap.Field{zap.Error(err), zap.Duration("after", delay)}
	switch reason, expected := reconnectReason(err); {
	case reason != "":
		f.retriesMu.Lock()
		f.retries[reason]++
		f.retriesMu.Unlock()
		b.log.Info("connection ended; reconnecting", append(fields, zap.String("reason", reason))...)
	case expected:
		b.log.Info("connection ended; reconnecting", fields...)
	default:
		if n, ok := f.failures.Allow(); ok {
			if n > 0 {
				fields = append(fields, zap.Int64("suppressed", n))
			}
			b.log.Warn("connection failed; reconnecting", fields...)
			return
		}
		b.log.Info("connection failed; reconnecting", fields...)
	}
}

// reconnectReason sorts why a connection ended: a reason for the summary
// when a busy or vanished server explains it, expected when the board did
// it itself, neither for a failure worth a warning.
func reconnectReason(err error) (reason string, expected bool) {
	var hs *HandshakeError
	var ota *otaStatusError
	var netErr *net.OpError
	switch {
	case errors.Is(err, ErrRebooted), errors.Is(err, ErrFirmwareUpgrade), errors.Is(err, ErrInjectedDisconnect):
		return "", true
	case errors.As(err, &hs):
		return busyStatus(hs.StatusCode), false
	case errors.As(err, &ota):
		return busyStatus(ota.status), false
	case errors.Is(err, ErrServerClosed), errors.Is(err, ErrConnectionLost):
		return reasonConnectionLost, false
	case errors.Is(err, errMQTTUnreachable), errors.As(err, &netErr):
		return reasonUnreachable, false
	}
	return "", false
}

func busyStatus(code int) string {
	switch code {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return reasonServerBusy
	}
	return ""
}

// summarize writes, every SummaryInterval until ctx ends or stop closes,
// one warning counting the reconnects of the interval by reason, when
// there were any.
func (f *Fleet) summarize(ctx context.Context, stop <-chan struct{}) {
	t := time.NewTicker(f.cfg.SummaryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-t.C:
		}
		f.retriesMu.Lock()
		counts := f.retries
		f.retries = map[string]int{}
		f.retriesMu.Unlock()
		if len(counts) == 0 {
			continue
		}
		total := 0
		reasons := make([]string, 0, len(counts))
		for r, n := range counts {
			total += n
			reasons = append(reasons, r)
		}
		slices.Sort(reasons)
		fields := []zap.Field{zap.Int("reconnects", total), zap.Duration("interval", f.cfg.SummaryInterval)}
		for _, r := range reasons {
			fields = append(fields, zap.Int(r, counts[r]))
		}
		f.log.Warn("boards reconnecting (the server is busy or gone; each board's line is at info)", fields...)
	}
}
