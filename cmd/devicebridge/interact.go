package main

// interact: a guided call at the terminal, over the control API's
// interactions (POST /api/devices/{id}/interactions, then one POST
// /api/interactions/{sid} per answer). Questions go to stderr, so that
// stdout carries only the result (--json: the final step).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"
)

type promptRules struct {
	Required bool     `json:"required"`
	Min      *float64 `json:"min"`
	Max      *float64 `json:"max"`
	Integer  bool     `json:"integer"`
	Pattern  string   `json:"pattern"`
}

type flowPrompt struct {
	Type         string          `json:"type"`
	Message      string          `json:"message"`
	Property     string          `json:"property"`
	DefaultValue json.RawMessage `json:"defaultValue"`
	Placeholder  string          `json:"placeholder"`
	Choices      []struct {
		Value json.RawMessage `json:"value"`
		Label string          `json:"label"`
	} `json:"choices"`
	// Multiple: the answer is a list of any of the choices.
	Multiple   bool         `json:"multiple"`
	Validation *promptRules `json:"validation"`
}

type flowStep struct {
	SessionID  string `json:"sessionId"`
	State      string `json:"state"`
	Accepted   *bool  `json:"accepted"`
	Validation *struct {
		Valid      bool   `json:"valid"`
		Error      string `json:"error"`
		Suggestion string `json:"suggestion"`
	} `json:"validation"`
	InitialPrompt *flowPrompt `json:"initialPrompt"`
	NextPrompt    *flowPrompt `json:"nextPrompt"`
	Progress      *struct {
		Current int    `json:"current"`
		Total   int    `json:"total"`
		Message string `json:"message"`
	} `json:"progress"`
	Result *struct {
		Success bool            `json:"success"`
		Text    string          `json:"text"`
		Data    json.RawMessage `json:"data"`
		IsError bool            `json:"isError"`
	} `json:"result"`
	Summary string `json:"summary"`
}

func (s *flowStep) prompt() *flowPrompt {
	if s.InitialPrompt != nil {
		return s.InitialPrompt
	}
	return s.NextPrompt
}

// lines reads stdin a line at a time without blocking cancellation.
type lines struct {
	ch  chan string
	err error
}

func readLines(r io.Reader) *lines {
	l := &lines{ch: make(chan string)}
	go func() {
		br := bufio.NewReader(r)
		for {
			s, err := br.ReadString('\n')
			if s != "" || err == nil {
				l.ch <- strings.TrimRight(s, "\r\n")
			}
			if err != nil {
				l.err = err
				close(l.ch)
				return
			}
		}
	}()
	return l
}

var errNoInput = errors.New("no more input")

func (l *lines) next(ctx context.Context) (string, error) {
	select {
	case s, ok := <-l.ch:
		if !ok {
			return "", errNoInput
		}
		return s, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (c *cli) interact(ctx context.Context, boardName, toolName string, pairs []string) error {
	d, t, args, err := c.resolveCall(ctx, boardName, toolName, pairs)
	if err != nil {
		return err
	}
	var step flowStep
	var raw json.RawMessage
	if err := c.do(ctx, "POST", "/api/devices/"+url.PathEscape(d.DeviceID)+"/interactions",
		map[string]any{"name": t.Name, "arguments": args}, &raw); err != nil {
		return err
	}
	in := readLines(c.stdin)
	c.stderr.printf("%s on %s\n", t.Name, d.DeviceID)
	for {
		if err := json.Unmarshal(raw, &step); err != nil {
			return err
		}
		if step.Validation != nil && !step.Validation.Valid {
			c.stderr.printf("  ✗ %s\n", step.Validation.Error)
			if step.Validation.Suggestion != "" {
				c.stderr.printf("    %s\n", step.Validation.Suggestion)
			}
		}
		pr := step.prompt()
		if pr == nil {
			break
		}
		value, err := c.ask(ctx, in, &step, pr)
		if err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = c.do(cctx, "DELETE", "/api/interactions/"+url.PathEscape(step.SessionID)+"?reason=user", nil, nil)
			cancel()
			if errors.Is(err, context.Canceled) {
				return &exitError{code: exitInterrupted, msg: "interrupted: nothing was sent to the board"}
			}
			return errf(exitNotRun, "not run: %v before every question was answered; nothing was sent to the board", err)
		}
		raw = raw[:0]
		stop := func() {}
		if pr.Type == "confirm" || step.Progress == nil || step.Progress.Current == step.Progress.Total {
			stop = c.progress(fmt.Sprintf("%s on %s", t.Name, d.DeviceID))
		}
		step = flowStep{SessionID: step.SessionID}
		err = c.do(ctx, "POST", "/api/interactions/"+url.PathEscape(step.SessionID), map[string]any{"value": value}, &raw)
		stop()
		if err != nil {
			return err
		}
	}
	if c.json {
		if err := c.printJSON(raw); err != nil {
			return err
		}
	}
	switch step.State {
	case "cancelled":
		if !c.json {
			c.stderr.println(step.Summary)
		}
		return &exitError{code: exitNotRun, msg: "not run", silent: true}
	case "completed":
		r := step.Result
		if !c.json && r != nil {
			var res callResult
			if json.Unmarshal(r.Data, &res) == nil && len(res.Content) > 0 {
				c.printResult(res)
			} else if r.Text != "" {
				c.stdout.println(r.Text)
			}
		}
		if r != nil && !r.Success {
			return &exitError{code: exitFailed, msg: "the call failed", silent: !c.json}
		}
		return nil
	}
	msg := step.Summary
	if step.Result != nil && step.Result.Text != "" {
		msg = step.Result.Text
	}
	return errf(exitFailed, "the interaction ended in state %s: %s", step.State, msg)
}

// choose reads one choice: its number in the list, its label or its
// value; anything else is sent as typed, for the bridge to refuse.
func (pr *flowPrompt) choose(s string) any {
	if i, err := strconv.Atoi(s); err == nil && i >= 1 && i <= len(pr.Choices) {
		return json.RawMessage(pr.Choices[i-1].Value)
	}
	for _, ch := range pr.Choices {
		var v any
		_ = json.Unmarshal(ch.Value, &v)
		if strings.EqualFold(ch.Label, s) || fmt.Sprint(v) == s {
			return json.RawMessage(ch.Value)
		}
	}
	return s
}

// ask shows one prompt on stderr and reads the answer, as the JSON value
// to send. Only what cannot be sent at all (a confirm that is neither yes
// nor no) is asked again here; the bridge validates everything else and
// says what to change.
func (c *cli) ask(ctx context.Context, in *lines, step *flowStep, pr *flowPrompt) (any, error) {
	w := c.stderr
	if p := step.Progress; p != nil && p.Total > 1 {
		w.printf("[%d/%d] ", p.Current, p.Total)
	}
	w.println(pr.Message)
	for i, ch := range pr.Choices {
		label := ch.Label
		if label == "" {
			label = string(ch.Value)
		}
		w.printf("  %d) %s\n", i+1, label)
	}
	label := pr.Property
	if r := pr.Validation; r != nil && (r.Min != nil || r.Max != nil) && pr.Type == "number" {
		label += " (" + num(r.Min) + ".." + num(r.Max) + ")"
	}
	if len(pr.DefaultValue) > 0 {
		label += " [" + string(pr.DefaultValue) + "]"
	} else if pr.Placeholder != "" {
		label += " (e.g. " + pr.Placeholder + ")"
	}
	if pr.Multiple {
		label += " (numbers or values, comma-separated)"
	}
	if pr.Type == "confirm" {
		label = "yes/no"
		if pr.Property != "" {
			label = pr.Property + " (yes/no)"
		}
	}
	for {
		w.printf("%s> ", label)
		line, err := in.next(ctx)
		if err != nil {
			w.println()
			return nil, err
		}
		line = strings.TrimSpace(line)
		if line == "" {
			return nil, nil // the default, or the bridge says it is required
		}
		switch pr.Type {
		case "confirm":
			if b, ok := yesNo(line); ok {
				return b, nil
			}
			w.println("  answer yes or no")
			continue
		case "number":
			if f, err := strconv.ParseFloat(line, 64); err == nil {
				return f, nil
			}
			return line, nil
		case "choice":
			if !pr.Multiple {
				return pr.choose(line), nil
			}
			list := []any{}
			for _, part := range strings.Split(line, ",") {
				if part = strings.TrimSpace(part); part != "" {
					list = append(list, pr.choose(part))
				}
			}
			return list, nil
		case "custom":
			var v any
			if json.Unmarshal([]byte(line), &v) == nil {
				return v, nil
			}
			return line, nil
		}
		return line, nil
	}
}
