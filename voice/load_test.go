package voice

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"
)

// echoUpstream answers the hello and sends every binary frame back: the
// audio path of a voice server with no work in it.
func echoUpstream(t testing.TB) *httptest.Server {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			kind, data, err := c.ReadMessage()
			if err != nil {
				return
			}
			if kind == websocket.TextMessage {
				_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello","transport":"websocket","session_id":"s1","audio_params":{"sample_rate":24000,"frame_duration":60}}`))
				continue
			}
			if c.WriteMessage(websocket.BinaryMessage, data) != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// timedSide records when each echoed frame comes back.
type timedSide struct {
	mu   sync.Mutex
	lat  []time.Duration
	got  atomic.Int64
	done chan struct{}
	want int64
}

func (s *timedSide) SendText(context.Context, []byte) error { return nil }
func (s *timedSide) SendAudio(f []byte) bool {
	sent := time.Unix(0, int64(binary.BigEndian.Uint64(f)))
	d := time.Since(sent)
	s.mu.Lock()
	s.lat = append(s.lat, d)
	s.mu.Unlock()
	if s.got.Add(1) == s.want {
		close(s.done)
	}
	return true
}
func (s *timedSide) ServeMCP(context.Context, json.RawMessage) json.RawMessage { return nil }

// TestRelayLoad measures the relay's audio path: VOICE_LOAD conversations
// (default off) each send VOICE_FRAMES 60 ms frames of 120 bytes, paced in
// real time; the upstream echoes them; every frame's round trip (board →
// relay → upstream → relay → board) is timed. Run it with
// scripts/voice-load.sh; it prints one JSON line.
func TestRelayLoad(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("VOICE_LOAD"))
	if n <= 0 {
		t.Skip("set VOICE_LOAD=<conversations> (scripts/voice-load.sh)")
	}
	frames, _ := strconv.Atoi(os.Getenv("VOICE_FRAMES"))
	if frames <= 0 {
		frames = 100
	}
	srv := echoUpstream(t)
	r, err := NewRelay(Config{Upstream: "ws" + srv.URL[len("http"):], HelloTimeout: 8 * time.Second}, nil, nil)
	require.NoError(t, err)
	defer r.Close()
	sides := make([]*timedSide, n)
	convs := make([]*Conversation, n)
	var wg sync.WaitGroup
	for i := range n {
		sides[i] = &timedSide{done: make(chan struct{}), want: int64(frames)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mac := fmt.Sprintf("02:00:00:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff)
			c, _, err := r.Open(context.Background(), Board{DeviceID: mac, ProtocolVersion: 1}, []byte(`{"type":"hello","version":1}`), sides[i])
			if err == nil {
				convs[i] = c
			}
		}()
	}
	wg.Wait()
	for i, c := range convs {
		require.NotNil(t, c, "conversation %d", i)
	}
	start := time.Now()
	for i, c := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the conversations over one frame period.
			tick := time.NewTicker(60 * time.Millisecond)
			defer tick.Stop()
			time.Sleep(time.Duration(i) * 60 * time.Millisecond / time.Duration(n))
			for range frames {
				f := make([]byte, 120)
				binary.BigEndian.PutUint64(f, uint64(time.Now().UnixNano()))
				c.Audio(f)
				<-tick.C
			}
		}()
	}
	wg.Wait()
	deadline := time.After(30 * time.Second)
	lost := int64(0)
	for _, s := range sides {
		select {
		case <-s.done:
		case <-deadline:
		}
		lost += int64(frames) - s.got.Load()
	}
	var all []time.Duration
	for _, s := range sides {
		s.mu.Lock()
		all = append(all, s.lat...)
		s.mu.Unlock()
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(float64(len(all)-1)*p)].Microseconds()) / 1000
	}
	st := r.Stats()
	fmt.Printf(`{"conversations":%d,"frames_each":%d,"sent":%d,"echoed":%d,"lost":%d,"dropped_up":%d,"dropped_down":%d,"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,"seconds":%.1f}`+"\n",
		n, frames, n*frames, len(all), lost, st.DroppedUp, st.DroppedDown, pct(0.5), pct(0.9), pct(0.99), pct(1), time.Since(start).Seconds())
}
