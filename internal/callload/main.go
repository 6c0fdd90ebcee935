// Command callload measures tool-call latency through one bridge's control
// API, for boards it holds itself and for boards other fleet nodes hold
// (docs/scaling.md). Local and routed calls are interleaved by the same
// workers, so both see the same machine load and their ratio is fair even
// on a busy machine.
//
//	go run ./internal/callload -api http://127.0.0.1:8081 -calls 2000 -workers 8
//
// It lists the node's boards (GET /api/devices), takes up to -boards ready
// ones held locally (no "node" field) and as many held elsewhere, then
// sends -calls calls of -tool to each group and prints one CSV line per
// group: group,calls,errors,p50_us,p90_us,p99_us,mean_us, then the ratio
// of the routed p50 and mean to the local ones. With -local-only (one
// bridge, no fleet) only the local group is called and printed.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"
)

type board struct {
	DeviceID string `json:"device_id"`
	State    string `json:"state"`
	Node     string `json:"node"`
}

func main() {
	api := flag.String("api", "http://127.0.0.1:8080", "the calling node's control listener")
	calls := flag.Int("calls", 1000, "calls per group (local, routed)")
	workers := flag.Int("workers", 4, "concurrent callers")
	boards := flag.Int("boards", 50, "boards per group to spread the calls over")
	tool := flag.String("tool", "self.get_device_status", "tool to call (no arguments)")
	timeout := flag.Duration("timeout", 30*time.Second, "per-call HTTP timeout")
	localOnly := flag.Bool("local-only", false, "call only boards held by this node (a bridge without a fleet)")
	flag.Parse()
	if err := run(*api, *tool, *calls, *workers, *boards, *timeout, *localOnly); err != nil {
		fmt.Fprintln(os.Stderr, "callload:", err)
		os.Exit(1)
	}
}

func run(api, tool string, calls, workers, perGroup int, timeout time.Duration, localOnly bool) error {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: workers * 2}}
	local, remote, err := pick(client, api, perGroup)
	if err != nil {
		return err
	}
	groups := []bool{false, true}
	if localOnly {
		groups, remote = groups[:1], nil
		if len(local) == 0 {
			return fmt.Errorf("no ready boards held here")
		}
	} else if len(local) == 0 || len(remote) == 0 {
		return fmt.Errorf("need ready boards held here and elsewhere; found %d local and %d remote", len(local), len(remote))
	}
	body, _ := json.Marshal(map[string]any{"name": tool, "arguments": map[string]any{}})
	type job struct {
		id     string
		routed bool
	}
	jobs := make(chan job)
	var mu sync.Mutex
	lat := map[bool][]time.Duration{}
	errs := map[bool]int{}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				start := time.Now()
				err := call(client, api, j.id, body)
				d := time.Since(start)
				mu.Lock()
				if err != nil {
					errs[j.routed]++
					if errs[j.routed] <= 3 {
						fmt.Fprintf(os.Stderr, "callload: %s: %v\n", j.id, err)
					}
				} else {
					lat[j.routed] = append(lat[j.routed], d)
				}
				mu.Unlock()
			}
		}()
	}
	// Alternate local and routed calls so both see the same conditions.
	for i := range calls {
		jobs <- job{id: local[i%len(local)], routed: false}
		if !localOnly {
			jobs <- job{id: remote[i%len(remote)], routed: true}
		}
	}
	close(jobs)
	wg.Wait()
	fmt.Println("group,calls,errors,p50_us,p90_us,p99_us,mean_us")
	stats := map[bool][2]float64{}
	for _, routed := range groups {
		name := "local"
		if routed {
			name = "routed"
		}
		d := lat[routed]
		slices.Sort(d)
		p50, mean := us(pct(d, 50)), us(avg(d))
		stats[routed] = [2]float64{p50, mean}
		fmt.Printf("%s,%d,%d,%.0f,%.0f,%.0f,%.0f\n", name, len(d), errs[routed], p50, us(pct(d, 90)), us(pct(d, 99)), mean)
	}
	if !localOnly && stats[false][0] > 0 && stats[false][1] > 0 {
		fmt.Printf("ratio routed/local: p50 %.2f, mean %.2f\n", stats[true][0]/stats[false][0], stats[true][1]/stats[false][1])
	}
	return nil
}

// pick returns up to n ready boards held by this node and n held by others.
func pick(client *http.Client, api string, n int) (local, remote []string, err error) {
	resp, err := client.Get(api + "/api/devices")
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET /api/devices: %s", resp.Status)
	}
	var list struct {
		Devices []board `json:"devices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, nil, fmt.Errorf("GET /api/devices: %w", err)
	}
	for _, b := range list.Devices {
		if b.State != "ready" {
			continue
		}
		if b.Node == "" && len(local) < n {
			local = append(local, b.DeviceID)
		} else if b.Node != "" && len(remote) < n {
			remote = append(remote, b.DeviceID)
		}
	}
	return local, remote, nil
}

func call(client *http.Client, api, id string, body []byte) error {
	resp, err := client.Post(api+"/api/devices/"+id+"/call", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(data))
	}
	return nil
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[(len(d)-1)*p/100]
}

func avg(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
