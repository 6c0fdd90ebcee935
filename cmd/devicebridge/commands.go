package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

func (c *cli) devices(ctx context.Context) error {
	var raw json.RawMessage
	if err := c.do(ctx, "GET", "/api/devices", nil, &raw); err != nil {
		return err
	}
	if c.json {
		return c.printJSON(raw)
	}
	var list struct {
		Devices []board `json:"devices"`
		Node    string  `json:"node"` // set when the bridge is in a fleet
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return err
	}
	if len(list.Devices) == 0 {
		c.stdout.println("no boards connected")
		return nil
	}
	// In a fleet (docs/scaling.md) boards held by other nodes name their
	// node, and the bridge names its own; only then is there a NODE column.
	fleet := list.Node != ""
	for _, b := range list.Devices {
		fleet = fleet || b.Node != ""
	}
	tw := c.stdout.table()
	header := []any{"DEVICE", "ALIAS", "TRANSPORT", "STATE", "BOARD", "FIRMWARE", "TOOLS", "CONNECTED"}
	if fleet {
		header = append(header, "NODE")
	}
	tw.row(header...)
	for _, b := range list.Devices {
		cells := []any{b.DeviceID, dash(b.Alias), b.Transport, b.State,
			dash(b.Board), dash(b.FirmwareVersion), b.ToolCount, ago(b.ConnectedAt)}
		if fleet {
			cells = append(cells, holder(b.Node))
		}
		tw.row(cells...)
	}
	return tw.flush()
}

// holder names the node that holds a board: the bridge asked is "here".
func holder(node string) string {
	if node == "" {
		return "here"
	}
	return node
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ago is a short age: "12s ago", "5m ago", "3h ago".
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

func (c *cli) show(ctx context.Context, name string) error {
	b, err := c.findBoard(ctx, name)
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.do(ctx, "GET", "/api/devices/"+url.PathEscape(b.DeviceID), nil, &raw); err != nil {
		return err
	}
	if c.json {
		return c.printJSON(raw)
	}
	var d board
	if err := json.Unmarshal(raw, &d); err != nil {
		return err
	}
	tw := c.stdout.table()
	row := func(k, v string) {
		if v != "" {
			tw.row(k, v)
		}
	}
	row("device", d.DeviceID)
	row("alias", d.Alias)
	row("client id", d.ClientID)
	row("transport", d.Transport)
	row("node", d.Node)
	row("remote", d.RemoteAddr)
	row("state", d.State)
	row("board", d.Board)
	row("firmware", d.FirmwareVersion)
	if !d.ConnectedAt.IsZero() {
		row("connected", d.ConnectedAt.Local().Format(time.DateTime)+" ("+ago(d.ConnectedAt)+")")
	}
	row("tools", fmt.Sprint(len(d.Tools)))
	if err := tw.flush(); err != nil {
		return err
	}
	c.stdout.println()
	return c.printTools(d)
}

func (c *cli) tools(ctx context.Context, name string) error {
	d, err := c.boardDetail(ctx, name)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(d.Tools)
	}
	return c.printTools(d)
}

// printTools lists tools in device order: name, arguments, user-only mark
// and the first sentence of the description.
func (c *cli) printTools(d board) error {
	tw := c.stdout.table()
	tw.row("TOOL", "ARGUMENTS", "", "DESCRIPTION")
	for _, t := range d.Tools {
		var sig []string
		for _, p := range props(t.InputSchema) {
			sig = append(sig, p.signature())
		}
		mark := ""
		if t.UserOnly {
			mark = "user-only"
		}
		tw.row(t.Name, dash(strings.Join(sig, " ")), mark, firstSentence(t.Description, 60))
	}
	return tw.flush()
}

func firstSentence(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	if r := []rune(s); len(r) > max {
		s = string(r[:max-1]) + "…"
	}
	return s
}

// callResult is a tool's answer as POST .../call returns it.
type callResult struct {
	Content []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		Data     string `json:"data"`
		MimeType string `json:"mimeType"`
		Image    string `json:"image"`
	} `json:"content"`
	IsError bool `json:"isError"`
}

func (c *cli) call(ctx context.Context, boardName, toolName string, pairs []string) error {
	d, t, args, err := c.resolveCall(ctx, boardName, toolName, pairs)
	if err != nil {
		return err
	}
	var raw json.RawMessage
	stop := c.progress(fmt.Sprintf("%s on %s", t.Name, d.DeviceID))
	err = c.do(ctx, "POST", "/api/devices/"+url.PathEscape(d.DeviceID)+"/call", map[string]any{"name": t.Name, "arguments": args}, &raw)
	stop()
	if err != nil {
		return err
	}
	var res callResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return err
	}
	if c.json {
		if err := c.printJSON(raw); err != nil {
			return err
		}
	} else {
		c.printResult(res)
	}
	if res.IsError {
		return &exitError{code: exitFailed, msg: show(t.Name) + " reported an error", silent: !c.json}
	}
	return nil
}

func (c *cli) printResult(res callResult) {
	w := c.stdout
	if res.IsError {
		w = c.stderr
	}
	for _, item := range res.Content {
		switch {
		case item.Type == "text":
			w.println(item.Text)
		case item.Data != "":
			w.printf("[%s %s, %d bytes base64; --json prints it]\n", item.Type, item.MimeType, len(item.Data))
		case item.Image != "":
			w.printf("[image, %d bytes; --json prints it]\n", len(item.Image))
		}
	}
}

// progress shows a spinner on stderr, when it is a terminal, once a call
// has taken a second; the returned function stops and erases it.
func (c *cli) progress(what string) func() {
	if !c.stderrTTY {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		frames := `|/-\`
		select {
		case <-done:
			return
		case <-time.After(time.Second):
		}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			c.stderr.printf("\r%c calling %s… %.1fs ", frames[i%4], what, time.Since(start).Seconds())
			select {
			case <-done:
				c.stderr.printf("\r\033[K") // the CLI's own: erase the line
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// watch prints the event stream until interrupted.
func (c *cli) watch(ctx context.Context) error {
	req, err := c.request(ctx, "GET", "/api/events", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return c.apiErr(resp.StatusCode, "/api/events", data)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return c.notControlAPI(fmt.Sprintf("200 but %s, not an event stream", dash(ct)), "/api/events")
	}
	if !c.json {
		c.stderr.printf("watching %s (Ctrl-C to stop)\n", c.bridge)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var event, data, id string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = line[7:]
		case strings.HasPrefix(line, "data: "):
			data += line[6:]
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		case line == "" && data != "":
			c.printEvent(id, event, data)
			event, data, id = "", "", ""
		}
	}
	if ctx.Err() != nil {
		return nil // Ctrl-C: the normal way to stop watching
	}
	return errf(exitUnreachable, "the event stream ended (the bridge stopped?)")
}

func (c *cli) printEvent(id, event, data string) {
	if c.json {
		fmt.Fprintf(c.stdout.raw(), `{"id":%q,"event":%q,"data":%s}`+"\n", id, event, data)
		return
	}
	now := time.Now().Format("15:04:05")
	var e struct {
		board
		CloseCause string  `json:"close_cause"`
		Tool       string  `json:"tool"`
		Code       string  `json:"code"`
		DurationMS float64 `json:"duration_ms"`
	}
	_ = json.Unmarshal([]byte(data), &e)
	switch event {
	case "online", "tools_changed":
		c.stdout.printf("%s %-13s %s %s %s %s, %s\n", now, event, e.DeviceID, e.Transport, e.State, dash(e.Board), plural(e.ToolCount, "tool", "tools"))
	case "offline":
		c.stdout.printf("%s %-13s %s %s (%s)\n", now, event, e.DeviceID, dash(e.CloseCause), e.CloseReason)
	case "call":
		c.stdout.printf("%s %-13s %s %s → %s in %.1f ms\n", now, event, e.DeviceID, e.Tool, e.Code, e.DurationMS)
	default:
		c.stdout.printf("%s %-13s %s\n", now, event, data)
	}
}
